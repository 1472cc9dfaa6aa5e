"""What a trace holds and where it goes: a request's ids and upstream attempts (`Trace`,
`Attempt`), and the exporter's settings from the config and the OTEL_* environment
(`Settings`). Plain data, shared by the request path's part (tracing.py) and the exporter's
(otlp.py), so neither imports the other for it."""

from __future__ import annotations

import logging
import os

from ..config import TracingConfig
from ..domain import Endpoint
from ..events import RequestRecord

log = logging.getLogger("nomyo_router.tracing")

DEFAULT_ENDPOINT = "http://localhost:4318"  # the OTLP/HTTP port on the local host (the OTel default)
DEFAULT_SERVICE = "nomyo-router"


class Trace:
    """One request's trace: its ids and its upstream attempts."""

    __slots__ = ("trace_id", "span_id", "parent_id", "sampled", "operation", "key", "t0", "attempts")

    def __init__(
        self, trace_id: int, span_id: int, parent_id: int, sampled: bool, operation: str, key: str, t0: float
    ) -> None:
        self.trace_id, self.span_id, self.parent_id, self.sampled = trace_id, span_id, parent_id, sampled
        self.operation, self.key, self.t0 = operation, key, t0
        self.attempts: list[Attempt] = []


# What a finished request held for the exporter costs in memory: the record with its trace
# (measured with tracemalloc: ~850 bytes with one attempt and short names), more per further
# attempt, plus the strings a client or the config chose, counted at their length.
RECORD_BYTES = 768
ATTEMPT_BYTES = 192


def pending_bytes(rec: RequestRecord, trace: Trace) -> int:
    """The bytes `rec` holds while it waits for the exporter (an estimate that counts every
    string of any length, so a client's long model name costs what it weighs)."""
    return (
        RECORD_BYTES
        + ATTEMPT_BYTES * len(trace.attempts)
        + len(rec.model)
        + len(rec.route)
        + len(rec.request_id)
        + len(rec.client or "")
        + len(rec.error or "")
        + len(trace.key)
    )


class Attempt:
    """One upstream call of a traced request: its span, where it went, when, and how it ended
    (`end` 0.0: still open; `status` 0: no answer; `error`: the exception's type)."""

    __slots__ = ("span_id", "endpoint", "start", "end", "status", "error")

    def __init__(self, span_id: int, endpoint: Endpoint, start: float) -> None:
        self.span_id, self.endpoint, self.start = span_id, endpoint, start
        self.end, self.status, self.error = 0.0, 0, ""


class Settings:
    """`tracing` with the OTEL_* environment filling what the file leaves out."""

    def __init__(self, cfg: TracingConfig, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        signal = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()  # the full URL, used as is
        base = cfg.endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_ENDPOINT
        self.url = signal if signal and not cfg.endpoint else base.rstrip("/") + "/v1/traces"
        self.service_name = cfg.service_name or env.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE
        ratio = cfg.sample_ratio
        if ratio is None:
            try:
                ratio = min(1.0, max(0.0, float(env.get("OTEL_TRACES_SAMPLER_ARG", "1"))))
            except ValueError:
                log.warning("OTEL_TRACES_SAMPLER_ARG is not a number; sampling every request")
                ratio = 1.0
        self.sample_ratio = ratio
        self.max_pending_bytes = cfg.max_pending_bytes
        self.headers = _headers(
            env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS", "")
        )


def _headers(text: str) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS: `key=value,key2=value2`, values percent-encoded."""
    from urllib.parse import unquote

    out = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if eq and key.strip():
            out[key.strip()] = unquote(value.strip())
    return out
