"""A backend's failure said inside a 200 answer: an error record in a stream, or an error
object as a whole answer.

When Ollama's model runner crashes mid-stream, Ollama has already sent its 200 head, so it
says so in the stream: a record `{"error":"llama runner process has terminated: ..."}` and
the stream's end. OpenAI-compatible servers do the same with `data: {"error": {...}}` (vLLM
then still sends `data: [DONE]`). Relayed as it came, the client's answer is broken under a
200 and the router counted a success. So such a record is the stream cut at that point:
resumed on another endpoint when the stream can be (continuation.py; the continuation starts from
the text already sent, the record itself is never sent), else relayed to the client; either
way the endpoint's failure (health, ejection, `nomyo_router_events_total{what="error_record"}`),
and, when the client gets it, a failed request (`ended`). A whole 200 answer that is an error
object is a failure before any byte went out: retried elsewhere like a 5xx (proxy.py).

Finding it costs the hot path one C-speed search per read: the relays look for the bytes
`"error"` in what a read brought (`marked`; a quote inside a JSON string is escaped, so text
that merely says "error" does not match), and only when they are there is the record around
them parsed (`find`). `marked` is glibc's `memmem` from the compiled module: ~50 ns for a
125-byte read, ~200 ns for 1 KiB, where `bytes.find` took ~130 and ~630 ns (its loop stops at
every quote, and JSON is full of them). The compiled pump (`_pump.c`) runs the same search
over the records it is about to write, and asks `find` (through `CHECKS`) only when it trips.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..domain import Endpoint
from ..events import Events, RequestRecord
from ..h1.errors import ErrorRecord

if TYPE_CHECKING:
    from ..backends.health import Health

MARK = b'"error"'

try:
    from ._pump import marked as marked
except ImportError:  # built without a C compiler

    def marked(data: bytes, /) -> bool:
        return data.find(MARK) >= 0


EVENT = "error_record"  # nomyo_router_events_total{what=...}: per endpoint, its error records


def failed(obj: object) -> bool:
    """A parsed record or answer that is an error: `{"error": <something>}` (Ollama, OpenAI,
    vLLM, Anthropic's error event), vLLM's older `{"object": "error", ...}`, or an event of
    type "error" (the Responses API's)."""
    return isinstance(obj, dict) and (
        bool(obj.get("error")) or obj.get("object") == "error" or obj.get("type") == "error"
    )


def is_error(record: bytes) -> bool:
    """One whole record (an NDJSON line, or an SSE event of one or more lines) is an error."""
    for line in record.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].lstrip()
        if line.startswith(b"{") and MARK in line:
            try:
                if failed(json.loads(line)):
                    return True
            except ValueError:
                pass
    return False


def find(data: bytes, sep: bytes) -> tuple[int, int]:
    """(start, end) of the first whole error record in `data`, whose records end with `sep`;
    (-1, -1) when there is none (a record not ended yet in `data` is not looked at)."""
    at = data.find(MARK)
    while at >= 0:
        start = data.rfind(sep, 0, at)
        start = 0 if start < 0 else start + len(sep)
        end = data.find(sep, at)
        if end < 0:
            break
        end += len(sep)
        if is_error(data[start:end]):
            return start, end
        at = data.find(MARK, end)
    return -1, -1


class Check:
    """The compiled pump's question (`_pump.c`), asked only when `"error"` is in the records it
    is about to write: where the first error record among them starts (-1: none)."""

    __slots__ = ("sep",)

    def __init__(self, sep: bytes) -> None:
        self.sep = sep

    def __call__(self, data: bytes) -> int:
        return find(data, self.sep)[0]


CHECKS = {b"\n": Check(b"\n"), b"\n\n": Check(b"\n\n")}


def whole(data: bytes) -> bool:
    """A whole answer that is an error object. Its key comes first (`{"error": ...}`, or
    vLLM's `{"object": "error"`), so only the first bytes are searched; a real answer is parsed
    only when they hold `"error"`."""
    if data.find(MARK, 0, 64) < 0:
        return False
    try:
        return failed(json.loads(data))
    except ValueError:
        return False


def blame(health: Health, events: Events, ep: Endpoint, model: str, cut: BaseException | bool | None) -> None:
    """The endpoint's failure for a stream it broke: cut, or ended by an error record."""
    if isinstance(cut, ErrorRecord):
        events.count(EVENT, ep.name, model)
        health.failure(ep, f"an error record in its stream: {cut}")
    elif isinstance(cut, TimeoutError):
        health.failure(ep, "silent mid-stream for longer than stream_idle_timeout (wedged?)")
    else:
        health.failure(ep, "stream cut by the backend")


def ended(rec: RequestRecord, cut: BaseException | bool) -> None:
    """Record how a broken stream ended for its client (`rec`: the RequestRecord).

    A record's `status` is what the client got. Here a 200 head went out, and then the
    backend's error record, relayed because no other endpoint could continue the stream: the
    client has a failed answer, not a success. So the status recorded is 502 (a bad answer from
    the upstream) with the error `backend_error_record`, which `nomyo_router_requests_total`,
    the access log and the usage store read: counting the 200 of the head would report a
    crashed model runner as a success, which is what this module exists to stop."""
    rec.error = getattr(cut, "code", "stream_stalled" if isinstance(cut, TimeoutError) else "stream_cut")
    if isinstance(cut, ErrorRecord):
        rec.status = 502
