"""Config: both forms load; every bad value stops start-up with the key named."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import yaml

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


_K = "one-key-for-two-0123"
_K_HASHED = "sha256:" + hashlib.sha256(_K.encode()).hexdigest()


@pytest.mark.parametrize("keys,first,second", [
    ({"client_keys": [{"name": "alice", "key": _K}, {"name": "bob", "key": _K}]},
     "client_keys 'alice'", "client_keys 'bob'"),
    ({"client_keys": [{"name": "alice", "key": _K}, {"name": "bob", "key": _K_HASHED}]},
     "client_keys 'alice'", "client_keys 'bob'"),
    ({"admin_key": _K_HASHED.upper().replace("SHA256:", "sha256:"), "client_keys": [{"name": "alice", "key": _K}]},
     "admin_key", "client_keys 'alice'"),
    ({"router_api_key": _K, "client_keys": [{"name": "alice", "key": _K}]}, "router_api_key", "client_keys 'alice'"),
    ({"metrics_key": _K, "client_keys": [{"name": "alice", "key": _K}]}, "metrics_key", "client_keys 'alice'"),
    ({"router_api_key": _K, "admin_key": _K_HASHED}, "router_api_key", "admin_key"),
    ({"admin_key": _K, "metrics_key": _K}, "admin_key", "metrics_key"),
    ({"router_api_key": _K, "metrics_key": _K}, "router_api_key", "metrics_key"),
])
def test_a_key_shared_by_two_holders_is_refused_naming_both(keys, first, second, tmp_path):
    """A key and its sha256: form are one key: two holders of it would be one caller to the
    router. parse_config (start-up, reload) and --check refuse it; the key is never shown."""
    with pytest.raises(ConfigError) as e:
        parse_config({"endpoints": ["http://x"], **keys})
    message = str(e.value)
    assert f"{first} and {second} have the same key" in message
    assert _K not in message and _K_HASHED[7:] not in message.lower()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"endpoints": ["http://x"], **keys}))
    p = subprocess.run([sys.executable, "-m", "nomyo_router", "--config", str(path), "--check"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and f"{first} and {second}" in p.stderr
    assert _K not in p.stdout + p.stderr and _K_HASHED[7:] not in (p.stdout + p.stderr).lower()


def test_distinct_keys_pass():
    cfg = parse_config({"endpoints": ["http://x"], "router_api_key": _K + "r", "admin_key": _K + "a",
                        "metrics_key": _K + "m", "client_keys": [{"name": "alice", "key": _K},
                                                                 {"name": "bob", "key": _K + "b"}]})
    assert len(cfg.client_keys) == 2
