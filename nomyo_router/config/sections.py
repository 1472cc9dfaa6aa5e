"""The feature sections: the `tracing`, `cache` and `moe` mappings, each a struct of its own
keys, read at start."""

from typing import Annotated, Literal

from msgspec import Meta

from .declare import SENTINEL_URL, Bytes, ConfigStruct, Name, Seconds, Slots, doc

__all__ = ["BatchConfig", "CacheConfig", "MoeConfig", "TracingConfig"]


class TracingConfig(ConfigStruct, frozen=True, forbid_unknown_fields=True, kw_only=True):
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
    max_pending_bytes: Annotated[
        Bytes,
        doc(
            "memory: the bytes of finished requests a worker holds for the exporter while the "
            "collector is slow or away; past it new requests' traces are dropped, counted in "
            'nomyo_router_events_total{what="traces_dropped"} and in the warning'
        ),
    ] = 16 * 1024 * 1024


class CacheConfig(ConfigStruct, frozen=True, forbid_unknown_fields=True, kw_only=True):
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
            "sqlite: the database file (created 0600: it holds prompts' answers); one that cannot be "
            "opened stops the start with its path and the reason (never moved aside)",
            expected="a file path such as ./nomyo-cache.db",
        ),
    ] = "./nomyo-cache.db"
    url: Annotated[
        Annotated[str, Meta(pattern=r"^(redis|rediss|unix)://|" + SENTINEL_URL)] | None,
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
            "similar (cosine) answers, when the rest of the request is the same exactly (0.95 keeps most "
            "negated questions apart, none keeps all)"
        ),
    ] = 1.0
    embed_model: Annotated[
        Name | None,
        doc(
            "semantic mode: the embedding model, served by this router's own endpoints",
            default="none (required when similarity < 1)",
        ),
    ] = None


class MoeConfig(ConfigStruct, frozen=True, forbid_unknown_fields=True, kw_only=True):
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


class BatchConfig(ConfigStruct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The OpenAI Batch API (`/v1/files`, `/v1/batches`): the `batch` mapping. A batch's lines
    run only in capacity interactive requests leave free; see docs/batches.md. Read at start."""

    enabled: Annotated[bool, doc("serve /v1/files and /v1/batches and run batches' lines")] = False
    path: Annotated[
        Annotated[str, Meta(pattern=r"\S")],
        doc(
            "the SQLite file that keeps files, batches and their lines (created 0600: it holds prompts and "
            "answers); with state: redis:// they are kept in Redis instead",
            expected="a file path such as ./nomyo-batch.db",
        ),
    ] = "./nomyo-batch.db"
    max_share: Annotated[
        Annotated[float, Meta(gt=0, le=1)],
        doc("the share of any endpoint's slots that batch lines may hold at once (at least one slot)"),
    ] = 0.5
    interactive_window: Annotated[
        Seconds,
        doc(
            "batch lines leave free as many of an endpoint's slots as interactive requests held at once "
            "within this many seconds, so that traffic never waits behind a line; a longer window protects "
            "bursts better, a shorter one gives batches the slots back sooner"
        ),
    ] = 10.0
    max_file_bytes: Annotated[Bytes, doc("a larger upload is refused with 413")] = 100 * 1024 * 1024
    max_lines: Annotated[Slots, doc("lines one input file may have at most")] = 50_000
    retention: Annotated[Seconds, doc("how long files and finished batches are kept")] = 30 * 86400.0
    claim_timeout: Annotated[
        Seconds,
        doc(
            "a line whose runner stopped renewing its claim this long ago (a killed process) is run again; "
            "its runner renews it every third of this"
        ),
    ] = 30.0
    poll_interval: Annotated[Seconds, doc("how often an idle runner looks for lines and free slots")] = 0.2
