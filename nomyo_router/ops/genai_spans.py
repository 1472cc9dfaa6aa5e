"""The GenAI semantic conventions in full on the exporter's spans: what `otlp.Exporter` writes
(operation, request and response model, token counts, server address) completed with what
the router knows besides, on the exporter's thread, never on the request path.

- `gen_ai.provider.name`: the flavour of API the backend speaks, from the endpoint's type:
  `openai` for OpenAI-compatible servers (the conventions' own value, which they say to use
  for any server reached through the OpenAI API: vLLM, llama.cpp, SGLang, ...); `ollama`
  for Ollama (the registry has no value for it; the attribute is an open enumeration).
  The SERVER span has the last attempt's, each CLIENT span its own endpoint's.
- `gen_ai.request.max_tokens`, `gen_ai.request.temperature`, `gen_ai.request.top_p`: what
  the client asked, in whichever API's shape (`trace_data.request_params`).
- `gen_ai.response.id`, `gen_ai.response.finish_reasons`: read from the answer's first and
  last bytes (`trace_data.answer_facts`), on the SERVER span and the attempt that answered.
- `nomyo.tokens_from`: whose the token counts are, `backend` (its usage) or `relayed`
  (counted by the router from what it relayed), when the record says.
- `error.type`: the error's class. A refusal the router's code names keeps its code
  (`queue_full`, `context_length_exceeded`, ...); an error that has none carries its HTTP
  status (`404`), as the HTTP conventions say, never a bare `error`.
"""

from __future__ import annotations

from typing import Any, cast

from ..events import RequestRecord
from .otlp import CLIENT, Exporter
from .trace_data import Trace, answer_facts

PROVIDERS = {"openai": "openai", "ollama": "ollama"}  # the endpoint's type -> gen_ai.provider.name
UNNAMED = "error"  # what a record says of an error without a code of its own (relay/exchange.py)


class GenAIExporter(Exporter):
    """`otlp.Exporter`, each request's spans completed by `complete`."""

    def _spans(self, rec: RequestRecord, spans: Any) -> None:
        first = len(spans)
        super()._spans(rec, spans)
        complete(rec, spans[first:])


def complete(rec: RequestRecord, spans: Any) -> None:
    """Add the attributes above to one request's spans (its SERVER span first, then its
    queue span if it waited, and a CLIENT span per attempt in order)."""
    trace = cast(Trace, rec.trace)
    server = spans[0]
    clients = [s for s in spans if s.kind == CLIENT]
    rid, reasons = answer_facts(trace.head, trace.tail)
    attempts = trace.attempts
    if attempts:
        _provider(server.attributes, attempts[-1].endpoint.type)
    _request(server.attributes, trace.params)
    _response(server.attributes, rid, reasons)
    _error_class(server.attributes, rec.status)
    if rec.tokens_from is not None:  # whose counts gen_ai.usage.* are
        server.attributes.add(key="nomyo.tokens_from").value.string_value = rec.tokens_from
    for i, (span, attempt) in enumerate(zip(clients, attempts, strict=False)):
        a = span.attributes
        _provider(a, attempt.endpoint.type)
        _request(a, trace.params)
        if i == len(attempts) - 1 and not span.status.code:  # the attempt that answered
            _response(a, rid, reasons)


def _provider(attrs: Any, endpoint_type: str | None) -> None:
    name = PROVIDERS.get(endpoint_type or "")
    if name is not None:
        attrs.add(key="gen_ai.provider.name").value.string_value = name


def _request(attrs: Any, params: tuple[int | None, float | None, float | None]) -> None:
    max_tokens, temperature, top_p = params
    if max_tokens is not None:
        attrs.add(key="gen_ai.request.max_tokens").value.int_value = max_tokens
    if temperature is not None:
        attrs.add(key="gen_ai.request.temperature").value.double_value = temperature
    if top_p is not None:
        attrs.add(key="gen_ai.request.top_p").value.double_value = top_p


def _response(attrs: Any, rid: str | None, reasons: list[str]) -> None:
    if rid is not None:
        attrs.add(key="gen_ai.response.id").value.string_value = rid
    if reasons:
        values = attrs.add(key="gen_ai.response.finish_reasons").value.array_value.values
        for reason in reasons:
            values.add().string_value = reason


def _error_class(attrs: Any, status: int) -> None:
    """An `error.type` of a bare `error` becomes the HTTP status the client got."""
    for kv in attrs:
        if kv.key == "error.type" and kv.value.string_value == UNNAMED:
            kv.value.string_value = str(status)
