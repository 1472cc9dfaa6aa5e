"""Send one request and time it: latency, TTFT at the first non-empty content, inter-token gaps.

Requests go out on the router's own HTTP/1.1 client (`h1`: keep-alive connections, httptools
parsing, a stream's body handed to a callback as each read arrives, one deadline per request
without a timer per request); the only work on the hot path is what is measured: splitting
chunks and finding their content.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nomyo_router import h1

JSON = {"Content-Type": "application/json"}
MAX_ANSWER = 64 * 1024 * 1024  # a whole answer (or a stream's line) longer than this: a protocol error


class Request(NamedTuple):
    """One request to send, built once: its path, JSON body and more header lines (CRLF-ended)."""

    path: str
    body: bytes
    extra: bytes


class Client:
    """The server under load: a pool of keep-alive connections to it (one per concurrent
    request), `https://` through TLS."""

    def __init__(self, base_url: str) -> None:
        self.pool = h1.Pool(base_url, JSON)

    def build(self, path: str, body: bytes, headers: dict[str, str]) -> Request:
        return Request(path, body, "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode())

    def close(self) -> None:
        self.pool.close()


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


class _Measure:
    """Times one stream as its bytes arrive: TTFT at the first non-empty content."""

    def __init__(self, r: Result, api: str, keep_answer: bool) -> None:
        self.r, self.api, self.keep_answer = r, api, keep_answer
        self.buf = b""
        self.chunks_at: list[float] = []
        self.parts: list[str] = []
        self.count: int | None = None
        self.finished = False
        self.bad: str | None = None

    def headers(self, headers: h1.Headers) -> None:
        """What the router says of the request in its answer's head (nothing, straight to a server)."""
        r = self.r
        if "x-router-endpoint" in headers:
            r.endpoint = headers["x-router-endpoint"]
        if "x-router-overhead-ms" in headers:
            try:
                r.overhead_ms = float(headers["x-router-overhead-ms"])
            except ValueError:
                self.bad = "a bad x-router-overhead-ms header"
        if "x-router-affinity" in headers:
            r.affinity = headers["x-router-affinity"]

    def on_body(self, data: bytes) -> bool:
        """The body's bytes of one read (the client's sink: called as they arrive, so the
        times are the arrival's). Never raises: a bad line is noted, the stream read on."""
        buf = self.buf + data if self.buf else data
        *lines, self.buf = buf.split(b"\n")
        try:
            for line in lines:
                if line.strip():
                    self._line(line)
        except Exception as e:  # (a chunk of an unexpected shape: a list where an object was)
            self.bad = f"{type(e).__name__}: {e}"
        if len(self.buf) > MAX_ANSWER:
            self.bad, self.buf = f"a stream line longer than {MAX_ANSWER} bytes", b""
        return True

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
    req: Request,
    api: str,
    endpoint: str,
    stream: bool,
    timeout: float,
    start: float,
    keep_answer: bool = False,
) -> Result:
    """One request through `client`, all of it (the answer's head and every read) within
    `timeout` seconds of sending it (connecting, when a new connection is needed, has a limit
    of its own as long); never raises, errors land in the Result."""
    r = Result(start=start)
    streaming = stream and endpoint != "embed"
    m = _Measure(r, api, keep_answer)
    body = b""
    resp: h1.Response | None = None
    r.send_lag = time.perf_counter() - start
    try:
        resp = await client.pool.request(b"POST", req.path, req.body, None, None, None, timeout, req.extra)
        r.status = resp.status
        m.headers(resp.headers)
        if streaming and resp.status == 200:
            resp.sink(m.on_body)  # what came with the head (or before) is read here first
            while data := await resp.readany():
                m.on_body(data)
        else:
            body = await resp.read(MAX_ANSWER)
        resp.release()
    except TimeoutError:
        r.error = "timeout"
    except (h1.Unreachable, h1.OutOfDescriptors, h1.Disconnected, OSError):
        r.error = "connection"
    except h1.ClientError:  # cut mid-answer, a bad HTTP answer, one longer than MAX_ANSWER
        r.error = "protocol"
    finally:
        if resp is not None:
            resp.close()  # (nothing when released; a connection left mid-answer is closed)
    r.end = time.perf_counter()
    if r.error is None:
        if r.status != 200:
            r.error = f"http_{r.status}"
        elif not streaming:
            try:
                data = json.loads(body)
                text, r.out_tokens = _whole_answer(api, endpoint, data)
                prompt_usage(r, api, data)
                r.ttft = r.end - start
                if keep_answer:
                    m.parts.append(text)
            except (ValueError, AttributeError):
                r.error = "protocol"
            if m.bad is not None:
                r.error = "protocol"
        else:
            if m.buf.strip():
                m.on_body(b"\n")
            if m.bad is not None or not m.finished:
                r.error = "protocol"
            r.out_tokens = m.count if m.count is not None else len(m.chunks_at)
    if len(m.chunks_at) > 1:
        r.itl = [b - a for a, b in itertools.pairwise(m.chunks_at)]
    if keep_answer:
        r.answer = "".join(m.parts)
    return r
