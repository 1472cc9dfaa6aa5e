"""The Kubernetes files, checked without a cluster: the base in deploy/kubernetes, alone and
with its redis and monitoring components, by `kubectl kustomize` and the Kubernetes schemas
(kubernetes-validate); the Helm chart rendered by `helm template` (or Helm's own engine
through helm-python-sdk when there is no helm binary), linted, and its manifests validated
against the same schemas; then the base's liveness probe run as the kubelet runs it, against a
router serving the mock backend. A part whose tool is absent is skipped with the reason."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mock import MockProcess, free_port
from test.deploy_files import (
    CONTAINER_CONFIG,
    ROOT,
    check_config,
    container_command,
    health,
    mock_backend,
    run,
    serve,
    stop,
    tool,
)

K8S_VERSION = "1.30.0"  # a version every supported cluster serves these APIs in


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


# ---------------------------------------------------------------- the liveness probe, run for real


@pytest.fixture
def backend() -> Iterator[MockProcess]:
    with mock_backend() as m:
        yield m


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
