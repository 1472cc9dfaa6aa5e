"""The file's top-level keys: RouterConfig, grouped as the reference shows them, and the
keys read from the file but not kept."""

import typing
from typing import Annotated, Literal

from msgspec import Meta

from .backends import EndpointConfig
from .clients import ClientKey
from .declare import (
    SENTINEL_URL,
    Bytes,
    ConfigStruct,
    Count,
    Millis,
    Name,
    Seconds,
    SecondsOrOff,
    Secret,
    Slots,
    doc,
)
from .sections import BatchConfig, CacheConfig, MoeConfig, TracingConfig

__all__ = ["INPUT_ONLY", "ROUTING_POLICIES", "RouterConfig", "Routing"]

Routing = Literal["cache_aware", "least_busy", "sglang"]  # routing/policies POLICIES
ROUTING_POLICIES: tuple[str, ...] = typing.get_args(Routing)

# the reference's sections: each key names its own in doc(); they come in the keys' order
BACKENDS, QUEUE, TIMEOUTS, FAILURES = "Backends", "Queueing and limits", "Timeouts", "Failures and retries"
ROUTING, ACCESS, CONNECTIONS = "Routing and conversation affinity", "Access: keys and origins", "Connections"
STATE, OBSERVE, PROCESS = "State: workers and instances", "Logs and accounting", "Process"
CACHE = "Response cache"
BATCH = "Batches"


class RouterConfig(ConfigStruct, frozen=True, forbid_unknown_fields=True, kw_only=True):
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
    max_queued_body_bytes: Annotated[
        Bytes,
        doc(
            "request bodies held by requests waiting for a slot, summed, per process; past it a request gets 503 "
            "queue_full before its body is read (or once read, without a content-length)",
            QUEUE,
        ),
    ] = 128 * 1024 * 1024
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
            "cap on the wait for a stream's first chunk or a whole answer (the learned deadline is usually shorter)",
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
    stream_idle_timeout: Annotated[
        Seconds,
        doc(
            "the longest silence between two chunks of a stream (longer: the backend is wedged; "
            "a whole answer is streamed from the backend unless its deadline fits under this)",
            TIMEOUTS,
        ),
    ] = 60.0
    stream_whole_answers: Annotated[
        bool,
        doc(
            "ask backends for a stream of a whole chat or completion answer and assemble it, so it is judged "
            "by its first token and the gap between chunks (false: asked whole, with the learned deadline)",
            TIMEOUTS,
        ),
    ] = True
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
            "one client key (NOMYO's name); every route but /, /health and the probes then needs it; ${ENV} expanded; "
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
    allowed_hosts: Annotated[
        tuple[Name, ...],
        doc(
            "with no client key configured, Host names accepted besides IP addresses, localhost, *.localhost, "
            "*.local, *.internal and this machine's name (others get 421); wildcards: *.example.com",
            ACCESS,
            expected="a list of host names such as llm.example.com (wildcards allowed: *.example.com)",
        ),
    ] = ()
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
    body_timeout: Annotated[
        Seconds,
        doc(
            "how long a whole request body may take to arrive; then 408, the connection closed (blob uploads: "
            "body_idle_timeout only)",
            CONNECTIONS,
        ),
    ] = 60.0
    state: Annotated[
        str,
        Meta(pattern=r"^(auto|memory|shared)\Z|^(redis|rediss|unix)://|" + SENTINEL_URL),
        doc(
            "where slots, the queue, pins and health live: auto, memory, shared (workers) or redis://... (instances;"
            " rediss:// for TLS, redis+sentinel://host:26379,host:26379/service for Sentinel); ${ENV} expanded",
            STATE,
            expected="'auto', 'memory', 'shared', a redis:// URL or redis+sentinel://host:port[,host:port]/service",
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
        Literal["text", "json"],
        doc(
            "every log line: text, or one JSON object (time, level, logger, message; an access line's fields)",
            OBSERVE,
        ),
    ] = "text"
    usage_db: Annotated[
        Annotated[str, Meta(pattern=r"\S")] | None,
        doc(
            "SQLite file for token accounting (GET /api/usage); with Redis state, kept in Redis instead; "
            "null: off, nothing written anywhere",
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
    batch: Annotated[
        BatchConfig,
        doc(
            "the OpenAI Batch API: files and batches kept durably, their lines run only on idle slots",
            BATCH,
            type="mapping",
            default="off (see below)",
        ),
    ] = BatchConfig()
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
    idle_spin_us: Annotated[
        Annotated[float, Meta(ge=0, le=5000, extra={"unit": "µs"})],
        doc(
            "how long the event loop keeps polling, instead of sleeping, after a request is read or answered, "
            "while requests come that close together (CPU traded for latency at low load); 0: off",
            PROCESS,
        ),
    ] = 200.0


# Keys read from the file but not kept: NOMYO's original form, folded into each endpoint.
INPUT_ONLY: dict[str, tuple[str, str, str]] = {  # key: (group, type, meaning)
    "api_keys": (
        BACKENDS,
        "mapping of endpoint URL to key",
        "NOMYO's form: each endpoint's api_key by its URL; ${ENV} expanded",
    ),
}
