"""Send one request and time it: latency, TTFT at the first non-empty content, inter-token gaps.

One aiohttp session for the whole run; bodies arrive pre-encoded. The only work on the
hot path is what is measured: reading chunks and finding their content.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


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

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency(self) -> float:
        return self.end - self.start


def make_session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ttl_dns_cache=300, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=None),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )


def _content(api: str, line: bytes) -> tuple[str, int | None, bool]:
    """(text, output token count if the chunk carries usage, stream finished?) of one chunk."""
    if api == "ollama":
        d = json.loads(line)
        if "error" in d:
            raise ProtocolError(str(d["error"]))
        text = (d.get("message") or {}).get("content") or d.get("response") or ""
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


async def send(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
               api: str, endpoint: str, stream: bool, timeout: float, start: float,
               keep_answer: bool = False) -> Result:
    now = time.perf_counter
    r = Result(start=start)
    r.send_lag = now() - start
    chunks_at: list[float] = []
    parts: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url, data=body, headers=headers) as resp:
                r.status = resp.status
                h = resp.headers
                r.endpoint = h.get("X-Router-Endpoint")
                oh = h.get("X-Router-Overhead-Ms")
                r.overhead_ms = float(oh) if oh else None
                r.affinity = h.get("X-Router-Affinity")
                if resp.status != 200:
                    await resp.read()
                    r.error = f"http_{resp.status}"
                elif not stream or endpoint == "embed":
                    data = json.loads(await resp.read())
                    r.ttft = now() - start
                    text, r.out_tokens = _whole_answer(api, endpoint, data)
                    if keep_answer:
                        parts.append(text)
                else:
                    count = None
                    done = False
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        text, c, fin = _content(api, line)
                        if text:
                            t = now()
                            if r.ttft is None:
                                r.ttft = t - start
                            chunks_at.append(t)
                            if keep_answer:
                                parts.append(text)
                        if c is not None:
                            count = c
                        done = done or fin
                    if not done:
                        raise ProtocolError("stream ended without its final chunk")
                    r.out_tokens = count if count is not None else len(chunks_at)
    except asyncio.TimeoutError:
        r.error = "timeout"
    except (aiohttp.ClientPayloadError, ProtocolError, ValueError):
        r.error = "protocol"
    except (aiohttp.ClientError, OSError):
        r.error = "connection"
    r.end = now()
    if len(chunks_at) > 1:
        r.itl = [b - a for a, b in zip(chunks_at, chunks_at[1:])]
    if keep_answer:
        r.answer = "".join(parts)
    return r
