"""What a trace holds and where it goes: a request's ids and upstream attempts (`Trace`,
`Attempt`), and the exporter's settings from the config and the OTEL_* environment
(`Settings`). Plain data, shared by the request path's part (tracing.py) and the exporter's
(otlp.py), so neither imports the other for it."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from ..config import TracingConfig
from ..domain import Endpoint
from ..events import RequestRecord

log = logging.getLogger("nomyo_router.tracing")

DEFAULT_ENDPOINT = "http://localhost:4318"  # the OTLP/HTTP port on the local host (the OTel default)
DEFAULT_SERVICE = "nomyo-router"


HEAD = 512  # bytes of an answer kept for its id (the first key of an OpenAI or Anthropic answer)
TAIL = 4096  # bytes of its end kept for its finish reasons (and a stream's id, in every chunk)
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')
_REASON = re.compile(rb'"(?:finish_reason|done_reason|stop_reason)"\s*:\s*"([^"\\]{1,64})"')


class Trace:
    """One request's trace: its ids, what it asked for (the GenAI request parameters, read
    from its body when sampled), its upstream attempts and the ends of its answer."""

    __slots__ = (
        "trace_id",
        "span_id",
        "parent_id",
        "sampled",
        "operation",
        "key",
        "t0",
        "attempts",
        "params",
        "head",
        "tail",
    )

    def __init__(
        self, trace_id: int, span_id: int, parent_id: int, sampled: bool, operation: str, key: str, t0: float
    ) -> None:
        self.trace_id, self.span_id, self.parent_id, self.sampled = trace_id, span_id, parent_id, sampled
        self.operation, self.key, self.t0 = operation, key, t0
        self.attempts: list[Attempt] = []
        self.params: tuple[int | None, float | None, float | None] = (None, None, None)
        self.head = self.tail = b""

    def answered(self, tail: bytes) -> None:
        """The request path hands over the end of the answer (all of one sent whole); kept, not
        read: the exporter's thread reads it (`answer_facts`)."""
        if self.sampled:
            self.head, self.tail = tail[:HEAD], tail[-TAIL:]


def request_params(body: dict[str, Any]) -> tuple[int | None, float | None, float | None]:
    """(max_tokens, temperature, top_p) as the client asked, in any of the APIs' shapes:
    OpenAI's `max_tokens` / `max_completion_tokens` / the Responses API's
    `max_output_tokens`, Anthropic's `max_tokens`, Ollama's `options.num_predict`; None
    where it asked nothing (or sent something that is not a number)."""
    options = body.get("options")
    opts: dict[str, Any] = options if isinstance(options, dict) else {}
    limit = body.get("max_tokens", body.get("max_completion_tokens", body.get("max_output_tokens")))
    if limit is None:
        limit = opts.get("num_predict")
    temperature = body.get("temperature", opts.get("temperature"))
    top_p = body.get("top_p", opts.get("top_p"))
    return (
        limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
        _number(temperature),
        _number(top_p),
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def answer_facts(head: bytes, tail: bytes) -> tuple[str | None, list[str]]:
    """(the answer's id, its finish reasons, one per choice) from its first and last bytes,
    found as the token counts are (token_counts.py), without parsing the answer: the first
    `"id"` (an OpenAI or Anthropic answer's own, before any tool call's; in a stream, every
    chunk's), else the last one in the tail; every `finish_reason` (OpenAI), `done_reason`
    (Ollama) or `stop_reason` (Anthropic) that holds a string. Ollama's answers have no id."""
    m = _ID.search(head)
    if m is None:
        ids = _ID.findall(tail)
        rid = ids[-1] if ids else None
    else:
        rid = m.group(1)
    reasons = [r.decode("ascii", "replace") for r in _REASON.findall(tail)]
    return (rid.decode("ascii", "replace") if rid is not None else None), reasons


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
