"""The router's configuration: one validated, immutable structure, loaded once at start.

Both the documented form and NOMYO's original form (a plain list of URLs in
`endpoints`, an `api_keys` map keyed by URL) are accepted. Every error names the
key, the value and what is expected, and stops start-up.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import yaml

CONFIG_ENV = "NOMYO_ROUTER_CONFIG"  # the config path, handed from `nomyo-router` to its workers
ENDPOINT_TYPES = ("ollama", "openai")
ROUTING_POLICIES = ("cache_aware", "least_busy", "sglang")  # routing/policies POLICIES
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """A bad configuration; the message names the key and the fix."""


@dataclass(frozen=True)
class EndpointConfig:
    url: str
    name: str
    type: str | None = None  # None: detected at start
    max_concurrent: int = 2
    api_key: str | None = None
    models: tuple[str, ...] | None = None  # None: discovered
    kv_cache_tokens: int = 131072  # its KV cache size, bounding the router's prefix index
    kv_events: str | None = None  # vLLM KV-event publisher (zmq tcp://host:port): precise mode
    # "user:password" taken out of the url (http://user:pass@host): sent as Authorization: Basic
    basic_auth: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:  # never print credentials
        return f"EndpointConfig(name={self.name!r}, url={self.url!r}, type={self.type!r})"


@dataclass(frozen=True)
class RouterConfig:
    endpoints: tuple[EndpointConfig, ...]
    max_concurrent_connections: int = 2
    max_queue: int = 1024
    queue_timeout: float = 300.0
    connect_timeout: float = 5.0
    first_byte_timeout: float = 300.0
    stream_idle_timeout: float = 120.0
    model_refresh_interval: float = 30.0
    health_interval: float = 2.0
    health_timeout: float = 2.0
    max_body_bytes: int = 16 * 1024 * 1024
    max_attempts: int = 3
    retry_after: int = 1
    access_log: bool = False
    log_format: str = "text"  # text | json (the router's access lines)
    state: str = "auto"  # auto | memory | shared | redis://...
    lease_ttl: float = 30.0  # Redis: a dead instance's slots come back after this
    conversation_affinity: bool = True
    session_header: str = "X-Session-ID"
    affinity_ttl: float = 600.0
    affinity_max_pins: int = 100_000
    affinity_wait_ms: float = 2000.0
    routing: str = "cache_aware"  # cache_aware | least_busy | sglang
    eject_after: int = 3  # consecutive backend failures that eject an endpoint
    eject_backoff: float = 1.0  # first ejection's length; doubles while it keeps failing
    eject_backoff_max: float = 30.0
    probe_interval_down: float = 0.25  # probe period for ejected or unreachable endpoints
    retry_budget: float = 0.2  # retries / requests over a 10 s window (at least 10 retries)
    first_byte_floor: float = 10.0  # the learned first-byte deadline is never shorter
    first_byte_factor: float = 4.0  # deadline = factor x what the endpoint has shown
    router_api_key: str | None = field(default=None, repr=False)  # one client key (NOMYO's name)
    # (name, key, models or None, max_concurrent or None)
    client_keys: tuple[tuple[str, str, tuple[str, ...] | None, int | None], ...] = field(default=(), repr=False)
    allowed_origins: tuple[str, ...] = ()  # browser origins beyond localhost/app schemes
    max_connections: int = 0  # concurrent connections before uvicorn answers 503; 0: no limit
    max_header_bytes: int = 64 * 1024  # a larger request head: 431, connection closed
    header_timeout: float = 10.0  # seconds to send a request head
    body_idle_timeout: float = 30.0  # seconds a request body may idle between two pieces
    resume_streams: bool = True  # continue a stream cut mid-way on another endpoint
    native_relay: bool = True  # streams relayed by the compiled pump (upstream/native.py) when built
    shutdown_grace: float = 30.0  # SIGTERM: seconds in-flight streams may take to finish
    manage_concurrency: int = 2  # model management calls (pull, create, ...) at once per process
    overload_lag_ms: float = 1000.0  # loop lag beyond which new requests get 503 router_overloaded; 0: off
    usage_db: str | None = "./nomyo-usage.db"  # SQLite token accounting; None: off (Redis state: in Redis)
    admin_key: str | None = field(default=None, repr=False)  # POST /admin/reload, everyone's /api/usage
    metrics_key: str | None = field(default=None, repr=False)  # /metrics and the dashboard's data (Prometheus)
    max_record_bytes: int = 8 * 1024 * 1024  # the longest stream record (NDJSON line, SSE event) relayed
    max_response_bytes: int = 64 * 1024 * 1024  # the largest whole answer the router holds (translation, usage)
    redis_timeout: float = 1.0  # deadline of every Redis call; a stalled Redis counts as a dead one
    gc_full_interval: float = 60.0  # seconds between full GC passes while the router runs; 0: CPython's own


# key -> (python type(s), check, what is expected)
_POSITIVE_INT = (int, lambda v: v >= 1, "an integer >= 1")
_NON_NEG_INT = (int, lambda v: v >= 0, "an integer >= 0")
_POSITIVE_NUM = ((int, float), lambda v: v > 0, "a number > 0 (seconds)")
_NON_NEG_NUM = ((int, float), lambda v: v >= 0, "a number >= 0")
_BOOL = (bool, lambda v: True, "true or false")
_SCALARS: dict[str, tuple[Any, Any, str]] = {
    "max_concurrent_connections": _POSITIVE_INT,
    "max_queue": _NON_NEG_INT,
    "queue_timeout": _POSITIVE_NUM,
    "connect_timeout": _POSITIVE_NUM,
    "first_byte_timeout": _POSITIVE_NUM,
    "stream_idle_timeout": _POSITIVE_NUM,
    "model_refresh_interval": _POSITIVE_NUM,
    "health_interval": _POSITIVE_NUM,
    "health_timeout": _POSITIVE_NUM,
    "max_body_bytes": _POSITIVE_INT,
    "max_attempts": _POSITIVE_INT,
    "retry_after": _NON_NEG_INT,
    "access_log": _BOOL,
    "log_format": (str, lambda v: v in ("text", "json"), "'text' or 'json'"),
    "state": (str, lambda v: v in ("auto", "memory", "shared") or v.startswith(("redis://", "rediss://", "unix://")),
              "'auto', 'memory', 'shared' or a redis:// URL"),
    "lease_ttl": _POSITIVE_NUM,
    "conversation_affinity": _BOOL,
    "session_header": (str, lambda v: bool(v.strip()), "a header name"),
    "affinity_ttl": _POSITIVE_NUM,
    "affinity_max_pins": _POSITIVE_INT,
    "affinity_wait_ms": _NON_NEG_NUM,
    "eject_after": _POSITIVE_INT,
    "eject_backoff": _POSITIVE_NUM,
    "eject_backoff_max": _POSITIVE_NUM,
    "probe_interval_down": _POSITIVE_NUM,
    "retry_budget": ((int, float), lambda v: 0 <= v <= 1, "a share of requests between 0 and 1"),
    "first_byte_floor": _POSITIVE_NUM,
    "first_byte_factor": ((int, float), lambda v: v >= 1, "a number >= 1"),
    "overload_lag_ms": _NON_NEG_NUM,
    "gc_full_interval": _NON_NEG_NUM,
    "manage_concurrency": _POSITIVE_INT,
    "resume_streams": _BOOL,
    "native_relay": _BOOL,
    "max_connections": _NON_NEG_INT,
    "max_header_bytes": ((int,), lambda v: v >= 1024, "an integer >= 1024 (bytes)"),
    "header_timeout": _POSITIVE_NUM,
    "body_idle_timeout": _POSITIVE_NUM,
    "shutdown_grace": _NON_NEG_NUM,
    "routing": (str, lambda v: v in ROUTING_POLICIES, f"one of {', '.join(ROUTING_POLICIES)}"),
    "max_record_bytes": ((int,), lambda v: v >= 1024, "an integer >= 1024 (bytes)"),
    "max_response_bytes": ((int,), lambda v: v >= 1024, "an integer >= 1024 (bytes)"),
    "redis_timeout": _POSITIVE_NUM,
}
_ENDPOINT_KEYS = {"url", "name", "type", "max_concurrent", "api_key", "models", "kv_cache_tokens",
                  "kv_events"}
_TOP_KEYS = set(_SCALARS) | {"endpoints", "api_keys", "router_api_key", "client_keys", "allowed_origins",
                             "usage_db", "admin_key", "metrics_key"}


def expand_env(value: str, where: str) -> str:
    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable ${{{name}}} is not set; "
                          f"export it or write ${{{name}:-default}}")
    return _ENV_RE.sub(sub, value)


def _check(key: str, value: Any, spec: tuple[Any, Any, str]) -> Any:
    typ, ok, expected = spec
    if isinstance(value, bool) and typ is not bool:
        ok_type = False
    else:
        ok_type = isinstance(value, typ)
    if not ok_type or not ok(value):
        raise ConfigError(f"{key}: expected {expected}, got {value!r}")
    return float(value) if typ == (int, float) else value


def _check_url(key: str, url: Any) -> str:
    if not isinstance(url, str):
        raise ConfigError(f"{key}: expected a URL such as http://127.0.0.1:11434, got {type(url).__name__}")
    shown = redact_url(url.strip())
    try:
        parts = urlsplit(url.strip())
        parts.port
    except ValueError:
        raise ConfigError(f"{key}: the port in {shown!r} is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {shown!r}")
    return url.strip().rstrip("/")


def redact_url(url: str) -> str:
    """The url as it may be printed: `user:pass@` becomes `***@`."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***@" + url.rpartition("@")[2] if "@" in url else url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{path}"


def _default_name(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def _endpoint(i: int, raw: Any, default_slots: int, api_keys: dict[str, str]) -> EndpointConfig:
    key = f"endpoints[{i}]"
    if isinstance(raw, str):
        raw = {"url": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a URL or a mapping with 'url', got {raw!r}")
    unknown = set(raw) - _ENDPOINT_KEYS
    if unknown:
        raise ConfigError(f"{key}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_ENDPOINT_KEYS)}")
    if "url" not in raw:
        raise ConfigError(f"{key}: 'url' is required")
    url = _check_url(f"{key}.url", raw["url"])
    url, basic_auth = split_userinfo(url)
    if basic_auth is not None and raw.get("api_key"):
        raise ConfigError(f"{key}: the url carries credentials (user:pass@) and api_key is set too; "
                          f"keep one: remove the credentials from the url or drop api_key")
    # `/v1` is where OpenAI routes live; keep the base URL without it.
    if url.endswith("/v1"):
        url = url[:-3]
    name = raw.get("name", _default_name(url))
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{key}.name: expected a non-empty string, got {name!r}")
    typ = raw.get("type")
    if typ is not None and typ not in ENDPOINT_TYPES:
        raise ConfigError(f"{key}.type: expected one of {ENDPOINT_TYPES} (or omit it to detect), got {typ!r}")
    slots = _check(f"{key}.max_concurrent", raw.get("max_concurrent", default_slots), _POSITIVE_INT)
    api_key = raw.get("api_key", api_keys.get(url) or api_keys.get(url + "/v1") or api_keys.get(str(raw["url"])))
    if api_key is not None:
        if not isinstance(api_key, str):
            raise ConfigError(f"{key}.api_key: expected a string, got a {type(api_key).__name__}")
        api_key = expand_env(api_key, f"{key}.api_key") or None
    models = raw.get("models")
    if models is not None:
        if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
            raise ConfigError(f"{key}.models: expected a non-empty list of model names, got {models!r}")
        models = tuple(models)
    kv_tokens = _check(f"{key}.kv_cache_tokens", raw.get("kv_cache_tokens", 131072), _NON_NEG_INT)
    kv_events = raw.get("kv_events")
    if kv_events is not None and not (isinstance(kv_events, str) and kv_events.startswith(("tcp://", "ipc://"))):
        raise ConfigError(f"{key}.kv_events: expected vLLM's KV-event publisher address such as "
                          f"tcp://127.0.0.1:5557, got {kv_events!r}")
    return EndpointConfig(url=url, name=name.strip(), type=typ, max_concurrent=slots, api_key=api_key,
                          models=models, kv_cache_tokens=kv_tokens, kv_events=kv_events, basic_auth=basic_auth)


def split_userinfo(url: str) -> tuple[str, str | None]:
    """(the url without `user:pass@`, "user:pass" percent-decoded or None). Credentials in a
    url must never reach the Host header, a log line or an error message: they are sent as
    `Authorization: Basic` instead (what curl and browsers do with them)."""
    parts = urlsplit(url)
    if parts.username is None and "@" not in parts.netloc:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    return urlunsplit(parts._replace(netloc=host)), f"{user}:{password}"


def parse_config(data: Any, source: str = "config") -> RouterConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level with an 'endpoints' list")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    values: dict[str, Any] = {}
    for key, spec in _SCALARS.items():
        if key in data and data[key] is not None:
            values[key] = _check(key, data[key], spec)
    api_keys = data.get("api_keys") or {}
    if not isinstance(api_keys, dict):
        raise ConfigError("api_keys: expected a mapping of endpoint URL to key")
    api_keys = {str(k).rstrip("/"): v for k, v in api_keys.items()}
    raw_eps = data.get("endpoints")
    if not isinstance(raw_eps, list) or not raw_eps:
        raise ConfigError("endpoints: expected a non-empty list of URLs or mappings with 'url'")
    default_slots = values.get("max_concurrent_connections", 2)
    endpoints = tuple(_endpoint(i, raw, default_slots, api_keys) for i, raw in enumerate(raw_eps))
    names = [e.name for e in endpoints]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"endpoints: names must be unique; give each a 'name' ({dupes} repeat)")
    values.update(_access(data))
    return RouterConfig(endpoints=endpoints, **values)


def digest_of(key: str) -> bytes:
    """The stored form of a key from the config: `sha256:<hex>` as given, else hashed."""
    if key.startswith("sha256:"):
        return bytes.fromhex(key[7:])
    return hashlib.sha256(key.encode()).digest()


def _key(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        shown = "an empty string" if isinstance(value, str) else f"a {type(value).__name__}"  # (never the value)
        raise ConfigError(f"{where}: expected a non-empty key (or sha256:<64 hex digits>), got {shown}")
    value = expand_env(value.strip(), where)
    if value.startswith("sha256:"):
        digest = value[7:]
        if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
            raise ConfigError(f"{where}: a hashed key is sha256: followed by 64 hex digits")
    elif len(value) < 8:
        raise ConfigError(f"{where}: a key of {len(value)} characters is too easy to guess; use at least 8 (16 or more recommended)")
    return value


def _access(data: dict[str, Any]) -> dict[str, Any]:
    """router_api_key, client_keys and allowed_origins, validated."""
    out: dict[str, Any] = {}
    if data.get("router_api_key") is not None:
        out["router_api_key"] = _key("router_api_key", data["router_api_key"])
    if data.get("admin_key") is not None:
        out["admin_key"] = _key("admin_key", data["admin_key"])
    if data.get("metrics_key") is not None:
        out["metrics_key"] = _key("metrics_key", data["metrics_key"])
    if "usage_db" in data:
        db = data["usage_db"]
        if db is not None and (not isinstance(db, str) or not db.strip()):
            raise ConfigError(f"usage_db: expected a file path (e.g. ./nomyo-usage.db) or null to turn "
                              f"token accounting off, got {db!r}")
        out["usage_db"] = db
    raw = data.get("client_keys")
    if raw is not None:
        if not isinstance(raw, list):
            raise ConfigError("client_keys: expected a list of {name, key, models?} mappings")
        keys = []
        for i, entry in enumerate(raw):
            where = f"client_keys[{i}]"
            if not isinstance(entry, dict) or set(entry) - {"name", "key", "models", "max_concurrent"}:
                raise ConfigError(f"{where}: expected a mapping with 'name', 'key' and optional 'models', "
                                  f"'max_concurrent'")
            cap = entry.get("max_concurrent")
            if cap is not None:
                _check(f"{where}.max_concurrent", cap, _POSITIVE_INT)
            name = entry.get("name")
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"{where}.name: expected a non-empty string, got {name!r}")
            models = entry.get("models")
            if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) and m for m in models)):
                raise ConfigError(f"{where}.models: expected a list of model names, got {models!r}")
            keys.append((name.strip(), _key(f"{where}.key", entry.get("key")), tuple(models) if models else None,
                         cap))
        names = [k[0] for k in keys]
        if {"default", "admin", "metrics"} & set(names):
            raise ConfigError("client_keys: the names 'default', 'admin' and 'metrics' are reserved "
                              "(router_api_key, admin_key and metrics_key); choose another name")
        if len(set(names)) != len(names):
            raise ConfigError("client_keys: names must be unique (they name the client in usage and logs)")
        out["client_keys"] = tuple(keys)
    # One key, one holder. The router knows a caller by its key's digest, so a key given twice
    # (as written, or once as sha256:<hex>) would quietly make one holder the other: a client
    # key equal to admin_key is an admin, two clients on one key are one client in usage and
    # limits. Refused at --check and start-up, naming both holders and never the key.
    holders: dict[bytes, str] = {}
    named = [(setting, out[setting]) for setting in ("router_api_key", "admin_key", "metrics_key")
             if setting in out]
    named += [(f"client_keys '{name}'", key) for name, key, _, _ in out.get("client_keys", ())]
    for who, key in named:
        digest = digest_of(key)
        if digest in holders:
            raise ConfigError(f"{holders[digest]} and {who} have the same key (compared after hashing: a key "
                              f"and its sha256: form are one key); give each its own key")
        holders[digest] = who
    origins = data.get("allowed_origins")
    if origins is not None:
        if not isinstance(origins, list) or not all(isinstance(o, str) and o for o in origins):
            raise ConfigError("allowed_origins: expected a list of origins such as https://chat.example.com "
                              "(wildcards allowed: https://*.example.com)")
        out["allowed_origins"] = tuple(origins)
    return out


def load_config(path: str) -> RouterConfig:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found; pass --config PATH or set NOMYO_ROUTER_CONFIG")
    except yaml.YAMLError as e:  # (where, not the line's text: the line may hold a key)
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or type(e).__name__}") from None
    return parse_config(data, path)
