"""What the Kubernetes tests (kustomize and Helm) check of rendered manifests: the schemas,
the ServiceMonitor against the Service and Secret, the pod against the image and its config,
the NetworkPolicy against the pods, and the pod's probes run as the kubelet runs them against
a router serving the mock backend."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from mock import free_port
from test.deploy_files import CONTAINER_CONFIG, check_config, container_command, mock_backend, serve, stop, tool

K8S_VERSION = "1.30.0"  # a version every supported cluster serves these APIs in
# What the operator puts in the Secret the pods read their keys from, when none is rendered.
OPERATOR_SECRET = {"NOMYO_ADMIN_KEY": "admin-key-0123456789", "NOMYO_METRICS_KEY": "metrics-key-0123456789"}
Docs = list[dict[str, Any]]


def validate_manifests(docs: Docs) -> list[str]:
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


def router_pod(docs: Docs) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and "redis" not in d["metadata"]["name"])


def check_service_monitor(doc: dict[str, Any], docs: Docs) -> None:
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
        env_from = router_pod(docs)["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        assert auth["credentials"]["name"] in [e["secretRef"]["name"] for e in env_from]
        assert auth["credentials"]["key"] == "NOMYO_METRICS_KEY"


def pod_env(docs: Docs) -> dict[str, str]:
    """The router container's environment: the Secret's values (rendered, or what an operator
    puts in the one it names) and the container's own variables."""
    container = router_pod(docs)["spec"]["template"]["spec"]["containers"][0]
    secret = next((d for d in docs if d["kind"] == "Secret"), None)
    env = dict(secret["stringData"]) if secret is not None else dict(OPERATOR_SECRET)
    return {**env, **{e["name"]: e["value"] for e in container.get("env", []) if "value" in e}}


def config_text(docs: Docs) -> str:
    """The config file the router's pods mount."""
    pod = router_pod(docs)["spec"]["template"]["spec"]
    name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    return configmap["data"][os.path.basename(CONTAINER_CONFIG)]


def router_config(docs: Docs) -> Any:
    """The config the pods run with, parsed by the router in the pod's environment."""
    from nomyo_router.config import parse_config

    with mock.patch.dict(os.environ, pod_env(docs)):
        return parse_config(yaml.safe_load(config_text(docs)))


def check_pod(docs: Docs, tmp_path: Path) -> dict[str, Any]:
    """The Deployment runs the image's command on the ConfigMap's config, as a non-root user,
    with its keys from a Secret it requires, probes on /readyz and /livez and a preStop pause
    within the grace period; that config passes --check in the pod's environment and sets an
    admin key. Returns the router container."""
    pod = router_pod(docs)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][:4] == container_command()[1:]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert "exec" not in container["readinessProbe"] and "exec" not in container["livenessProbe"]
    env_from = container["envFrom"][0]["secretRef"]
    assert not env_from.get("optional"), "the keys' Secret must exist: the config reads the admin key from it"
    config = tmp_path / "config.yaml"
    config.write_text(config_text(docs))
    check_config(config, env=pod_env(docs))
    parsed = router_config(docs)
    assert parsed.admin_key is not None  # model management and everyone's usage need a key
    # SIGTERM comes after the preStop pause, both within the grace period: the pause plus
    # shutdown_grace must fit in it, or Kubernetes kills streams the router would finish
    pause = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and 0 < int(pause[1]) <= 15, pause
    assert pod["terminationGracePeriodSeconds"] >= parsed.shutdown_grace + int(pause[1]) + 5
    return container


def check_network_policy(docs: Docs, client_labels: dict[str, str]) -> None:
    """The router's pods admit, on the router's port only, pods with the clients' label (and
    no other pod: the router's own labels are not among the client selector's) and the
    monitoring namespace."""
    labels = router_pod(docs)["spec"]["template"]["metadata"]["labels"]
    policy = next(
        d
        for d in docs
        if d["kind"] == "NetworkPolicy" and d["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    pods = [p["podSelector"]["matchLabels"] for p in rule["from"] if "podSelector" in p]
    namespaces = [p["namespaceSelector"]["matchLabels"] for p in rule["from"] if "namespaceSelector" in p]
    assert pods == [client_labels], pods
    assert namespaces == [{"kubernetes.io/metadata.name": "monitoring"}]


def _kubelet_get(port: int, path: str) -> int:
    """An httpGet probe as the kubelet sends it (Host: the pod's IP and port); 0: no answer."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Host": "10.244.0.7:12434", "User-Agent": "kube-probe/1.30"}
    )
    try:
        with urllib.request.urlopen(request, timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def run_probes(container: dict[str, Any], tmp_path: Path) -> None:
    """The container's readiness and liveness probes against a router serving the mock: both
    pass; with the backend gone the pod is not ready but alive (an outage never restarts the
    router); once the router stops, the liveness probe fails."""
    ready, alive = container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]
    passes = range(200, 400)  # what the kubelet counts as success
    port = free_port()
    with mock_backend() as backend:
        config = tmp_path / "probe-config.yaml"
        fast = {"health_interval": 0.2, "probe_interval_down": 0.2, "eject_after": 1}
        config.write_text(
            yaml.safe_dump({"endpoints": [{"url": backend.url, "name": "mock", "max_concurrent": 2}], **fast})
        )
        proc = serve([tool("nomyo-router") or "", "--config", str(config), "--port", str(port)], tmp_path, {}, port)
        try:
            assert _kubelet_get(port, ready) in passes and _kubelet_get(port, alive) in passes
            backend.stop()
            deadline = time.monotonic() + 20
            while _kubelet_get(port, ready) in passes:
                assert time.monotonic() < deadline, f"{ready} still passes with the backend gone"
                time.sleep(0.1)
            assert _kubelet_get(port, alive) in passes, "a backend outage would restart the router"
        finally:
            assert stop(proc) == 0
    assert _kubelet_get(port, alive) not in passes
