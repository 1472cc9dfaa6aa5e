"""One suite over every way an answer reaches the client, as uvicorn runs its protocol tests
over both of its protocol classes: the same tests, on real sockets, for each relay.

A `Way` says how a request is made to take one way (the router's config, the backend's type,
the request); the module-scoped fixture `served` starts one mock and one router per way. Each
test asserts what the client got (status, the headers that matter, the body in its API's
shape) and what the router recorded: one `request_done` and one access line per request, and
in it WHICH relay wrote the answer (`relay`), so a fallback to another relay cannot pass.

- the answer: exactly the backend's (or the cache's, or the error's), in the API's shape;
- a client that leaves mid-answer: its slot and the backend are freed, the request recorded
  (tokens counted where the backend did work, `client_gone` where no head went out);
- a backend that cuts the answer or ends it with its own error record: the client gets a clear
  end in its API's shape, and the record says so.
A point that cannot apply to a way is skipped with the reason."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from mock import RunningMock, run_mock
from nomyo_router.events import RequestRecord
from nomyo_router.relay import pump
from test.helpers import RunningRouter, endpoints, run_router
from test.test_relay import RawClient
from test.waits import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKENS = 40  # the mock's answer: TOKENS words, one a record
LARGE = 260_000  # words of a whole answer larger than the router holds (relay/whole.HOLD: 1 MiB)
MSGS = [{"role": "user", "content": "hi"}]
OLLAMA_STREAM, OPENAI_STREAM = "application/x-ndjson", "text/event-stream"


@dataclass(frozen=True)
class Way:
    id: str
    path: str  # the client's route (its API follows)
    stream: bool
    config: dict[str, Any] = field(default_factory=dict)  # the router's, beside its endpoint
    backend: str = "ollama"  # the endpoint's type
    tokens: int = TOKENS
    tok_ms: float = 1.0  # the mock's time per token
    cached: bool = False  # the request opts in to the response cache; it is asked twice
    model: str = "llama3"
    leave: str | None = None  # why a client cannot leave in the middle of this way's answer
    cut: str | None = None  # why a backend cannot cut this way's answer

    @property
    def api(self) -> str:
        return "openai" if self.path.startswith("/v1/") else "ollama"

    def body(self, model: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": model or self.model, "stream": self.stream, "messages": MSGS}
        if self.cached:
            out["nomyo"] = {"cache": True}
        return out


PLAIN = {"resume_streams": False}
WAYS = [
    # a stream relayed as it comes by the sink in Python (relay/passthrough.py, relay/sinks.py)
    Way("passthrough", "/api/chat", True, {**PLAIN, "native_relay": False}),
    # the same, its rest carried by the compiled pump (relay/pump.py)
    Way("pump", "/v1/chat/completions", True, {**PLAIN, "native_relay": True}),
    # record by record, continued elsewhere when cut (relay/resumable.py); one endpoint: nowhere to go
    Way("resumed", "/api/chat", True, {"resume_streams": True}),
    # an OpenAI backend's SSE as the Ollama API's NDJSON (relay/translated.py)
    Way("translated", "/api/chat", True, PLAIN, backend="openai"),
    # a whole answer, held then written in one piece (relay/whole.Whole)
    Way(
        "whole",
        "/v1/chat/completions",
        False,
        {"stream_whole_answers": False},
        leave="a whole answer leaves in one write: no middle to leave in (the 499 before it: test_client_faults)",
    ),
    # a whole answer larger than the router holds, relayed as it comes (relay/whole.Large)
    Way(
        "large",
        "/api/chat",
        False,
        {"stream_whole_answers": False},
        tokens=LARGE,
        tok_ms=0.0,
    ),
    # a whole answer the backend was asked to stream: collected, then one write (relay/assembled.py)
    Way("assembled", "/api/chat", False, {"stream_whole_answers": True, **PLAIN}),
    # the response cache's answer (relay/cached.py, rendered by cache/render.py), asked a second time
    Way(
        "cached",
        "/api/chat",
        True,
        {"cache": {"enabled": True}, **PLAIN},
        cached=True,
        leave="a cached answer is written at once, in one piece: there is no middle to leave in",
        cut="a cached answer has no backend to cut",
    ),
    # an error in the caller's API shape (Exchange.fail, the Failed relay): a model no endpoint serves
    Way(
        "error",
        "/v1/chat/completions",
        False,
        model="nothing-serves-this",
        leave="an error answer is written at once, in one piece: there is no middle to leave in",
    ),
]


class Served:
    """One way's mock and router, and what the router recorded since `fresh()`."""

    def __init__(self, way: Way, mock: RunningMock, router: RunningRouter) -> None:
        self.way, self.mock, self.router = way, mock, router
        self.records: list[RequestRecord] = []
        self.lines: list[dict[str, Any]] = []  # the access lines' fields
        router.router.events.on_request_done(self.records.append)

    def fresh(self, **faults: Any) -> None:
        self.records.clear()
        self.lines.clear()
        knobs = {"drop_rate": 0.0, "error_rate": 0.0, "fail_rate": 0.0, "busy_rate": 0.0}
        knobs.update(tok_ms=self.way.tok_ms, tokens=self.way.tokens)
        self.mock.update(**{**knobs, **faults})

    async def recorded(self, n: int = 1) -> list[RequestRecord]:
        """The records of the `n` requests made since `fresh()`, once each was told (and its
        access line written): exactly one of each per request."""
        await until(lambda: len(self.records) >= n and len(self.lines) >= n, 5)
        await asyncio.sleep(0.05)  # (a second record for the same request would come now)
        assert len(self.records) == len(self.lines) == n, (self.records, self.lines)
        for rec, line in zip(self.records, self.lines, strict=True):
            assert line["request_id"] == rec.request_id and line["relay"] == rec.relay
        return self.records

    async def freed(self) -> None:
        """Every slot back, and the backend no longer working for us."""
        store = self.router.router.store

        async def busy() -> int:
            return sum((await store.snapshot())["in_flight"].values())

        for _ in range(150):
            if await busy() == 0 and self.mock.stats()["in_flight"] == 0:
                return
            await asyncio.sleep(0.02)
        pytest.fail(f"a slot or the backend is still busy: {await busy()}, {self.mock.stats()['in_flight']}")


class _Lines(logging.Handler):
    def __init__(self, served: list[Served]) -> None:
        super().__init__(logging.INFO)
        self.served = served

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "access", None)
        if fields is not None and self.served:
            self.served[0].lines.append(fields)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=WAYS, ids=[w.id for w in WAYS])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    way: Way = request.param
    if way.id == "pump" and not pump.AVAILABLE:
        pytest.skip("the C extension was not built (no compiler): no pump")
    log = logging.getLogger("nomyo_router.access")
    box: list[Served] = []
    handler = _Lines(box)
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    cutter = await _cutter() if way.id == "large" else None
    try:
        async with run_mock(ttft_ms=0.0, tok_ms=way.tok_ms, tokens=way.tokens) as m:
            eps = endpoints(m, slots=1, type=way.backend)
            if cutter is not None:  # (the mock cuts a whole answer before its head: this one, mid-way)
                url = f"http://127.0.0.1:{cutter.sockets[0].getsockname()[1]}"
                eps.append({"url": url, "name": "cutter", "type": "ollama", "models": ["cutter"], "max_concurrent": 1})
            cfg = {
                "endpoints": eps,
                "access_log": True,
                "log_format": "json",
                "eject_after": 1000,  # (a fault injected by one test must not eject the only endpoint)
                "stream_idle_timeout": 2,
                **way.config,
            }
            async with run_router(cfg) as r:
                box.append(Served(way, m, r))
                yield box[0]
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        if cutter is not None:
            cutter.close()


async def _cutter() -> asyncio.Server:
    """A backend whose whole answer to /api/chat is larger than the router holds and is cut
    mid-way: a 200 with a content-length of 2 MiB, 1.5 MiB of it, then the connection closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(h.split(b":")[1]) for h in head.lower().split(b"\r\n") if h.startswith(b"content-length:")),
                    0,
                )
                await reader.readexactly(length)
                if not head.startswith(b"POST /api/chat"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                part = b'{"model":"cutter","message":{"role":"assistant","content":"' + b"x" * (3 << 19)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                    % (2 << 20, part)
                )
                await writer.drain()
                break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


# ---- reading an answer in its API's shape ----------------------------------------------------
def words(n: int) -> list[str]:
    from mock.text import WORDS

    return [WORDS[i % 16] for i in range(n)]


def stream_records(api: str, raw: bytes) -> list[Any]:
    """A stream's records: NDJSON objects, or SSE events' data (`[DONE]` as the string)."""
    if api == "ollama":
        return [json.loads(line) for line in raw.split(b"\n") if line.strip()]
    out: list[Any] = []
    for event in raw.split(b"\n\n"):
        if event.strip():
            assert event.startswith(b"data: "), event
            data = event[6:]
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def stream_text(api: str, records: list[Any]) -> list[str]:
    if api == "ollama":
        return "".join((r.get("message") or {}).get("content", "") for r in records).split()
    deltas = (c.get("delta", {}).get("content") or "" for r in records if isinstance(r, dict) for c in r["choices"])
    return "".join(deltas).split()


def whole_text(api: str, obj: dict[str, Any]) -> list[str]:
    return (obj["message"]["content"] if api == "ollama" else obj["choices"][0]["message"]["content"]).split()


def api_error(api: str, obj: Any) -> str:
    """The message of an error in the API's shape (fails when the shape is not the API's)."""
    if api == "ollama":
        assert isinstance(obj, dict) and isinstance(obj.get("error"), str), obj
        return str(obj["error"])
    assert isinstance(obj, dict) and isinstance(obj["error"]["message"], str) and "type" in obj["error"], obj
    return str(obj["error"]["message"])


async def ask(served: Served, **body: Any) -> tuple[int, Any, bytes]:
    way = served.way
    async with aiohttp.ClientSession() as s, s.post(served.router.url + way.path, json={**way.body(), **body}) as resp:
        return resp.status, resp.headers, await resp.read()


# ---- the same tests for every way --------------------------------------------------------------
async def test_the_client_gets_the_answer_in_its_apis_shape(served: Served) -> None:
    way = served.way
    served.fresh()
    status, headers, body = await ask(served)
    if way.cached:  # the first asking fills the cache (served by a relay of its own), the second is the cache's
        first = (await served.recorded())[0]
        assert first.cache == "miss" and first.relay not in (None, "cached")
        served.fresh()
        status, headers, body = await ask(served)
    (rec,) = await served.recorded()
    assert rec.relay == way.id
    assert rec.status == status
    if way.id != "error":  # (an error before any endpoint was tried carries no routing headers)
        assert headers["x-request-id"] == rec.request_id
    if way.id == "error":
        assert status == 404 and headers["content-type"].startswith("application/json")
        assert "nothing-serves-this" in api_error(way.api, json.loads(body))
        assert rec.error == "model_not_found"
        return
    assert status == 200 and rec.error is None
    if way.stream:
        assert headers["content-type"].startswith(OLLAMA_STREAM if way.api == "ollama" else OPENAI_STREAM)
        assert headers.get("transfer-encoding") == "chunked"
        records = stream_records(way.api, body)
        assert stream_text(way.api, records) == words(way.tokens)
        if way.api == "ollama":
            assert records[-1]["done"] is True and not any(r.get("done") for r in records[:-1])
        else:
            assert records[-1] == "[DONE]"
    else:
        assert headers["content-type"].startswith("application/json")
        assert int(headers["content-length"]) == len(body)
        obj = json.loads(body)
        assert whole_text(way.api, obj) == words(way.tokens)
        assert obj.get("done", True) is True
    if way.cached:  # no backend worked for it: no tokens are counted (the usage store bills none)
        assert rec.completion_tokens is None
        return
    # the backend's own count, or (an OpenAI stream without usage) the records relayed
    assert rec.completion_tokens == way.tokens if rec.tokens_from == "backend" else rec.completion_tokens >= way.tokens


async def test_a_client_that_leaves_mid_answer_frees_its_slot_and_is_recorded(served: Served) -> None:
    way = served.way
    if way.leave:
        pytest.skip(way.leave)
    if way.stream:
        served.fresh(tok_ms=20.0)
        c = await RawClient.post(served.router.url, way.path, way.body())
        for _ in range(4):
            assert await c.frame()
        c.close()
    else:  # the answer is being made (assembled: collected) or relayed (large) when the client goes
        # (large: more than the kernel's socket buffers take, ~6 MB, so the router is still writing)
        served.fresh(tok_ms=20.0) if way.id == "assembled" else served.fresh(tokens=4 * LARGE)
        host, port = served.router.url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (the router's writes pile up: it waits)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
        data = json.dumps(way.body()).encode()
        writer.write(
            b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (way.path.encode(), len(data), data)
        )
        if way.id == "large":
            await reader.readexactly(64 * 1024)  # a part of its answer came
        else:
            await asyncio.sleep(0.2)  # the backend's stream is being collected
        writer.close()
    await served.freed()
    (rec,) = await served.recorded()
    assert rec.relay == way.id
    if way.id == "assembled":  # no head went out: a 499, and nothing reached the client, so none is counted
        assert (rec.status, rec.error, rec.completion_tokens) == (499, "client_gone", None)
    else:  # the head went out: the 200 the client got, that it left, and what it was sent of the answer
        assert (rec.status, rec.error) == (200, "client_gone")
        if way.id == "large":  # a whole answer's counts sit in its last bytes, which were never read
            assert rec.completion_tokens is None
        else:  # a stream's: the records it was sent
            assert 0 < rec.completion_tokens < way.tokens
    assert served.router.router.health.snapshot()["m0"]["consecutive_failures"] == 0  # not the backend's fault


@pytest.mark.parametrize("fault", ["drop", "error"])  # a cut mid-answer; the backend's own error record
async def test_a_backend_that_breaks_the_answer_gives_the_client_a_clear_end(served: Served, fault: str) -> None:
    way = served.way
    if way.cut:
        pytest.skip(way.cut)
    if way.id == "large":
        if fault == "error":
            pytest.skip("an answer larger than the router holds is not read for an error object: it is relayed")
        served.fresh()
        async with (
            aiohttp.ClientSession() as s,
            s.post(served.router.url + way.path, json=way.body(model="cutter")) as r,
        ):
            with pytest.raises(aiohttp.ClientPayloadError):  # the connection closed before the content-length
                await r.read()
        (rec,) = await served.recorded()
        await served.freed()
        assert (r.status, rec.relay, rec.status, rec.error) == (200, "large", 200, "answer_cut")
        return
    if way.id == "error":  # the error way answers a backend that fails: its error in the caller's shape
        served.fresh(fail_rate=1.0) if fault == "drop" else served.fresh(busy_rate=1.0)
        status, headers, body = await ask(served, model="llama3")
    else:
        served.fresh(**{f"{fault}_rate": 1.0})
        status, headers, body = await ask(served)
    (rec,) = await served.recorded()
    await served.freed()
    if way.stream:  # the head went out: the stream's last record says it broke
        assert status == 200 and rec.relay == way.id
        records = stream_records(way.api, body)
        last = records[-1]
        assert api_error(way.api, last)
        assert stream_text(way.api, records[:-1]) == words(way.tokens // 2)
        if fault == "drop":
            assert rec.error == "stream_cut" and rec.status == 200
        else:
            assert (rec.status, rec.error) == (502, "backend_error_record")
        return
    # nothing went out: an error answer in the caller's shape instead
    assert rec.relay == "error"
    assert status >= 500 and headers["content-type"].startswith("application/json")
    assert api_error(way.api, json.loads(body))
    assert rec.status == status and rec.error
