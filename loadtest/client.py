"""Send one request and time it: latency, TTFT at the first non-empty content, inter-token gaps.

Requests go out as pre-built bytes on keep-alive connections (loadtest.http); the only
work on the hot path is what is measured: splitting chunks and finding their content.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from .http import Client, ResponseHandler


@dataclass
class Result:
    start: float  # the intended send time (open loop) or the actual one (closed loop)
    end: float = 0.0
    status: int | None = None
    error: str | None = None  # None when ok; else http_503, timeout, connection, protocol
    ttft: float | None = None
    out_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    endpoint: str | None = None
    overhead_ms: float | None = None
    affinity: str | None = None
    answer: str = ""
    turn: int = 0
    send_lag: float = 0.0  # actual send - intended send
    session: str | None = None  # the conversation or agent session it belongs to
    prompt_est: int = 0  # prompt tokens as the load tester counts them (4 characters each)
    # what the backend reported of the prompt: OpenAI usage.prompt_tokens and its
    # prompt_tokens_details.cached_tokens; Ollama's prompt_eval_count (tokens it evaluated)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_eval: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency(self) -> float:
        return self.end - self.start


# The fast path: most stream chunks only need "is there content?" to be timed. A chunk
# that may end the stream, carry usage or report an error is parsed in full.
_CONTENT = re.compile(rb'"(?:content|response|text)"\s*:\s*"(.)')
_NEEDS_PARSE = re.compile(rb'"done"\s*:\s*true|"usage"|"error"|\[DONE\]|"finish_reason"\s*:\s*"')


def _has_content(line: bytes) -> bool | None:
    """True/False when a plain content chunk says so cheaply; None when it must be parsed."""
    if _NEEDS_PARSE.search(line):
        return None
    m = _CONTENT.search(line)
    if m is None:
        return False if line.startswith(b"data:") or line.startswith(b"{") else None
    return m.group(1) != b'"'


def prompt_usage(r: Result, api: str, d: Any) -> None:
    """What a final chunk or whole answer says of the prompt: Ollama's prompt_eval_count,
    OpenAI's usage.prompt_tokens and prompt_tokens_details.cached_tokens."""
    if not isinstance(d, dict):
        return
    if api == "ollama":
        v = d.get("prompt_eval_count")
        r.prompt_eval = v if isinstance(v, int) else r.prompt_eval
        return
    usage = d.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            r.prompt_tokens = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            r.cached_tokens = details["cached_tokens"]


def _content(api: str, line: bytes, r: Result | None = None) -> tuple[str, int | None, bool]:
    """(text, output token count if the chunk carries usage, stream finished?) of one chunk;
    a chunk with usage also fills `r`'s prompt figures."""
    if api == "ollama":
        d = json.loads(line)
        if "error" in d:
            raise ProtocolError(str(d["error"]))
        text = (d.get("message") or {}).get("content") or d.get("response") or ""
        if d.get("done") and r is not None:
            prompt_usage(r, api, d)
        return text, d.get("eval_count") if d.get("done") else None, bool(d.get("done"))
    if not line.startswith(b"data:"):
        return "", None, False
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return "", None, True
    d = json.loads(payload)
    if "error" in d:
        raise ProtocolError(str(d["error"]))
    usage = d.get("usage")
    count = usage.get("completion_tokens") if usage else None
    if usage and r is not None:
        prompt_usage(r, api, d)
    choices = d.get("choices") or []
    if not choices:
        return "", count, False
    c = choices[0]
    text = (c.get("delta") or {}).get("content") or c.get("text") or ""
    return text, count, False


class ProtocolError(Exception):
    pass


def _whole_answer(api: str, endpoint: str, data: Any) -> tuple[str, int]:
    if endpoint == "embed":
        return "", 0
    if api == "ollama":
        text = (data.get("message") or {}).get("content") or data.get("response") or ""
        return text, int(data.get("eval_count") or 0)
    choice = (data.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
    return text, int((data.get("usage") or {}).get("completion_tokens") or 0)


class _Measure(ResponseHandler):
    """Times one response as its bytes arrive: TTFT at the first non-empty content."""

    def __init__(self, r: Result, api: str, streaming: bool, keep_answer: bool) -> None:
        self.r, self.api, self.streaming, self.keep_answer = r, api, streaming, keep_answer
        self.buf = b""
        self.body: list[bytes] = []
        self.chunks_at: list[float] = []
        self.parts: list[str] = []
        self.count: int | None = None
        self.finished = False
        self.received = False
        self.bad: str | None = None

    def on_status(self, status: int) -> None:
        self.r.status = status

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n.startswith(b"x-router-"):
            if n == b"x-router-endpoint":
                self.r.endpoint = value.decode()
            elif n == b"x-router-overhead-ms":
                self.r.overhead_ms = float(value)
            elif n == b"x-router-affinity":
                self.r.affinity = value.decode()

    def on_body(self, data: bytes) -> None:
        self.received = True
        if not self.streaming or self.r.status != 200:
            self.body.append(data)
            return
        buf = self.buf + data
        *lines, self.buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                self._line(line)

    def _line(self, line: bytes) -> None:
        if not self.keep_answer:
            fast = _has_content(line)
            if fast is not None:
                if fast:
                    t = time.perf_counter()
                    if self.r.ttft is None:
                        self.r.ttft = t - self.r.start
                    self.chunks_at.append(t)
                return
        try:
            text, c, fin = _content(self.api, line, self.r)
        except (ValueError, ProtocolError) as e:
            self.bad = str(e)
            return
        if text:
            t = time.perf_counter()
            if self.r.ttft is None:
                self.r.ttft = t - self.r.start
            self.chunks_at.append(t)
            if self.keep_answer:
                self.parts.append(text)
        if c is not None:
            self.count = c
        self.finished = self.finished or fin


async def send(
    client: Client,
    data: bytes,
    api: str,
    endpoint: str,
    stream: bool,
    timeout: float,
    start: float,
    keep_answer: bool = False,
) -> Result:
    """One request (pre-built bytes) through `client`; never raises, errors land in the Result."""
    r = Result(start=start)
    streaming = stream and endpoint != "embed"
    m = _Measure(r, api, streaming, keep_answer)

    def sent() -> None:
        r.send_lag = time.perf_counter() - start

    try:
        async with asyncio.timeout(timeout):
            await client.send(data, m, sent)
    except TimeoutError:
        r.error = "timeout"
    except (ConnectionError, OSError):
        r.error = "protocol" if m.received else "connection"
    except ValueError:
        r.error = "protocol"
    r.end = time.perf_counter()
    if r.error is None:
        if r.status != 200:
            r.error = f"http_{r.status}"
        elif not streaming:
            try:
                data = json.loads(b"".join(m.body))
                text, r.out_tokens = _whole_answer(api, endpoint, data)
                prompt_usage(r, api, data)
                r.ttft = r.end - start
                if keep_answer:
                    m.parts.append(text)
            except (ValueError, AttributeError):
                r.error = "protocol"
        else:
            if m.buf.strip():
                m._line(m.buf)
            if m.bad is not None or not m.finished:
                r.error = "protocol"
            r.out_tokens = m.count if m.count is not None else len(m.chunks_at)
    if len(m.chunks_at) > 1:
        r.itl = [b - a for a, b in itertools.pairwise(m.chunks_at)]
    if keep_answer:
        r.answer = "".join(m.parts)
    return r
