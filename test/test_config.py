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
    cfg = parse_config(
        {
            "endpoints": ["http://a:11434", "http://b:8000/v1"],
            "api_keys": {"http://b:8000/v1": "${KEY_B}"},
            "max_concurrent_connections": 3,
        }
    )
    a, b = cfg.endpoints
    assert (a.name, a.max_concurrent, a.api_key) == ("a:11434", 3, None)
    assert (b.url, b.api_key) == ("http://b:8000", "sk-b")
    assert "sk-b" not in repr(b)


def test_mapping_form():
    cfg = parse_config(
        {
            "endpoints": [
                {"url": "http://x:1", "name": "gpu1", "type": "openai", "max_concurrent": 8, "models": ["m"]}
            ],
            "queue_timeout": 5,
            "max_queue": 0,
        }
    )
    e = cfg.endpoints[0]
    assert (e.name, e.type, e.max_concurrent, e.models) == ("gpu1", "openai", 8, ("m",))
    assert cfg.queue_timeout == 5.0 and cfg.max_queue == 0


@pytest.mark.parametrize(
    "data,fragment",
    [
        ({}, "endpoints"),
        ({"endpoints": []}, "endpoints"),
        ({"endpoints": ["ftp://x"]}, "endpoints[0].url"),
        ({"endpoints": [{"name": "a"}]}, "'url' is required"),
        ({"endpoints": [{"url": "http://x", "typo": 1}]}, "endpoints[0].typo: unknown key; did you mean type?"),
        ({"endpoints": [{"url": "http://x", "type": "vllm"}]}, "endpoints[0].type"),
        ({"endpoints": [{"url": "http://x", "max_concurrent": 0}]}, "endpoints[0].max_concurrent"),
        ({"endpoints": [{"url": "http://x", "api_key": "${NOPE_NOT_SET}"}]}, "NOPE_NOT_SET"),
        ({"endpoints": ["http://x", "http://x"]}, "unique"),
        ({"endpoints": ["http://x"], "max_queue": -1}, "max_queue"),
        ({"endpoints": ["http://x"], "queue_timeout": "soon"}, "queue_timeout"),
        ({"endpoints": ["http://x"], "max_concurrent_connections": True}, "max_concurrent_connections"),
        ({"endpoints": ["http://x"], "maxqueue": 3}, "maxqueue: unknown key; did you mean max_queue?"),
        ({"endpoints": [{"url": "http://u:p@x", "api_key": "k"}]}, "credentials (user:pass@) and api_key"),
        ({"endpoints": ["http://x"], "router_api_key": "short"}, "router_api_key"),
        ({"endpoints": ["http://x"], "client_keys": [{"name": "a", "key": "sha256:12"}]}, "client_keys[0].key"),
        (
            {
                "endpoints": ["http://x"],
                "client_keys": [{"name": "a", "key": "k" * 16}, {"name": "a", "key": "j" * 16}],
            },
            "client_keys: names must be unique",
        ),
        ({"endpoints": ["http://x"], "allowed_origins": "https://x"}, "allowed_origins"),
        ({"endpoints": ["http://x"], "retry_budget": 2}, "retry_budget"),
        ({"endpoints": ["http://x"], "eject_after": 0}, "eject_after"),
        ({"endpoints": ["http://x"], "manage_concurrency": 0}, "manage_concurrency: expected an integer >= 1"),
    ],
)
def test_bad_config_names_the_key(data, fragment):
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    assert fragment in str(e.value)


def test_cli_refuses_a_bad_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("endpoints:\n  - url: http://127.0.0.1:1\n    max_concurrent: lots\n")
    p = subprocess.run(
        [sys.executable, "-m", "nomyo_router", "--config", str(bad)], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 2
    assert "endpoints[0].max_concurrent" in p.stderr and "integer >= 1" in p.stderr
    with pytest.raises(ConfigError, match="not valid YAML"):
        (tmp_path / "y.yaml").write_text("endpoints: [")
        load_config(str(tmp_path / "y.yaml"))


def test_shipped_config_is_valid():
    assert len(load_config("config.yaml").endpoints) == 2


_K = "one-key-for-two-0123"
_K_HASHED = "sha256:" + hashlib.sha256(_K.encode()).hexdigest()


@pytest.mark.parametrize(
    "keys,first,second",
    [
        (
            {"client_keys": [{"name": "alice", "key": _K}, {"name": "bob", "key": _K}]},
            "client_keys 'alice'",
            "client_keys 'bob'",
        ),
        (
            {"client_keys": [{"name": "alice", "key": _K}, {"name": "bob", "key": _K_HASHED}]},
            "client_keys 'alice'",
            "client_keys 'bob'",
        ),
        (
            {
                "admin_key": _K_HASHED.upper().replace("SHA256:", "sha256:"),
                "client_keys": [{"name": "alice", "key": _K}],
            },
            "admin_key",
            "client_keys 'alice'",
        ),
        (
            {"router_api_key": _K, "client_keys": [{"name": "alice", "key": _K}]},
            "router_api_key",
            "client_keys 'alice'",
        ),
        ({"metrics_key": _K, "client_keys": [{"name": "alice", "key": _K}]}, "metrics_key", "client_keys 'alice'"),
        ({"router_api_key": _K, "admin_key": _K_HASHED}, "router_api_key", "admin_key"),
        ({"admin_key": _K, "metrics_key": _K}, "admin_key", "metrics_key"),
        ({"router_api_key": _K, "metrics_key": _K}, "router_api_key", "metrics_key"),
    ],
)
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
    p = subprocess.run(
        [sys.executable, "-m", "nomyo_router", "--config", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 2 and f"{first} and {second}" in p.stderr
    assert _K not in p.stdout + p.stderr and _K_HASHED[7:] not in (p.stdout + p.stderr).lower()


def test_distinct_keys_pass():
    cfg = parse_config(
        {
            "endpoints": ["http://x"],
            "router_api_key": _K + "r",
            "admin_key": _K + "a",
            "metrics_key": _K + "m",
            "client_keys": [{"name": "alice", "key": _K}, {"name": "bob", "key": _K + "b"}],
        }
    )
    assert len(cfg.client_keys) == 2


# -- the declaration drives the checks: names, bounds, secrets, both forms --


@pytest.mark.parametrize(
    "data,message",
    [
        ({"max_queu": 3}, "max_queu: unknown key; did you mean max_queue?"),
        ({"routeing": "least_busy"}, "routeing: unknown key; did you mean routing?"),
        (
            {"endpoints": [{"url": "http://x", "max_concurent": 2}]},
            "endpoints[0].max_concurent: unknown key; did you mean max_concurrent?",
        ),
        (
            {"client_keys": [{"name": "a", "key": "k" * 16, "modles": ["m"]}]},
            "client_keys[0].modles: unknown key; did you mean models?",
        ),
        ({"colour": "blue"}, "colour: unknown key; remove it (the valid keys are in docs/configuration.md)"),
        ({"endpoints": [{"url": "http://x", "zzz": 1}]}, "endpoints[0].zzz: unknown key; valid keys: url, name, "),
        # derived from other keys, not a key of the file
        ({"endpoints": [{"url": "http://x", "basic_auth": "u:p"}]}, "endpoints[0].basic_auth: unknown key"),
    ],
)
def test_an_unknown_key_is_refused_with_the_nearest_name(data, message):
    with pytest.raises(ConfigError) as e:
        parse_config({"endpoints": ["http://x"], **data})
    assert message in str(e.value)
    assert "u:p" not in str(e.value) and "k" * 16 not in str(e.value)  # (no value shown)


def test_every_unknown_key_is_named_at_once():
    with pytest.raises(ConfigError) as e:
        parse_config({"endpoints": ["http://x"], "max_queu": 1, "retry_afterr": 1})
    assert "max_queu: unknown key; did you mean max_queue?" in str(e.value)
    assert "retry_afterr: unknown key; did you mean retry_after?" in str(e.value)


def _just_outside(spec):
    """A value one step outside the declared bounds, and the bound's words."""
    c = spec.constraints
    step = 1 if spec.type is int else 0.5
    if "ge" in c:
        return c["ge"] - step, f">= {c['ge']}" if "le" not in c else f"between {c['ge']} and {c['le']}"
    return c["gt"] - (step if spec.type is int else 0), f"> {c['gt']}"


def _bounded():
    from nomyo_router.config import ClientKey, EndpointConfig, RouterConfig
    from nomyo_router.config_checks import specs

    for struct, where in ((RouterConfig, ""), (EndpointConfig, "endpoints[0]."), (ClientKey, "client_keys[0].")):
        for name, spec in specs(struct).items():
            if spec.type in (int, float) and ({"ge", "gt"} & set(spec.constraints)):
                yield pytest.param(where, name, spec, id=where + name)


@pytest.mark.parametrize("where,name,spec", list(_bounded()))
def test_every_declared_bound_is_named_in_its_error(where, name, spec):
    """Each key's bound comes from its declaration, and the error says it with the key and the value."""
    value, bound = _just_outside(spec)
    data = {"endpoints": ["http://x"], "client_keys": [{"name": "a", "key": "k" * 16}]}
    if where == "endpoints[0].":
        data["endpoints"] = [{"url": "http://x", name: value}]
    elif where == "client_keys[0].":
        data["client_keys"] = [{"name": "a", "key": "k" * 16, name: value}]
    else:
        data[name] = value
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    message = str(e.value)
    assert message.startswith(f"{where}{name}: expected ") and bound in message and f"got {value!r}" in message
    unit = spec.extra.get("unit")
    assert unit is None or f"({unit})" in message


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("max_queue", -1, "max_queue: expected an integer >= 0, got -1"),
        ("queue_timeout", 0, "queue_timeout: expected a number > 0 (seconds), got 0"),
        ("retry_budget", 1.5, "retry_budget: expected a number between 0 and 1, got 1.5"),
        ("max_record_bytes", 100, "max_record_bytes: expected an integer >= 1024 (bytes), got 100"),
        ("max_queue", 10.5, "max_queue: expected an integer >= 0, got 10.5"),
        ("access_log", "yes", "access_log: expected true or false, got 'yes'"),
        ("routing", "fastest", "routing: expected one of 'cache_aware', 'least_busy', 'sglang', got 'fastest'"),
        (
            "state",
            "postgres://x",
            "state: expected 'auto', 'memory', 'shared', a redis:// URL or "
            "redis+sentinel://host:port[,host:port]/service, got 'postgres://x'",
        ),
        ("usage_db", " ", "usage_db: expected a file path (e.g. ./nomyo-usage.db) or null"),
    ],
)
def test_errors_name_the_key_the_value_and_the_fix(key, value, expected):
    with pytest.raises(ConfigError) as e:
        parse_config({"endpoints": ["http://x"], key: value})
    assert str(e.value).startswith(expected)


def test_null_takes_the_default_except_where_null_means_off():
    cfg = parse_config({"endpoints": ["http://x"], "max_queue": None, "client_keys": None, "usage_db": None})
    assert cfg.max_queue == 1024 and cfg.client_keys == () and cfg.usage_db is None
    assert parse_config({"endpoints": ["http://x"]}).usage_db == "./nomyo-usage.db"
    for state in ("auto", "memory", "shared", "redis://h:6379/0", "rediss://h", "unix:///run/redis.sock"):
        assert parse_config({"endpoints": ["http://x"], "state": state}).state == state


SECRETS = {
    "router_api_key": "router-secret-0123",
    "admin_key": "admin-secret-0123",
    "metrics_key": "metrics-secret-0123",
}


def test_secrets_never_appear_in_repr_or_str(monkeypatch):
    """A config printed whole (a log line, a traceback, rich's pretty printer) shows that a key
    is set, never the key: router, admin and metrics keys, client keys, backend keys, url credentials."""
    import rich.pretty

    monkeypatch.setenv("BACKEND_KEY", "sk-backend-secret-0123")
    cfg = parse_config(
        {
            "endpoints": [
                {"url": "http://x:1", "api_key": "${BACKEND_KEY}"},
                {"url": "http://us%40er:pa%3Ass-word@y:2"},
            ],
            "client_keys": [{"name": "alice", "key": "alice-secret-0123", "models": ["m"]}],
            **SECRETS,
        }
    )
    assert cfg.endpoints[0].api_key == "sk-backend-secret-0123" and cfg.endpoints[1].basic_auth == "us@er:pa:ss-word"
    assert cfg.client_keys[0].key == "alice-secret-0123" and cfg.admin_key == SECRETS["admin_key"]
    leaks = ["secret-0123", "pa%3Ass", "pa:ss", "us@er", "us%40er"]
    for shown in (
        repr(cfg),
        str(cfg),
        rich.pretty.pretty_repr(cfg),
        repr(cfg.endpoints),
        repr(cfg.client_keys),
        str(cfg.endpoints[1]),
        rich.pretty.pretty_repr(cfg.client_keys[0]),
    ):
        assert not [s for s in leaks if s in shown], shown
    assert "admin_key='***'" in repr(cfg) and "api_key='***'" in repr(cfg.endpoints[0])
    assert "basic_auth='***'" in repr(cfg.endpoints[1]) and "api_key=None" in repr(cfg.endpoints[1])
    assert "name='alice'" in repr(cfg) and "key='***'" in repr(cfg.client_keys[0])


def test_a_secret_of_the_wrong_type_is_named_not_shown():
    for data in (
        {"admin_key": 12345678901},
        {"client_keys": [{"name": "a", "key": 12345678901}]},
        {"endpoints": [{"url": "http://x", "api_key": 12345678901}]},
    ):
        with pytest.raises(ConfigError) as e:
            parse_config({"endpoints": ["http://x"], **data})
        assert "12345678901" not in str(e.value) and "got an int" in str(e.value)


def test_both_forms_make_the_same_config(monkeypatch):
    monkeypatch.setenv("KEY_B", "sk-b-0123")
    nomyo = parse_config(
        {
            "endpoints": ["http://a:11434", "http://u:p@c:9", "http://b:8000/v1/"],
            "api_keys": {"http://b:8000/v1": "${KEY_B}", "http://a:11434/": "${UNSET_KEY:-}"},
            "max_concurrent_connections": 3,
        }
    )
    documented = parse_config(
        {
            "endpoints": [
                {"url": "http://a:11434", "name": "a:11434", "max_concurrent": 3},
                {"url": "http://u:p@c:9", "max_concurrent": 3},
                {"url": "http://b:8000", "name": "b:8000", "max_concurrent": 3, "api_key": "sk-b-0123"},
            ],
            "max_concurrent_connections": 3,
        }
    )
    assert nomyo == documented
    a, c, b = nomyo.endpoints
    assert (a.api_key, c.url, c.basic_auth, b.url, b.api_key) == (
        None,
        "http://c:9",
        "u:p",
        "http://b:8000",
        "sk-b-0123",
    )


def test_the_config_is_immutable_and_reload_replaces_it():
    import msgspec

    cfg = parse_config({"endpoints": ["http://x"]})
    with pytest.raises(AttributeError):
        cfg.max_queue = 5  # type: ignore[misc]
    assert msgspec.structs.replace(cfg, max_queue=5).max_queue == 5 and cfg.max_queue == 1024


def test_every_pattern_says_its_valid_values_in_words():
    """A key checked by a regex explains itself in words: the regex is never the message."""
    from nomyo_router.config import ClientKey, EndpointConfig, RouterConfig
    from nomyo_router.config_checks import specs

    for struct in (RouterConfig, EndpointConfig, ClientKey):
        for name, spec in specs(struct).items():
            assert "pattern" not in spec.constraints or "expected" in spec.extra, name
            assert spec.description, f"{struct.__name__}.{name} has no doc"


def test_state_is_taken_from_the_environment_when_the_file_says_so(monkeypatch):
    """How the kustomize redis component points the user's own config at its Redis."""
    data = {"endpoints": ["http://x"], "state": "${NOMYO_TEST_STATE:-auto}"}
    monkeypatch.delenv("NOMYO_TEST_STATE", raising=False)
    assert parse_config(data).state == "auto"
    monkeypatch.setenv("NOMYO_TEST_STATE", "redis://nomyo-router-redis:6379/0")
    assert parse_config(data).state == "redis://nomyo-router-redis:6379/0"
    with pytest.raises(ConfigError) as e:
        parse_config({"endpoints": ["http://x"], "state": "${NOMYO_TEST_UNSET}"})
    assert str(e.value) == (
        "state: environment variable ${NOMYO_TEST_UNSET} is not set; export it or write ${NOMYO_TEST_UNSET:-default}"
    )
