"""Every generation answer leaves through one `Exchange` (relay/exchange.py), whose `finish`
gives the slot back and tells `request_done` once. For each way out — a whole answer, a large
one relayed as it comes, a pass-through stream (in Python and through the compiled pump), a
record-wise stream and a resumed one, a translated stream and whole answer, an error before
any head, a client gone mid-stream — the slot is back (the store's in-flight count is 0) and
exactly one record (and one access line) says what the client got. The wrappers pass the
exchange along: trim-and-retry gives its slot back before it asks again, an ensemble tells
each of its steps once."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest

from mock import run_mock
from nomyo_router.events import Events, RequestRecord
from nomyo_router.relay import pump as native
from nomyo_router.relay.exchange import Exchange
from test.helpers import endpoints, run_router
from test.test_access_log import access_lines, until
from test.test_relay import RawClient

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}


async def _done(r: Any, told: list[RequestRecord], caplog: pytest.LogCaptureFixture, n: int = 1) -> None:
    """Wait until `n` records were told and every slot is back, then a moment more: no second
    record may follow."""

    async def free() -> bool:
        snap = await r.router.store.snapshot()
        return not any(snap["in_flight"].values())

    for _ in range(500):
        if len(told) >= n and await free():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert await free(), "a slot was not given back"
    assert len(told) == n, [(x.request_id, x.status) for x in told]
    assert len(access_lines(caplog)) == n


async def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as resp:
        return resp.status, await resp.read()


def _cfg(*mocks: Any, **extra: Any) -> dict[str, Any]:
    return {"endpoints": endpoints(*mocks), "access_log": True, "log_format": "json", **extra}


@pytest.mark.parametrize(
    ("path", "body", "extra"),
    [
        ("/api/chat", {**CHAT, "stream": False}, {}),  # whole, held: one write
        ("/api/chat", {**CHAT, "stream": False}, {"stream_whole_answers": False}),  # whole, asked whole
        # whole, asked whole, relayed as it comes
        ("/api/chat", {**CHAT, "stream": False}, {"max_response_bytes": 1024, "stream_whole_answers": False}),
        ("/v1/chat/completions", {**CHAT, "stream": False}, {}),
        ("/api/chat", {**CHAT, "stream": True}, {"resume_streams": False, "native_relay": False}),  # pass-through
        ("/api/chat", {**CHAT, "stream": True}, {"resume_streams": False}),  # pass-through, compiled pump
        ("/api/chat", {**CHAT, "stream": True}, {}),  # record-wise
        ("/v1/chat/completions", {**CHAT, "stream": True}, {}),  # record-wise, usage asked and stripped
    ],
)
async def test_each_answer_is_told_once_with_its_counts_and_its_slot_back(path, body, extra, caplog):
    async with run_mock(ttft_ms=0.0, tok_ms=0.2, tokens=400) as m, run_router(_cfg(m, **extra)) as r:
        told: list[RequestRecord] = []
        r.router.events.on_request_done(told.append)
        with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
            status, data = await _post(r.url, path, body)
            await _done(r, told, caplog)
    assert status == 200 and len(data) > 1024
    (rec,) = told
    assert rec.status == 200 and rec.error is None and rec.endpoint == "m0"
    assert rec.completion_tokens == 400 and rec.prompt_tokens
    assert b"usage" not in data or "stream_options" in body or not body["stream"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_translated_answer_is_told_once(stream, caplog):
    async with run_mock(ttft_ms=0.0, tok_ms=0.2, tokens=50) as m:
        cfg = {**_cfg(m), "endpoints": [{**endpoints(m)[0], "type": "openai"}]}  # spoken to as an OpenAI server
        async with run_router(cfg) as r:
            told: list[RequestRecord] = []
            r.router.events.on_request_done(told.append)
            with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
                status, data = await _post(r.url, "/api/chat", {**CHAT, "stream": stream})
                await _done(r, told, caplog)
    assert status == 200
    lines = [json.loads(x) for x in data.splitlines() if x]
    assert lines[-1]["done"] is True
    (rec,) = told
    assert rec.status == 200 and rec.error is None and rec.completion_tokens == 50


async def test_a_translated_answer_too_large_to_hold_is_one_502(caplog):
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=400) as m:
        cfg = {**_cfg(m), "endpoints": [{**endpoints(m)[0], "type": "openai"}], "max_response_bytes": 1024}
        async with run_router(cfg) as r:
            told: list[RequestRecord] = []
            r.router.events.on_request_done(told.append)
            with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
                status, data = await _post(r.url, "/api/chat", {**CHAT, "stream": False})
                await _done(r, told, caplog)
    assert status == 502 and "max_response_bytes" in json.loads(data)["error"]
    assert told[0].status == 502 and told[0].error == "response_too_large"


@pytest.mark.instruments  # (it steers the scheduler's first pick)
async def test_a_stream_cut_and_resumed_elsewhere_is_told_once(caplog):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=1.0, tokens=80) as good,
        run_mock(ttft_ms=0.0, tok_ms=1.0, tokens=80, drop_rate=1.0) as dropping,
    ):
        cfg = {**_cfg(dropping, good), "routing": "least_busy", "eject_after": 1000}
        cfg["endpoints"] = endpoints(dropping, good, slots=1)
        async with run_router(cfg) as r:
            told: list[RequestRecord] = []
            r.router.events.on_request_done(told.append)
            r.router.scheduler.acquire = _first_on(r.router.scheduler.acquire, "m0")
            with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
                status, data = await _post(r.url, "/api/chat", {**CHAT, "stream": True})
                await _done(r, told, caplog)
    assert status == 200
    lines = [json.loads(x) for x in data.splitlines() if x]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 80 and not any("error" in x for x in lines)
    (rec,) = told
    assert rec.status == 200 and rec.error is None and rec.resumed == 1 and rec.endpoint == "m1"
    assert rec.completion_tokens == 80


def _first_on(acquire: Any, name: str) -> Any:
    """The scheduler's acquire, its first choice forced to `name` (the dropping backend)."""
    calls = [0]

    async def acquire_first(ctx: Any, exclude: Any = ()) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            exclude = [*exclude, *(e for e in ("m0", "m1") if e != name)]
        return await acquire(ctx, exclude)

    return acquire_first


@pytest.mark.parametrize(
    ("body", "mock", "status", "error"),
    [
        ({**CHAT, "model": "nope", "stream": False}, {}, 404, "error"),  # refused before any attempt
        ({**CHAT, "stream": False}, {"fail_rate": 1.0}, 500, "upstream_status"),  # every attempt failed
        ({**CHAT, "stream": True}, {"error_rate": 1.0}, 502, "backend_error_record"),  # an error in a 200
    ],
)
async def test_an_error_is_told_once_in_the_callers_shape(body, mock, status, error, caplog):
    async with run_mock(ttft_ms=0.0, tok_ms=0.2, tokens=20, **mock) as m, run_router(_cfg(m)) as r:
        told: list[RequestRecord] = []
        r.router.events.on_request_done(told.append)
        with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
            got, data = await _post(r.url, "/api/chat", body)
            await _done(r, told, caplog)
    assert got == (status if body["stream"] is False else 200)  # (a stream's head went out first)
    assert b'"error"' in data
    (rec,) = told
    assert rec.status == status and rec.error == error


@pytest.mark.parametrize("native_relay", [True, False])
async def test_a_client_gone_mid_stream_is_told_once(native_relay, caplog):
    if native_relay and not native.AVAILABLE:
        pytest.skip("the C extension was not built")
    async with (
        run_mock(ttft_ms=0.0, tok_ms=10.0, tokens=500) as m,
        run_router(_cfg(m, native_relay=native_relay, resume_streams=False)) as r,
    ):
        told: list[RequestRecord] = []
        r.router.events.on_request_done(told.append)
        with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
            c = await RawClient.post(r.url, "/api/chat", {**CHAT, "stream": True})
            for _ in range(5):
                assert await c.frame()
            c.close()
            await _done(r, told, caplog)
        await until(lambda: m.stats()["in_flight"] == 0)  # the backend was stopped too
    (rec,) = told
    assert rec.status == 200 and rec.endpoint == "m0"  # (its head went out: the status it got)


async def test_trim_and_retry_gives_its_slot_back_before_asking_again_and_is_told_once(caplog):
    from test.test_context_overflow import history, refusing

    async with refusing("openai") as (_, url):
        cfg = {
            "endpoints": [{"url": url, "name": "b", "type": "openai", "models": ["llama3"], "max_concurrent": 1}],
            "context_overflow": "trim",
            "queue_timeout": 2,
            "access_log": True,
            "log_format": "json",
        }
        async with run_router(cfg) as r:
            told: list[RequestRecord] = []
            r.router.events.on_request_done(told.append)
            with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
                status, _ = await _post(r.url, "/v1/chat/completions", {"model": "llama3", "messages": history()})
                await _done(r, told, caplog)
    assert status == 200  # (one slot: the retry waited for the one the refused try held, had it kept it)
    (rec,) = told
    assert rec.status == 200 and rec.error is None and rec.retries >= 1


async def test_an_ensemble_tells_each_step_once_and_the_answer_once(caplog):
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=10) as a, run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=10) as b:
        async with run_router({**_cfg(a, b), "moe": {"samples": 2}}) as r:
            told: list[RequestRecord] = []
            r.router.events.on_request_done(told.append)
            with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
                status, _ = await _post(r.url, "/api/chat", {**CHAT, "model": "moe-llama3", "stream": True})
                await _done(r, told, caplog, n=4)
    assert status == 200
    ids = sorted(x.request_id.rpartition(".")[2] if "." in x.request_id else "answer" for x in told)
    assert ids == ["answer", "review", "s1", "s2"]
    assert all(x.status == 200 and x.completion_tokens for x in told)


class _Lease:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


def test_finish_gives_the_slot_back_and_tells_once():
    events, told = Events(), []
    events.on_request_done(told.append)

    async def send(msg: dict[str, Any]) -> None:
        pass

    ex = Exchange(send, RequestRecord("1", "ollama", "/api/chat", "m", False), 0.0, events)
    first, second = _Lease(), _Lease()
    ex.hold(first)  # type: ignore[arg-type]
    ex.hold(second)  # type: ignore[arg-type]  # (a continuation's slot: the first goes back now)
    assert first.released == 1 and second.released == 0
    ex.finish()
    ex.finish()
    assert second.released == 1 and len(told) == 1 and told[0].status == 499  # no head: the client left
