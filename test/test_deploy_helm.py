"""The Helm chart, checked without a cluster: rendered by `helm template` (or Helm's own engine
through helm-python-sdk when there is no helm binary), linted, its manifests validated against
the Kubernetes schemas; its pod checked as the kustomize base's is (keys from a Secret, probes
on /readyz and /livez, the paths test_deploy_kubernetes.py runs as the kubelet does, a
preStop pause), its NetworkPolicy and generated admin key."""

from __future__ import annotations

import json
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
    router_config,
    router_pod,
    validate_manifests,
)

CHART = ROOT / "deploy/helm/nomyo-router"


def render_chart(values: dict[str, Any], tmp_path: Path) -> Docs:
    helm = shutil.which("helm")
    if helm:
        values_file = tmp_path / "values.json"
        values_file.write_text(json.dumps(values))
        lint = run([helm, "lint", str(CHART), "-f", str(values_file)])
        assert lint.returncode == 0, lint.stdout + lint.stderr
        out = run([helm, "template", "nomyo", str(CHART), "--namespace", "llm", "-f", str(values_file)])
        assert out.returncode == 0, out.stderr
        text = out.stdout
    else:
        helm_python = pytest.importorskip(
            "helm_python", reason="neither a helm binary nor helm-python-sdk (pip install '.[deploy]') is installed"
        )
        assert helm_python.lint(str(CHART), values=values)["errors"] == []
        with helm_python.Chart.load(str(CHART)) as loaded:
            rendered = loaded.render(values, name="nomyo", namespace="llm")
        text = "\n---\n".join(v for k, v in sorted(rendered.items()) if k.endswith(".yaml"))
    return [d for d in yaml.safe_load_all(text) if d]


def test_helm_chart_renders_and_validates_with_defaults(tmp_path):
    """Safe as installed: an admin key generated into the chart's Secret (and read by the
    config), a NetworkPolicy admitting labelled clients and the monitoring namespace."""
    docs = render_chart({}, tmp_path)
    assert sorted(validate_manifests(docs)) == ["ConfigMap", "Deployment", "NetworkPolicy", "Secret", "Service"]
    check_pod(docs, tmp_path)
    check_network_policy(docs, {"nomyo-router/client": "true"})
    secret = next(d for d in docs if d["kind"] == "Secret")
    generated = secret["stringData"]["NOMYO_ADMIN_KEY"]
    assert len(generated) == 32 and generated.isalnum()
    assert router_config(docs).admin_key == generated
    again = next(d for d in render_chart({}, tmp_path) if d["kind"] == "Secret")["stringData"]
    assert again["NOMYO_ADMIN_KEY"] != generated  # random per install; an upgrade keeps it (`lookup`)
    assert router_config(docs).state == "auto" and router_pod(docs)["spec"]["replicas"] == 1


def test_helm_chart_with_keys_workers_and_a_service_monitor(tmp_path):
    values = {
        "workers": 2,
        "secrets": {"NOMYO_ADMIN_KEY": "admin-key-0123456789", "NOMYO_METRICS_KEY": "metrics-key-0123456789"},
        "config": {
            "endpoints": [{"url": "http://ollama:11434", "name": "ollama", "max_concurrent": 2}],
            "metrics_key": "${NOMYO_METRICS_KEY}",
        },
        "serviceMonitor": {"enabled": True},
        "persistence": {"existingClaim": "router-data"},
        "preStopSleepSeconds": 10,
        "terminationGracePeriodSeconds": 50,
        "networkPolicy": {"clientLabels": {"app": "open-webui"}, "extraFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
    }
    docs = render_chart(values, tmp_path)
    assert sorted(validate_manifests(docs)) == [
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "Secret",
        "Service",
        "ServiceMonitor",
    ]
    container = check_pod(docs, tmp_path)
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    config = router_config(docs)
    assert config.admin_key == "admin-key-0123456789" and config.metrics_key == "metrics-key-0123456789"
    secret = next(d for d in docs if d["kind"] == "Secret")
    assert secret["stringData"] == values["secrets"]  # nothing generated beside a given key
    pod = router_pod(docs)["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][-2:] == ["--workers", "2"]
    assert pod["containers"][0]["envFrom"][0]["secretRef"]["name"] == secret["metadata"]["name"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "router-data"}} in pod["volumes"]
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"][-1] == {"ipBlock": {"cidr": "10.0.0.0/8"}}
    policy["spec"]["ingress"][0]["from"].pop()
    check_network_policy(docs, {"app": "open-webui"})


def test_helm_chart_with_an_existing_secret_and_no_network_policy(tmp_path):
    values = {"existingSecret": "my-keys", "networkPolicy": {"enabled": False}}
    docs = render_chart(values, tmp_path)
    assert sorted(validate_manifests(docs)) == ["ConfigMap", "Deployment", "Service"]
    container = check_pod(docs, tmp_path)  # (with what an operator puts in that Secret)
    assert container["envFrom"][0]["secretRef"]["name"] == "my-keys"
