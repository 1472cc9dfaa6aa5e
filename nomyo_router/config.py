"""The router's configuration: every key declared once, here, loaded once at start.

Each key is a field of a msgspec Struct with its type, default, bounds and one line of
documentation; msgspec checks types and bounds, docs/configuration.md is generated from the
same declaration (`python -m nomyo_router.config_doc`), so the code, the checks and the
reference cannot drift apart. What msgspec cannot say (URL shapes, key strength, one key one
holder, unique names) is checked explicitly below and in `config_checks.py`.

Both the documented form and NOMYO's original form (a plain list of URLs in `endpoints`, an
`api_keys` map keyed by URL) are accepted. Every error names the key, the value (never a
secret's) and what is expected, and stops start-up.
"""

import typing
from typing import Annotated, Any, Literal

import msgspec
import yaml
from msgspec import Meta

from .config_checks import (
    ConfigError,
    a_type,
    accepted_keys,
    check_key,
    check_url,
    default_name,
    defaults,
    digest_of,
    expand_env,
    explain,
    one_holder_per_key,
    redact_url,
    refuse_unknown,
    specs,
    split_userinfo,
)

__all__ = [
    "CONFIG_ENV",
    "ENDPOINT_TYPES",
    "ROUTING_POLICIES",
    "ClientKey",
    "ConfigError",
    "EndpointConfig",
    "CacheConfig",
    "MoeConfig",
    "RouterConfig",
    "TracingConfig",
    "digest_of",
    "expand_env",
    "load_config",
    "parse_config",
    "redact_url",
    "split_userinfo",
]

CONFIG_ENV = "NOMYO_ROUTER_CONFIG"  # the config path, handed from `nomyo-router` to its workers
SUPERVISOR_ENV = "NOMYO_ROUTER_SUPERVISOR_PID"  # set by the CLI with several workers: POST /admin/reload signals it
EndpointType = Literal["ollama", "openai"]
Routing = Literal["cache_aware", "least_busy", "sglang"]  # routing/policies POLICIES
ENDPOINT_TYPES: tuple[str, ...] = typing.get_args(EndpointType)
ROUTING_POLICIES: tuple[str, ...] = typing.get_args(Routing)


def doc(text: str, group: str = "", **extra: Any) -> Meta:
    """One key's documentation, read by the error messages and by config_doc. `extra` may say
    `expected` (valid values in words, when the type alone does not), `unit`, `default` and
    `type` (in words, for the reference, when the declaration's own would mislead), `secret`
    (never printed) or `derived` (set by the router from other keys, not a key of the file)."""
    if group:
        extra["group"] = group
    return Meta(description=text, extra=extra or None)


# value shapes shared by many keys; their bounds are part of each key's declaration
Slots = Annotated[int, Meta(ge=1)]
Count = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0, extra={"unit": "seconds"})]
SecondsOrOff = Annotated[float, Meta(ge=0, extra={"unit": "seconds"})]
Millis = Annotated[float, Meta(ge=0, extra={"unit": "ms"})]
Bytes = Annotated[int, Meta(ge=1024, extra={"unit": "bytes"})]
Name = Annotated[str, Meta(min_length=1)]
Names = Annotated[tuple[Name, ...], Meta(min_length=1)]
Key = Annotated[
    str, Meta(extra={"secret": True, "expected": "a key of 8 or more characters, or sha256:<64 hex digits>"})
]
Secret = Key | None

BACKENDS, QUEUE, TIMEOUTS, FAILURES = "Backends", "Queueing and limits", "Timeouts", "Failures and retries"
ROUTING, ACCESS, CONNECTIONS = "Routing and conversation affinity", "Access: keys and origins", "Connections"
STATE, OBSERVE, PROCESS = "State: workers and instances", "Logs and accounting", "Process"
CACHE = "Response cache"


class _Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The config structs' base: printed with every field but its secrets, which show only
    whether they are set ('***'), so a config in a log line or a traceback leaks no key."""

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        shown: list[tuple[str, Any]] = []
        for name, spec in specs(type(self)).items():
            value = getattr(self, name)
            shown.append((name, ("***" if value is not None else None) if spec.secret else value))
        return shown

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__rich_repr__())})"


class EndpointConfig(_Config, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One backend: an entry of `endpoints`, a URL or a mapping with these keys."""

    url: Annotated[
        str,
        doc(
            "the backend's base URL (a trailing /v1 is dropped); user:password@ in it is sent as "
            "Authorization: Basic, never in Host or a log line (percent-encode @ and : inside them)",
            expected="an http:// or https:// URL such as http://127.0.0.1:11434",
        ),
    ]
    name: Annotated[
        Name, doc("the endpoint's name in routing, /health, logs and metrics; unique", default="host:port of url")
    ]
    type: Annotated[
        EndpointType | None,
        doc(
            "its API; when omitted, detected at start (/api/version answers: ollama, else /v1/models: openai)",
            expected="one of 'ollama', 'openai' (or omit it to detect)",
            default="detected",
        ),
    ] = None
    max_concurrent: Annotated[
        Slots,
        doc("requests it serves at once (its slots); more wait in the queue", default="max_concurrent_connections"),
    ] = 2
    api_key: Annotated[
        str | None,
        doc(
            "the backend's API key, sent as a bearer token; ${ENV} expanded; not together with credentials in url",
            secret=True,
        ),
    ] = None
    models: Annotated[
        Names | None,
        doc(
            "the models it serves, given instead of discovered",
            expected="a non-empty list of model names",
            default="discovered",
        ),
    ] = None
    kv_cache_tokens: Annotated[
        Count, doc("its KV cache size in tokens: bounds what the router's prefix index believes it holds")
    ] = 131072
    kv_events: Annotated[
        Annotated[str, Meta(pattern=r"^(tcp|ipc)://")] | None,
        doc(
            "vLLM's KV-event publisher (vLLM --kv-events-config): precise cache-aware routing",
            expected="vLLM's KV-event publisher address such as tcp://127.0.0.1:5557",
        ),
    ] = None
    context_length: Annotated[
        Slots | None,
        doc(
            "its context window in tokens, for every model it serves; overrides the learned one (Ollama's "
            "/api/show and /api/ps, vLLM's max_model_len)",
            unit="tokens",
            default="learned",
        ),
    ] = None
    basic_auth: Annotated[str | None, doc("user:password taken out of url", secret=True, derived=True)] = None


class ClientKey(_Config, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One client: an entry of `client_keys`."""

    name: Annotated[Name, doc("the client, in usage, logs and metrics; unique; not default, admin or metrics")]
    key: Annotated[
        Key,
        doc(
            "its key: sent as Authorization: Bearer KEY or x-api-key: KEY; ${ENV} "
            "expanded; sha256:<hex> stores only its hash"
        ),
    ]
    models: Annotated[
        tuple[Name, ...] | None,
        doc("the models it may use (403 for others)", expected="a list of model names", default="all"),
    ] = None
    max_concurrent: Annotated[
        Slots | None,
        doc(
            "its requests holding or waiting for a slot; more wait aside, so others are not queued behind it",
            default="no cap",
        ),
    ] = None
    priority: Annotated[
        Annotated[int, Meta(ge=-100, le=100)],
        doc("its waiting requests are served before those of keys with a lower priority (strict)"),
    ] = 0
    weight: Annotated[
        Annotated[float, Meta(gt=0, le=1000)],
        doc("its share of the slots among waiting keys of its priority (weighted fair queuing; FIFO within the key)"),
    ] = 1.0
    rpm: Annotated[
        Slots | None,
        doc(
            "requests it may start in any rolling 60 s, across workers and instances; beyond: 429 "
            "rate_limit_exceeded with Retry-After",
            default="no limit",
        ),
    ] = None
    tpm: Annotated[
        Slots | None,
        doc(
            "tokens (prompt + completion, as the backends report them) per rolling 60 s; a request is "
            "admitted while the last minute's use is below it, counted when its answer ends",
            unit="tokens",
            default="no limit",
        ),
    ] = None
    tokens_per_day: Annotated[
        Slots | None,
        doc(
            "tokens per calendar day (UTC), counted like tpm; beyond: 429 insufficient_quota until midnight UTC",
            unit="tokens",
            default="no limit",
        ),
    ] = None


class TracingConfig(_Config, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """OpenTelemetry traces: the `tracing` mapping (`tracing: {}` turns them on with the
    defaults). A key left out is taken from the standard OTEL_* environment variable. Read at
    start."""

    endpoint: Annotated[
        Annotated[str, Meta(pattern=r"^https?://")] | None,
        doc(
            "the OTLP/HTTP collector's base URL; spans go to {endpoint}/v1/traces as protobuf",
            expected="an http:// or https:// URL such as http://otel-collector:4318",
            default="OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318",
        ),
    ] = None
    sample_ratio: Annotated[
        Annotated[float, Meta(ge=0, le=1)] | None,
        doc(
            "the share of requests traced when the client sent no traceparent (one that did is "
            "followed: its sampled flag decides)",
            default="OTEL_TRACES_SAMPLER_ARG, else 1.0",
        ),
    ] = None
    service_name: Annotated[
        Name | None, doc("service.name of the spans' resource", default="OTEL_SERVICE_NAME, else nomyo-router")
    ] = None


class CacheConfig(_Config, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The response cache: the `cache` mapping. A request uses it only when it opts in (the
    body field `"nomyo": {"cache": true}` or the header `X-Router-Response-Cache: use`); see
    docs/nomyo-parity.md. Read at start."""

    enabled: Annotated[bool, doc("answer opted-in requests from stored answers when they match")] = False
    backend: Annotated[
        Literal["memory", "sqlite", "redis"],
        doc(
            "where answers are kept: memory (this process), sqlite (a file; survives restarts), "
            "redis (shared by every instance)"
        ),
    ] = "memory"
    ttl: Annotated[Seconds, doc("how long a stored answer may be served")] = 3600.0
    path: Annotated[
        Annotated[str, Meta(pattern=r"\S")],
        doc(
            "sqlite: the database file (created 0600: it holds prompts' answers)",
            expected="a file path such as ./nomyo-cache.db",
        ),
    ] = "./nomyo-cache.db"
    url: Annotated[
        Annotated[str, Meta(pattern=r"^(redis|rediss|unix)://")] | None,
        doc("redis: the server's URL", expected="a redis:// URL", default="the state: redis://... URL"),
    ] = None
    max_entries: Annotated[Slots, doc("answers kept at most; the oldest go first")] = 10_000
    max_bytes: Annotated[
        Bytes, doc("memory: the bytes all kept answers may take; the least recently used go first")
    ] = 256 * 1024 * 1024
    max_entry_bytes: Annotated[Bytes, doc("a larger answer is relayed but not stored")] = 1024 * 1024
    similarity: Annotated[
        Annotated[float, Meta(gt=0, le=1)],
        doc(
            "1.0: exact matches only; lower: semantic mode, the nearest stored question at least this "
            "similar (cosine) answers"
        ),
    ] = 1.0
    embed_model: Annotated[
        Name | None,
        doc(
            "semantic mode: the embedding model, served by this router's own endpoints",
            default="none (required when similarity < 1)",
        ),
    ] = None


class MoeConfig(_Config, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The `moe-` ensemble (NOMYO's "multiple opinions"): the `moe` mapping. A request for
    `moe-<model>` is answered by `<model>` after it reviewed several answers of its own; see
    docs/nomyo-parity.md. Read at start."""

    samples: Annotated[
        Annotated[int, Meta(ge=1, le=16)],
        doc(
            "answers asked for at once, on distinct endpoints when enough serve the model, before the "
            "review and the final answer"
        ),
    ] = 3


class RouterConfig(_Config, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The whole configuration. Field order is the reference's order."""

    endpoints: Annotated[
        tuple[EndpointConfig, ...],
        doc(
            "the backends: URLs, or mappings with url and the keys below",
            BACKENDS,
            expected="a non-empty list of URLs or mappings with 'url'",
            type="list of URLs or mappings",
        ),
    ]
    max_concurrent_connections: Annotated[Slots, doc("slots of an endpoint that sets no max_concurrent", BACKENDS)] = 2
    model_refresh_interval: Annotated[
        Seconds,
        doc(
            "time between model discoveries (/api/tags + /api/ps, or /v1/models); a failed one keeps the list", BACKENDS
        ),
    ] = 30.0
    max_queue: Annotated[Count, doc("requests waiting for a slot; beyond: 503 + Retry-After", QUEUE)] = 1024
    queue_timeout: Annotated[Seconds, doc("how long a request may wait for a slot; then 503 + Retry-After", QUEUE)] = (
        300.0
    )
    retry_after: Annotated[Count, doc("seconds in Retry-After on 503", QUEUE)] = 1
    max_body_bytes: Annotated[
        Slots,
        doc("the largest request body read into memory (413 beyond); blob uploads stream through", QUEUE, unit="bytes"),
    ] = 16 * 1024 * 1024
    max_record_bytes: Annotated[
        Bytes,
        doc(
            "the longest stream record (NDJSON line, SSE event) relayed; longer: the stream ends with an "
            "error record and counts as the backend's failure",
            QUEUE,
        ),
    ] = 8 * 1024 * 1024
    max_response_bytes: Annotated[
        Bytes,
        doc(
            "the largest whole answer the router holds (to translate it, count usage); larger: 502 response_too_large",
            QUEUE,
        ),
    ] = 64 * 1024 * 1024
    manage_concurrency: Annotated[
        Slots, doc("model management calls (pull, create, copy, delete, ...) at once per process; more wait", QUEUE)
    ] = 2
    overload_lag_ms: Annotated[
        Millis, doc("event-loop lag beyond which new requests get 503 router_overloaded; 0: off", QUEUE)
    ] = 1000.0
    connect_timeout: Annotated[Seconds, doc("how long connecting to a backend may take", TIMEOUTS)] = 5.0
    first_byte_timeout: Annotated[
        Seconds,
        doc(
            "cap on the wait for a whole answer or a stream's first chunk (the learned deadline is usually shorter)",
            TIMEOUTS,
        ),
    ] = 300.0
    first_byte_floor: Annotated[Seconds, doc("the learned first-byte deadline is never shorter", TIMEOUTS)] = 10.0
    first_byte_factor: Annotated[
        Annotated[float, Meta(ge=1)],
        doc(
            "learned deadline = max(floor, factor x what the endpoint has shown), capped by first_byte_timeout",
            TIMEOUTS,
        ),
    ] = 4.0
    stream_idle_timeout: Annotated[Seconds, doc("the longest silence between two chunks of a stream", TIMEOUTS)] = 120.0
    max_attempts: Annotated[
        Slots, doc("attempts per request across endpoints (retried only before any byte went out)", FAILURES)
    ] = 3
    retry_budget: Annotated[
        Annotated[float, Meta(ge=0, le=1)],
        doc("retries as a share of requests over a 10 s window (at least 10 retries)", FAILURES),
    ] = 0.2
    resume_streams: Annotated[bool, doc("continue a stream cut mid-way on another endpoint", FAILURES)] = True
    context_overflow: Annotated[
        Literal["off", "trim"],
        doc(
            "a chat a backend refuses for overflowing its context: off passes the error on; trim drops the "
            "oldest turns (never a system message or the last user turn) and asks again",
            FAILURES,
        ),
    ] = "off"
    eject_after: Annotated[Slots, doc("consecutive backend failures that eject an endpoint", FAILURES)] = 3
    eject_backoff: Annotated[Seconds, doc("the first ejection's length; doubles while it keeps failing", FAILURES)] = (
        1.0
    )
    eject_backoff_max: Annotated[Seconds, doc("the longest ejection", FAILURES)] = 30.0
    health_interval: Annotated[Seconds, doc("time between probes of every endpoint", FAILURES)] = 2.0
    health_timeout: Annotated[Seconds, doc("how long a probe may take", FAILURES)] = 2.0
    probe_interval_down: Annotated[
        Seconds, doc("time between probes of ejected or unreachable endpoints", FAILURES)
    ] = 0.25
    routing: Annotated[
        Routing,
        doc(
            "the policy: cache_aware (shared prefixes go where they are cached), least_busy (lowest "
            "in-flight/slots), sglang (SGLang router's thresholds, for comparison)",
            ROUTING,
        ),
    ] = "cache_aware"
    conversation_affinity: Annotated[bool, doc("keep a conversation on the endpoint that holds its cache", ROUTING)] = (
        True
    )
    session_header: Annotated[
        str, Meta(pattern=r"\S"), doc("the request header naming a conversation", ROUTING, expected="a header name")
    ] = "X-Session-ID"
    affinity_ttl: Annotated[Seconds, doc("a conversation's pin lasts this long after its last request", ROUTING)] = (
        600.0
    )
    affinity_max_pins: Annotated[Slots, doc("pins kept at most (the oldest go first)", ROUTING)] = 100_000
    context_routing: Annotated[
        Literal["route", "reject", "off"],
        doc(
            "requests longer than an endpoint's context window (prompt estimated at 4 characters a token, plus "
            "max_tokens/num_predict): route (to an endpoint whose window fits, before affinity and load), reject "
            "(as route; 400 context_length_exceeded when none fits), off",
            ROUTING,
        ),
    ] = "route"
    affinity_wait_ms: Annotated[
        Millis, doc("how long a pinned request may wait for its endpoint before going elsewhere", ROUTING)
    ] = 2000.0
    moe: Annotated[
        MoeConfig,
        doc(
            "the moe- ensemble: a request for moe-<model> gets <model>'s best of several answers",
            ROUTING,
            type="mapping",
            default="samples: 3 (see below)",
        ),
    ] = MoeConfig()
    router_api_key: Annotated[
        Secret,
        doc(
            "one client key (NOMYO's name); every route but / and /health then needs it; ${ENV} expanded; "
            "sha256:<hex> stores only its hash",
            ACCESS,
        ),
    ] = None
    client_keys: Annotated[
        tuple[ClientKey, ...],
        doc(
            "named keys for several clients, with the keys below; each key has one holder",
            ACCESS,
            expected="a list of {name, key, models?, max_concurrent?, priority?, weight?, rpm?, tpm?, "
            "tokens_per_day?} mappings",
        ),
    ] = ()
    admin_key: Annotated[Secret, doc("the key for POST /admin/reload and everyone's /api/usage", ACCESS)] = None
    metrics_key: Annotated[Secret, doc("the operator's key for /metrics and the dashboard's data", ACCESS)] = None
    allowed_origins: Annotated[
        tuple[Name, ...],
        doc(
            "browser origins allowed besides localhost and app schemes; wildcards: https://*.example.com",
            ACCESS,
            expected="a list of origins such as https://chat.example.com (wildcards allowed: https://*.example.com)",
        ),
    ] = ()
    max_connections: Annotated[
        Count, doc("concurrent connections before the router answers 503; 0: no limit", CONNECTIONS)
    ] = 0
    max_header_bytes: Annotated[Bytes, doc("a larger request head gets 431, the connection closed", CONNECTIONS)] = (
        64 * 1024
    )
    header_timeout: Annotated[
        Seconds, doc("how long a request head may take; then 408, the connection closed", CONNECTIONS)
    ] = 10.0
    body_idle_timeout: Annotated[
        Seconds, doc("how long a request body may idle between two pieces; then it is cut", CONNECTIONS)
    ] = 30.0
    state: Annotated[
        str,
        Meta(pattern=r"^(auto|memory|shared)\Z|^(redis|rediss|unix)://"),
        doc(
            "where slots, the queue, pins and health live: auto, memory, shared (workers) or redis://... (instances)",
            STATE,
            expected="'auto', 'memory', 'shared' or a redis:// URL",
        ),
    ] = "auto"
    lease_ttl: Annotated[Seconds, doc("Redis: a dead instance's slots come back after this", STATE)] = 30.0
    redis_timeout: Annotated[
        Seconds, doc("Redis: every call's deadline; a stalled Redis counts as a dead one", STATE)
    ] = 1.0
    access_log: Annotated[
        bool, doc("one access line per request on the nomyo_router.access logger (never prompt text)", OBSERVE)
    ] = False
    log_format: Annotated[
        Literal["text", "json"], doc("the access lines: key=value text or one JSON object", OBSERVE)
    ] = "text"
    usage_db: Annotated[
        Annotated[str, Meta(pattern=r"\S")] | None,
        doc(
            "SQLite file for token accounting (GET /api/usage); null: off; with Redis state, in Redis",
            OBSERVE,
            expected="a file path (e.g. ./nomyo-usage.db) or null to turn token accounting off",
        ),
    ] = "./nomyo-usage.db"
    tracing: Annotated[
        TracingConfig | None,
        doc(
            "OpenTelemetry traces of every proxied request, exported over OTLP/HTTP (never prompt text); null: off",
            OBSERVE,
            expected="a mapping with endpoint?, sample_ratio?, service_name? ({} for the defaults) or null",
            type="mapping or null",
        ),
    ] = None
    cache: Annotated[
        CacheConfig,
        doc(
            "the response cache for requests that opt in: exact, or semantic with similarity < 1",
            CACHE,
            type="mapping",
            default="off (see below)",
        ),
    ] = CacheConfig()
    native_relay: Annotated[
        bool, doc("relay streams through the compiled pump when it is built; read at start", PROCESS)
    ] = True
    shutdown_grace: Annotated[
        SecondsOrOff, doc("how long in-flight streams may take to finish after SIGTERM", PROCESS)
    ] = 30.0
    gc_full_interval: Annotated[
        SecondsOrOff,
        doc(
            "time between full garbage-collector passes while the router runs (doubling while they find little); "
            "0: CPython's own",
            PROCESS,
        ),
    ] = 60.0


# Keys read from the file but not kept: NOMYO's original form, folded into each endpoint.
INPUT_ONLY: dict[str, tuple[str, str, str]] = {  # key: (group, type, meaning)
    "api_keys": (
        BACKENDS,
        "mapping of endpoint URL to key",
        "NOMYO's form: each endpoint's api_key by its URL; ${ENV} expanded",
    ),
}
_RESERVED = {"default", "admin", "metrics"}  # the client names of router_api_key, admin_key, metrics_key
_KEY_SETTINGS = ("router_api_key", "admin_key", "metrics_key")


def _endpoint(i: int, raw: Any, default_slots: int, api_keys: dict[str, Any]) -> dict[str, Any]:
    """One entry of `endpoints`, in either form, as the mapping EndpointConfig is made from:
    the url checked and split from its credentials, the defaults taken from the rest."""
    key = f"endpoints[{i}]"
    if isinstance(raw, str):
        raw = {"url": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a URL or a mapping with 'url', got {a_type(raw)}")
    refuse_unknown(f"{key}.", raw, accepted_keys(EndpointConfig))
    if "url" not in raw:
        raise ConfigError(f"{key}: 'url' is required")
    url, basic_auth = split_userinfo(check_url(f"{key}.url", raw["url"]))
    if basic_auth is not None and raw.get("api_key"):
        raise ConfigError(
            f"{key}: the url carries credentials (user:pass@) and api_key is set too; "
            f"keep one: remove the credentials from the url or drop api_key"
        )
    if url.endswith("/v1"):  # where OpenAI routes live; keep the base URL without it
        url = url[:-3]
    api_key = raw.get("api_key", api_keys.get(url) or api_keys.get(url + "/v1") or api_keys.get(str(raw["url"])))
    if api_key is not None:
        if not isinstance(api_key, str):
            raise ConfigError(f"{key}.api_key: expected a string, got {a_type(api_key)}")
        api_key = expand_env(api_key, f"{key}.api_key") or None
    name = raw.get("name", default_name(url))
    return {
        **raw,
        "url": url,
        "name": name.strip() if isinstance(name, str) else name,
        "api_key": api_key,
        "max_concurrent": raw.get("max_concurrent", default_slots),
        "basic_auth": basic_auth,
    }


def _client_keys(raw: Any) -> list[dict[str, Any]]:
    """`client_keys` as the mappings ClientKey is made from, each key checked and expanded."""
    if not isinstance(raw, list):
        raise ConfigError(
            f"client_keys: expected a list of {{name, key, models?, max_concurrent?}} mappings, got {a_type(raw)}"
        )
    keys = []
    for i, entry in enumerate(raw):
        where = f"client_keys[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{where}: expected a mapping with 'name', 'key' and optional 'models', "
                f"'max_concurrent', got {a_type(entry)}"
            )
        refuse_unknown(f"{where}.", entry, accepted_keys(ClientKey))
        name, models = entry.get("name"), entry.get("models")
        keys.append(
            {
                **entry,
                "name": name.strip() if isinstance(name, str) else name,
                "key": check_key(f"{where}.key", entry.get("key")),
                "models": None if models == [] else models,
            }
        )
    return keys


def parse_config(data: Any, source: str = "config") -> RouterConfig:
    """The configuration from a file's parsed YAML; raises ConfigError naming the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level with an 'endpoints' list")
    refuse_unknown("", data, [*accepted_keys(RouterConfig), *INPUT_ONLY], listed=False)
    fields = specs(RouterConfig)
    # a key given as null takes its default, unless null means something (usage_db: null is off)
    values = {k: v for k, v in data.items() if k in fields and (v is not None or fields[k].optional)}
    api_keys = data.get("api_keys") or {}
    if not isinstance(api_keys, dict):
        raise ConfigError(f"api_keys: expected a mapping of endpoint URL to key, got {a_type(api_keys)}")
    api_keys = {str(k).rstrip("/"): v for k, v in api_keys.items()}
    raw_eps = data.get("endpoints")
    if not isinstance(raw_eps, list) or not raw_eps:
        raise ConfigError("endpoints: expected a non-empty list of URLs or mappings with 'url'")
    slots = values.get("max_concurrent_connections")
    if type(slots) is not int or slots < 1:  # (a bad one is reported as itself, below)
        slots = defaults(RouterConfig)["max_concurrent_connections"]
    values["endpoints"] = [_endpoint(i, raw, slots, api_keys) for i, raw in enumerate(raw_eps)]
    for setting in _KEY_SETTINGS:
        if values.get(setting) is not None:
            values[setting] = check_key(setting, values[setting])
    if "client_keys" in values:
        values["client_keys"] = _client_keys(values["client_keys"])
    try:
        config = msgspec.convert(values, RouterConfig, strict=True)
    except msgspec.ValidationError as e:
        raise explain(e, RouterConfig, values) from None
    names = [e.name for e in config.endpoints]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"endpoints: names must be unique; give each a 'name' ({dupes} repeat)")
    clients = [c.name for c in config.client_keys]
    if _RESERVED & set(clients):
        raise ConfigError(
            "client_keys: the names 'default', 'admin' and 'metrics' are reserved "
            "(router_api_key, admin_key and metrics_key); choose another name"
        )
    if len(set(clients)) != len(clients):
        raise ConfigError("client_keys: names must be unique (they name the client in usage and logs)")
    one_holder_per_key(
        [(s, getattr(config, s)) for s in _KEY_SETTINGS if getattr(config, s) is not None]
        + [(f"client_keys '{c.name}'", c.key) for c in config.client_keys if c.key]
    )
    _check_cache(config)
    return config


def _check_cache(config: RouterConfig) -> None:
    """What the cache's keys mean together: a redis backend needs a server, semantic mode an
    embedding model."""
    cache = config.cache
    if not cache.enabled:
        return
    if cache.backend == "redis" and cache.url is None and not config.state.startswith(("redis", "unix")):
        raise ConfigError(
            "cache.backend: redis needs a server: set cache.url (redis://host:6379/0) or use state: redis://..."
        )
    if cache.similarity < 1.0 and cache.embed_model is None:
        raise ConfigError(
            f"cache.similarity: {cache.similarity:g} turns semantic mode on, which needs "
            "cache.embed_model (an embedding model your endpoints serve)"
        )


def load_config(path: str) -> RouterConfig:
    """The configuration in the YAML file at `path`; raises ConfigError."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found; pass --config PATH or set NOMYO_ROUTER_CONFIG") from None
    except yaml.YAMLError as e:  # (where, not the line's text: the line may hold a key)
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or type(e).__name__}") from None
    return parse_config(data, path)
