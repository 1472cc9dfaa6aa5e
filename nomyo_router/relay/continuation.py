"""Mid-stream resumption: a stream the backend cut after content went out is continued on
another endpoint, and the client sees one uninterrupted stream.

While a pass-through stream is relayed, whole records only are sent on (an NDJSON line, an
SSE event), and the bytes sent are kept, compressed beyond the last KiB (`Sent`; parsed only
if the stream breaks: the hot path pays an `rfind` and an append per chunk). On a break, the text so far
is recovered from those bytes and the request is sent again with it as a trailing partial
assistant message, which chat templates continue (Ollama's do; for OpenAI-type servers the
router also sends vLLM's `continue_final_message: true, add_generation_prompt: false`,
which llama.cpp's server understands as assistant prefill). The token limit is reduced by
what was produced. The continuation is relayed with its seam mended: no second role chunk,
one final `done` / `[DONE]`, completion counts summed.

What is resumed: chat on both APIs (pass-through); `/api/generate` only with `raw: true`
(then the partial answer is appended to the prompt) and `/v1/completions` (prompt plus
partial answer). Everything else ends with an error chunk in its own format, as before.

Here are the mechanics: what can be resumed, the bytes kept (`Sent`), the text recovered
(`produced`), the continuing request (`continuation`) and the mended seam (`Continuation`). The
record-wise relay is `relay.relay_records`; the flow that continues a cut stream on another
endpoint is `resumable.py`.

The backend's error record inside the stream (error_record.py: a crashed model runner) is a
cut at that record: it is not sent, and the stream is continued elsewhere like any cut, or,
when it cannot be, the record is what the client gets last. A broken stream's endpoint gets
its slot back at once (the lease passed in, or a continuation's), not when the stream ends.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from ..backends import stream_lines


def resumable(api: str, kind: str, body: dict[str, Any]) -> bool:
    if api == "anthropic":
        return False  # its event stream is not continued (an error event ends it)
    if kind == "chat":
        return isinstance(body.get("messages"), list)
    if kind == "generate":
        return isinstance(body.get("prompt"), str) and (api == "openai" or body.get("raw") is True)
    return False


def record_end(sse: bool) -> bytes:
    return b"\n\n" if sse else b"\n"


def _records(raw: bytes, sse: bool) -> list[dict[str, Any]]:
    return [obj for obj in (stream_lines.parse(line, sse) for line in raw.split(b"\n")) if obj is not None]


def _piece(api: str, kind: str, obj: dict[str, Any]) -> str:
    if api == "ollama":
        if kind == "chat":
            msg = obj.get("message")
            return msg.get("content") or "" if isinstance(msg, dict) else ""
        return obj.get("response") or ""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    if kind == "chat":
        delta = choices[0].get("delta")
        return delta.get("content") or "" if isinstance(delta, dict) else ""
    return choices[0].get("text") or ""


class Sent:
    """The bytes the client received, kept for a resumption: all but the last KiB compressed
    (raw deflate, level 1) in blocks of a few KiB — an NDJSON or SSE stream compresses about
    10×, so a long stream costs little memory per open connection, for under 1 µs
    of CPU per relayed record. The records received are counted (`records`), the count when
    the backend's is missing: the line ends of the bytes are counted once, when they leave the
    raw tail (one `bytes.count` of a byte per few KiB, not one per piece; an SSE event, one
    `data:` line and a blank one, ends two lines)."""

    __slots__ = ("blocks", "tail", "whole", "sep", "counted", "_lines")
    BLOCK = 3072  # compress once this much is pending
    KEEP = 1024  # the last bytes stay raw (the final record's counts are read from there)
    LAST = 640  # without resumption only this much is kept (a final record is ~400 B)

    def __init__(self, whole: bool = True, sep: bytes = b"\n") -> None:
        self.blocks: list[bytes] = []
        self.tail = bytearray()
        self.whole = whole  # False: only the tail is kept (no resumption possible)
        self.sep = sep
        self.counted = 0  # the tail's first bytes whose line ends are counted in _lines
        self._lines = 0

    def add(self, data: bytes) -> None:
        tail = self.tail
        tail += data
        if not self.whole:  # only the final record matters (its counts): cut now and then
            if len(tail) > 2 * self.LAST:
                self._lines += tail.count(b"\n", self.counted)
                self.tail = tail[-self.LAST :]
                self.counted = self.LAST
            return
        if len(tail) > self.BLOCK:
            self._lines += tail.count(b"\n", self.counted)
            cut = len(tail) - self.KEEP
            self.blocks.append(zlib.compress(tail[:cut], 1, -15))
            self.tail = tail[cut:]  # a new small buffer: `del` would keep the large one
            self.counted = self.KEEP

    @property
    def records(self) -> int:
        """Records received so far (NDJSON lines; SSE events: two lines each)."""
        return (self._lines + self.tail.count(b"\n", self.counted)) // len(self.sep)

    def last(self) -> bytes:
        return bytes(self.tail if self.whole else self.tail[-self.LAST :])

    def all(self) -> bytes:
        return b"".join(zlib.decompress(b, -15) for b in self.blocks) + bytes(self.tail)


def produced(api: str, kind: str, sent: bytes) -> tuple[str, int]:
    """(text so far, content chunks ≈ tokens) recovered from the bytes the client received."""
    parts = [p for p in (_piece(api, kind, o) for o in _records(sent, api == "openai")) if p]
    return "".join(parts), len(parts)


def continuation(api: str, kind: str, body: dict[str, Any], text: str, tokens: int) -> bytes:
    """The request that continues `body`'s answer after `text` (`tokens` already produced)."""
    out = dict(body)
    if kind == "chat":
        out["messages"] = [*body["messages"], {"role": "assistant", "content": text}]
        if api == "openai":
            out["continue_final_message"] = True
            out["add_generation_prompt"] = False
    else:
        out["prompt"] = body["prompt"] + text
    if api == "ollama":
        options = dict(body.get("options") or {})
        limit = options.get("num_predict")
        if isinstance(limit, int) and limit >= 0:
            options["num_predict"] = max(limit - tokens, 1)
            out["options"] = options
    else:
        for key in ("max_tokens", "max_completion_tokens"):
            limit = body.get(key)
            if isinstance(limit, int) and limit >= 0:
                out[key] = max(limit - tokens, 1)
    return json.dumps(out).encode()


class Continuation:
    """Rewrites a continuation's records so they read as the rest of the first stream."""

    def __init__(self, api: str, tokens: int) -> None:
        self.sse = api == "openai"
        self.tokens = tokens  # already produced: added to the final counts

    def record(self, rec: bytes) -> bytes:
        """One whole record (an NDJSON line or an SSE event) → what to send (maybe nothing)."""
        if self.sse:
            obj = stream_lines.parse(rec, sse=True)
            if obj is None:
                return rec
            choices = obj.get("choices") or []
            if choices and isinstance(choices[0], dict):
                delta = choices[0].get("delta")
                if (
                    isinstance(delta, dict)
                    and "role" in delta
                    and not delta.get("content")
                    and not delta.get("tool_calls")
                    and choices[0].get("finish_reason") is None
                ):
                    return b""  # the continuation's own opening: the client had one already
            usage = obj.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                usage["completion_tokens"] += self.tokens
                if isinstance(usage.get("total_tokens"), int):
                    usage["total_tokens"] += self.tokens
                return b"data: " + json.dumps(obj).encode() + b"\n\n"
            return rec
        if b'"done":true' not in rec and b'"done": true' not in rec:
            return rec
        obj = stream_lines.parse(rec)
        if obj is None:
            return rec
        if isinstance(obj.get("eval_count"), int):
            obj["eval_count"] += self.tokens
        return json.dumps(obj).encode() + b"\n"
