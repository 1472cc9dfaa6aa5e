"""The kustomize files, checked without a cluster: the base in deploy/kubernetes alone, and the
overlay recipe of docs/deployment.md (taken from the page) with every combination of the
redis and monitoring components and a marker in the overlay's own config.yaml, built by
`kubectl kustomize` and validated against the Kubernetes schemas (kubernetes-validate); then
the base's probes run as the kubelet runs them, against a router serving the mock backend.
A part whose tool is absent is skipped with the reason. Helm: test_deploy_helm.py."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from test.deploy_files import ROOT, run
from test.k8s_manifests import (
    Docs,
    check_network_policy,
    check_pod,
    config_text,
    router_config,
    router_pod,
    run_probes,
    validate_manifests,
)

KUBERNETES = ROOT / "deploy/kubernetes"
DOCS = ROOT / "docs/deployment.md"
CLIENT_LABELS = {"nomyo-router/client": "true"}
BASE_KINDS = ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service"]
REDIS_KINDS = ["Deployment", "NetworkPolicy", "Service"]


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is absent: `kubectl kustomize deploy/kubernetes` cannot be built here")
    return found


def build(target: Path) -> Docs:
    out = run([kubectl(), "kustomize", str(target)])
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def documented_overlay() -> dict[str, Any]:
    """The overlay's kustomization.yaml as docs/deployment.md gives it."""
    block = re.search(r"```yaml\n# my-overlay/kustomization\.yaml\n(.*?)```", DOCS.read_text(), re.S)
    assert block, "docs/deployment.md lost its overlay recipe"
    return yaml.safe_load(block.group(1))


def overlay(tmp_path: Path, components: tuple[str, ...], config: str) -> Docs:
    """The documented overlay, in tmp_path, on this repository's base, with `components` and
    `config` as its config.yaml (kustomize wants the paths relative)."""
    recipe = documented_overlay()
    target = tmp_path / "my-overlay"
    target.mkdir()
    base = os.path.relpath(KUBERNETES, target)
    assert recipe["resources"] == ["../deploy/kubernetes"]
    assert recipe["components"] == [f"../deploy/kubernetes/{c}" for c in ("redis", "monitoring")]
    recipe["resources"] = [base]
    recipe["components"] = [f"{base}/{c}" for c in components]
    (target / "kustomization.yaml").write_text(yaml.safe_dump(recipe))
    (target / "config.yaml").write_text(config)
    return build(target)


def users_config(marker: str) -> str:
    """An operator's config.yaml, started from the base's as the page says, with a marker."""
    base = (KUBERNETES / "config.yaml").read_text()
    assert "state: ${NOMYO_ROUTER_STATE:-auto}" in base and "admin_key: ${NOMYO_ADMIN_KEY}" in base
    mine = base.replace("name: ollama-0", f"name: {marker}").replace(
        "# metrics_key: ${NOMYO_METRICS_KEY}", "metrics_key: ${NOMYO_METRICS_KEY}"
    )
    return f"# {marker}\n{mine}"


def test_kubernetes_base_builds_and_validates(tmp_path):
    docs = build(KUBERNETES)
    assert sorted(validate_manifests(docs)) == BASE_KINDS
    check_pod(docs, tmp_path)
    check_network_policy(docs, CLIENT_LABELS)
    deployment = router_pod(docs)
    assert deployment["spec"]["replicas"] == 1 and router_config(docs).state == "auto"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"][0]["secretRef"]["name"] == "nomyo-router-keys"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"].get("maxUnavailable") == 1  # one replica still drains (minAvailable: 1 would block)


@pytest.mark.parametrize(
    "components", [(), ("redis",), ("monitoring",), ("redis", "monitoring"), ("monitoring", "redis")], ids=repr
)
def test_the_documented_overlay_keeps_the_users_config(tmp_path, components):
    """Whatever components the overlay adds, the pods mount the overlay's own config.yaml, as
    written; the redis component's state reaches it through the pod's environment."""
    marker = f"marker-{'-'.join(components) or 'none'}"
    docs = overlay(tmp_path, components, users_config(marker))
    kinds = validate_manifests(docs)  # the ServiceMonitor checked against the Service and Secret
    expected = BASE_KINDS + (REDIS_KINDS if "redis" in components else [])
    expected += ["ServiceMonitor"] if "monitoring" in components else []
    assert sorted(kinds) == sorted(expected)
    assert config_text(docs) == users_config(marker)
    assert [d for d in docs if d["kind"] == "ConfigMap"] == [d for d in docs if marker in str(d)]
    check_pod(docs, tmp_path)
    check_network_policy(docs, CLIENT_LABELS)
    config = router_config(docs)
    assert config.endpoints[0].name == marker and config.metrics_key is not None
    assert all(d["metadata"].get("namespace") == documented_overlay()["namespace"] for d in docs)
    deployment = router_pod(docs)
    if "redis" not in components:
        assert deployment["spec"]["replicas"] == 1 and config.state == "auto"
        return
    assert deployment["spec"]["replicas"] == 2
    redis = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "nomyo-router-redis")
    assert config.state == f"redis://{redis['metadata']['name']}:{redis['spec']['ports'][0]['port']}/0"
    redis_pod = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "nomyo-router-redis")
    labels = redis_pod["spec"]["template"]["metadata"]["labels"]
    router_service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "nomyo-router")
    assert not router_service["spec"]["selector"].items() <= labels.items()  # the router's Service skips Redis
    assert redis["spec"]["selector"].items() <= labels.items()
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "nomyo-router-redis")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()  # only the router pods reach Redis
    assert (
        policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_pages_say_what_the_base_renders():
    """README and docs/deployment.md name what the base renders, and no more."""
    readme = next(line for line in (ROOT / "README.md").read_text().splitlines() if "kubectl apply -k" in line)
    named = {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "ConfigMap"}
    assert all(kind in readme for kind in named), readme
    assert "ServiceMonitor" not in readme.split("components")[0] and "Redis" not in readme.split("components")[0]
    table = re.search(r"\| none \| (.*) \|", DOCS.read_text())
    assert table and all(kind in table.group(1) for kind in named)


def test_the_kubernetes_probes_hold_through_a_backend_outage(tmp_path):
    """The base's probes, run as the kubelet runs them (an HTTP GET with the pod's IP as
    Host): ready and alive; with no backend, not ready and still alive; stopped, not alive."""
    run_probes(check_pod(build(KUBERNETES), tmp_path), tmp_path)
