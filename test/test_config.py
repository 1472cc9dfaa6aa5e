"""Config: both forms load; every bad value stops start-up with the key named."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nomyo_router.config import ConfigError, load_config, parse_config


def test_nomyo_form_and_env_expansion(monkeypatch):
    monkeypatch.setenv("KEY_B", "sk-b")
    cfg = parse_config({
        "endpoints": ["http://a:11434", "http://b:8000/v1"],
        "api_keys": {"http://b:8000/v1": "${KEY_B}"},
        "max_concurrent_connections": 3,
    })
    a, b = cfg.endpoints
    assert (a.name, a.max_concurrent, a.api_key) == ("a:11434", 3, None)
    assert (b.url, b.api_key) == ("http://b:8000", "sk-b")
    assert "sk-b" not in repr(b)


def test_mapping_form():
    cfg = parse_config({"endpoints": [{"url": "http://x:1", "name": "gpu1", "type": "openai",
                                       "max_concurrent": 8, "models": ["m"]}],
                        "queue_timeout": 5, "max_queue": 0})
    e = cfg.endpoints[0]
    assert (e.name, e.type, e.max_concurrent, e.models) == ("gpu1", "openai", 8, ("m",))
    assert cfg.queue_timeout == 5.0 and cfg.max_queue == 0


@pytest.mark.parametrize("data,fragment", [
    ({}, "endpoints"),
    ({"endpoints": []}, "endpoints"),
    ({"endpoints": ["ftp://x"]}, "endpoints[0].url"),
    ({"endpoints": [{"name": "a"}]}, "'url' is required"),
    ({"endpoints": [{"url": "http://x", "typo": 1}]}, "unknown key(s) ['typo']"),
    ({"endpoints": [{"url": "http://x", "type": "vllm"}]}, "endpoints[0].type"),
    ({"endpoints": [{"url": "http://x", "max_concurrent": 0}]}, "endpoints[0].max_concurrent"),
    ({"endpoints": [{"url": "http://x", "api_key": "${NOPE_NOT_SET}"}]}, "NOPE_NOT_SET"),
    ({"endpoints": ["http://x", "http://x"]}, "unique"),
    ({"endpoints": ["http://x"], "max_queue": -1}, "max_queue"),
    ({"endpoints": ["http://x"], "queue_timeout": "soon"}, "queue_timeout"),
    ({"endpoints": ["http://x"], "max_concurrent_connections": True}, "max_concurrent_connections"),
    ({"endpoints": ["http://x"], "maxqueue": 3}, "unknown key(s) ['maxqueue']"),
    ({"endpoints": [{"url": "http://u:p@x", "api_key": "k"}]}, "credentials (user:pass@) and api_key"),
    ({"endpoints": ["http://x"], "router_api_key": "short"}, "router_api_key"),
    ({"endpoints": ["http://x"], "client_keys": [{"name": "a", "key": "sha256:12"}]}, "client_keys[0].key"),
    ({"endpoints": ["http://x"], "client_keys": [{"name": "a", "key": "k" * 16}, {"name": "a", "key": "j" * 16}]},
     "client_keys: names must be unique"),
    ({"endpoints": ["http://x"], "allowed_origins": "https://x"}, "allowed_origins"),
    ({"endpoints": ["http://x"], "retry_budget": 2}, "retry_budget"),
    ({"endpoints": ["http://x"], "eject_after": 0}, "eject_after"),
    ({"endpoints": ["http://x"], "manage_concurrency": 0}, "manage_concurrency: expected an integer >= 1"),
])
def test_bad_config_names_the_key(data, fragment):
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert fragment in str(e.value)


def test_cli_refuses_a_bad_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("endpoints:\n  - url: http://127.0.0.1:1\n    max_concurrent: lots\n")
    p = subprocess.run([sys.executable, "-m", "nomyo_router", "--config", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "endpoints[0].max_concurrent" in p.stderr and "integer >= 1" in p.stderr
    with pytest.raises(ConfigError, match="not valid YAML"):
        (tmp_path / "y.yaml").write_text("endpoints: [")
        load_config(str(tmp_path / "y.yaml"))


def test_shipped_config_is_valid():
    assert len(load_config("config.yaml").endpoints) == 2
