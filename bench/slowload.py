"""Thousands of slow streams from one core, for bench/overload.py.

The load tester's client (loadtest.client) looks at every chunk (content, inter-token gaps,
usage): at 2,000 streams × 25 tok/s that is 50,000 chunk callbacks a second, and with the
mock beside it on the same core the client measured itself (direct TTFT p50 415 ms against
the mock's 50 ms). This client does per chunk only what the acceptance needs: one keep-alive
connection per virtual user (an asyncio Protocol with httptools), the request sent as
pre-built bytes, TTFT at the first piece of body carrying a non-empty token (then that test
stops), newline and byte counts. A stream is ok when its status is 200, the response ended
cleanly, it carried exactly the expected number of lines (tokens + the final one) and the
last one says `"done": true`.

Ramp and steady state: user i sends its first request at `i × ramp / N` (default: one
stream's length, so arrivals are spread evenly), then loops closed (the next request as
soon as the previous one ended). Only requests *started* inside the window count, and the
window opens `warm` seconds after the ramp ended (default: one stream's length), so every
counted stream was opened in the steady state, none by the ramp.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import httptools

_CONTENT = re.compile(rb'"(?:content|response|text)"\s*:\s*"[^"]')
_DONE = re.compile(rb'"done"\s*:\s*true')


class _Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.fut: asyncio.Future | None = None
        self.closed = self.keep = False
        self.sent = self.first = self.end = 0.0
        self.lines = self.nbytes = 0
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_result("connection")

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.fut is not None and not self.fut.done():
                self.fut.set_result("protocol")
            self.transport.close()  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        if not self.first and _CONTENT.search(body):
            self.first = time.perf_counter()
        self.lines += body.count(b"\n")
        self.nbytes += len(body)
        self.tail = body

    def on_message_complete(self) -> None:
        self.end = time.perf_counter()
        self.keep = self.parser.should_keep_alive()  # (reset once the callback returns)
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(None)

    def send(self, data: bytes) -> asyncio.Future:
        self.fut = asyncio.get_running_loop().create_future()
        self.first = self.end = 0.0
        self.lines = self.nbytes = 0
        self.tail = b""
        self.sent = time.perf_counter()
        self.transport.write(data)  # type: ignore[union-attr]
        return self.fut


@dataclass
class Outcome:
    requests: list[tuple[float, float, str | None]] = field(default_factory=list)  # (sent, ttft s, error)
    send_lags: list[float] = field(default_factory=list)  # seconds late against the plan
    loop_lags: list[float] = field(default_factory=list)  # how late a 10 ms sleep woke
    open_samples: list[int] = field(default_factory=list)  # streams open, sampled each 100 ms in the window
    window: tuple[float, float] = (0.0, 0.0)
    cpu_s: float = 0.0  # this process, over the window
    wall_s: float = 0.0
    lines: int = 0
    nbytes: int = 0


def request_bytes(host: str, port: int, tokens: int) -> bytes:
    body = (
        b'{"model":"llama3","messages":[{"role":"user","content":"Why is the sky blue?"}],'
        b'"stream":true,"options":{"num_predict":%d}}' % tokens
    )
    return (
        b"POST /api/chat HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port, len(body), body)
    )


async def run(
    host: str,
    port: int,
    streams: int,
    tokens: int,
    ramp: float,
    warm: float,
    seconds: float,
    timeout: float = 60.0,
    at_window=None,
) -> Outcome:
    """`streams` users on `host:port`; see the module doc for the ramp and the window.
    `at_window("start" | "end")` is called as the window opens and closes (CPU snapshots)."""
    loop = asyncio.get_running_loop()
    data = request_bytes(host, port, tokens)
    out = Outcome()
    t0 = time.perf_counter() + 0.5
    w0 = t0 + ramp + warm
    w1 = w0 + seconds
    out.window = (w0, w1)
    open_now = [0]

    async def user(i: int) -> None:
        conn: _Conn | None = None
        plan = t0 + i * ramp / streams
        await asyncio.sleep(max(0.0, plan - time.perf_counter()))
        while True:
            if conn is None or conn.closed:
                _, conn = await loop.create_connection(_Conn, host, port)
            fut = conn.send(data)
            out.send_lags.append(conn.sent - plan)
            open_now[0] += 1
            try:
                err = await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                err = "timeout"
                conn.transport.close()  # type: ignore[union-attr]
            open_now[0] -= 1
            if err is None:
                if conn.parser.get_status_code() != 200:
                    err = f"http_{conn.parser.get_status_code()}"
                elif conn.lines != tokens + 1 or not _DONE.search(conn.tail):
                    err = "short"
                elif not conn.keep:
                    conn.transport.close()  # type: ignore[union-attr]
            if w0 <= conn.sent < w1:
                out.requests.append((conn.sent, conn.first - conn.sent if conn.first else float("nan"), err))
                out.lines += conn.lines
                out.nbytes += conn.nbytes
            plan = conn.end or time.perf_counter()  # closed loop: the next one is due now
            if plan >= w1:
                conn.transport.close()  # type: ignore[union-attr]
                return

    async def monitor() -> None:
        await asyncio.sleep(max(0.0, w0 - time.perf_counter()))
        c0, n0 = time.process_time(), time.perf_counter()
        if at_window:
            at_window("start")
        k = 0
        while time.perf_counter() < w1:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            out.loop_lags.append(time.perf_counter() - t - 0.01)
            k += 1
            if k % 10 == 0:
                out.open_samples.append(open_now[0])
        out.cpu_s, out.wall_s = time.process_time() - c0, time.perf_counter() - n0
        if at_window:
            at_window("end")

    await asyncio.gather(monitor(), *(user(i) for i in range(streams)))
    return out


def pct(values: list[float], q: float) -> float:
    v = sorted(x for x in values if x == x)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(q / 100 * len(v)))]
