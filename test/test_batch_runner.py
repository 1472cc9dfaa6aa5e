"""The Batch API's runner: lines only on idle slots and never ahead of interactive requests,
a router SIGKILLed mid-batch resumes each custom_id once, two instances on Redis (shared
files and batches, one taking over from the other), a busy model holds back no other, and the
load tester's batch beside its stages."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import openai
import pytest

from mock import MockConfig, MockProcess, run_mock
from nomyo_router.batch.demand import Demand
from nomyo_router.domain import Endpoint
from nomyo_router.events import RequestRecord
from nomyo_router.routing.policies import RouteContext, make_policy
from nomyo_router.routing.scheduler import Scheduler
from nomyo_router.state import MemoryStore
from nomyo_router.state.queue_order import BATCH
from test.batch_api import ALICE, BOB, batch_config, chat, client, finished, jsonl, lines_of
from test.conftest import RedisServer
from test.helpers import run_router
from test.loadtest_run import loadtest
from test.router_proc import router_workers


async def test_lines_take_only_idle_slots_and_never_delay_interactive_requests():
    """2 slots, max_share 0.5: at most one line at a time, none started while an interactive
    request waits, none ever waiting in the queue; the batch ends once interactive load stops."""
    async with run_mock(ttft_ms=100.0, tok_ms=0.0, tokens=2) as slow:
        async with run_router(batch_config([slow], max_share=0.5, interactive_window=1.0)) as r:
            spans: list[tuple[bool, float, float, float]] = []  # (batch?, start, waited until, end)
            loop = asyncio.get_running_loop()

            def done(rec: RequestRecord) -> None:
                end = loop.time()
                start = end - rec.total_s
                spans.append((rec.batch is not None, start, start + rec.queue_s, end))

            r.router.events.on_request_done(done)
            c = client(r.url, ALICE)
            f = await c.files.create(file=("in.jsonl", jsonl([chat(f"c{i}") for i in range(8)])), purpose="batch")
            b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
            for _ in range(3):  # waves of three: one of them waits for a slot each time
                await asyncio.gather(
                    *(
                        c.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "hi"}])
                        for _ in range(3)
                    )
                )
            done_b = await finished(c, b.id)
            assert done_b.status == "completed" and done_b.request_counts.completed == 8
            lines = [s for s in spans if s[0]]
            chats = [s for s in spans if not s[0]]
            assert len(lines) == 8 and len(chats) == 9
            assert all(s[2] - s[1] < 0.01 for s in lines)  # no line waited in the queue
            waits = [(s[1], s[2]) for s in chats if s[2] - s[1] > 0.02]
            assert waits, "some interactive request waited (3 at once on 2 slots)"
            for _, start, _, _ in lines:  # no line started while an interactive request waited
                assert not any(w0 + 0.005 < start < w1 - 0.005 for w0, w1 in waits), (start, waits)
            for _, start, _, end in lines:  # never two lines at once (half of 2 slots)
                assert sum(1 for _, s, _, e in lines if s < end - 0.005 and e > start + 0.005) == 1


def test_a_router_killed_mid_batch_resumes_each_custom_id_once(tmp_path):
    with MockProcess(MockConfig(ttft_ms=100.0, tok_ms=0.0, tokens=2)) as m:
        cfg = batch_config([m], claim_timeout=1.0)
        cfg["batch"]["path"] = str(tmp_path / "batch.db")
        head = {"Authorization": f"Bearer {ALICE}"}
        ids = [f"c{i}" for i in range(8)]
        with router_workers(cfg, 1) as (url, proc):
            with httpx.Client(base_url=url, headers=head, timeout=10) as h:
                f = h.post(
                    "/v1/files", files={"file": ("in.jsonl", jsonl([chat(i) for i in ids]))}, data={"purpose": "batch"}
                )
                body = {"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
                batch_id = h.post("/v1/batches", json=body).json()["id"]
                deadline = time.monotonic() + 10
                while h.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"] < 3:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)  # a line is in flight: it must run again, once
            proc.wait()
        with router_workers(cfg, 1) as (url, proc):
            with httpx.Client(base_url=url, headers=head, timeout=10) as h:
                deadline = time.monotonic() + 20
                while (b := h.get(f"/v1/batches/{batch_id}").json())["status"] != "completed":
                    assert time.monotonic() < deadline, b
                    time.sleep(0.1)
                out = [json.loads(x) for x in h.get(f"/v1/files/{b['output_file_id']}/content").content.splitlines()]
        assert sorted(x["custom_id"] for x in out) == sorted(ids)
        assert b["error_file_id"] is None and b["request_counts"] == {"total": 8, "completed": 8, "failed": 0}


async def test_two_instances_on_redis_share_files_and_batches(mock):
    with RedisServer() as redis:
        cfg = {**batch_config([mock]), "state": redis.url, "redis_timeout": 0.5}
        async with run_router(cfg) as a, run_router(cfg) as b:
            ca, cb = client(a.url, ALICE), client(b.url, ALICE)
            f = await ca.files.create(
                file=("in.jsonl", jsonl([chat(f"c{i}") for i in range(6)] + [chat("x", model="nope")])), purpose="batch"
            )
            assert (await cb.files.retrieve(f.id)).bytes == f.bytes
            batch = await cb.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            with pytest.raises(openai.NotFoundError):
                await client(a.url, BOB).batches.retrieve(batch.id)
            done = await finished(ca, batch.id)
            assert done.status == "completed" and done.request_counts.completed == 6 and done.request_counts.failed == 1
            out = await lines_of(cb, done.output_file_id)
            assert sorted(x["custom_id"] for x in out) == [f"c{i}" for i in range(6)]
            assert [x["custom_id"] for x in await lines_of(ca, done.error_file_id)] == ["x"]
            assert sum(1 for r in (a, b) if r.router.batches.runner.leading) == 1  # one runner at a time
            assert [x.id for x in (await cb.batches.list()).data] == [batch.id]
            redis.stop()  # the store away: a clear 503, not a 500
            with pytest.raises(openai.InternalServerError) as away:
                await cb.batches.list()
            assert away.value.status_code == 503 and "batch store is unavailable" in away.value.message


def test_the_headroom_left_to_interactive_requests_is_their_recent_peak():
    d = Demand(window=10.0)
    d.saw("a", 3, now=100.0)
    d.saw("a", 1, now=100.5)
    d.saw("a", 2, now=105.0)
    assert d.peak("a", now=106.0) == 3 and d.peak("b", now=106.0) == 0
    assert d.peak("a", now=110.5) == 2  # the burst of 3 aged out
    assert d.peak("a", now=116.0) == 0


def test_the_load_tester_runs_a_batch_beside_its_stages(tmp_path):
    doc, run = loadtest(
        *("--mock-backend", "--api", "openai", "--no-stream", "--concurrency", "2", "--router-max-conc", "4"),
        *("--duration", "0.5", "--warmup", "0", "--mock-ttft-ms", "10", "--batch-lines", "10"),
        json_out=tmp_path / "out.json",
    )
    rep = doc["batch"]
    assert rep["status"] == "completed" and rep["request_counts"] == {"total": 10, "completed": 10, "failed": 0}
    [stage] = rep["stages"]
    assert stage["load"] == 2 and stage["p95_alone_ms"] > 0 and stage["p95_with_batch_ms"] > 0 and stage["ratio"] > 0
    assert rep["with_batch"][0]["completed"] > 0
    assert "interactive latency beside a batch of 10 lines" in run.stdout


async def test_a_batch_waiting_for_a_busy_model_does_not_hold_back_one_for_an_idle_model():
    async with (
        run_mock(ttft_ms=5000.0, tok_ms=0.0, tokens=2, models=["busy"]) as busy,
        run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=2, models=["idle"]) as idle,
        run_router(batch_config([busy, idle])) as r,
    ):
        c = client(r.url, ALICE)
        chats = [  # every slot of the busy model's endpoint held by interactive requests
            asyncio.create_task(c.chat.completions.create(model="busy", messages=[{"role": "user", "content": "x"}]))
            for _ in range(2)
        ]
        await asyncio.sleep(0.1)
        fa = await c.files.create(
            file=("a.jsonl", jsonl([chat(f"a{i}", model="busy") for i in range(30)])), purpose="batch"
        )
        a = await c.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h")
        fb = await c.files.create(
            file=("b.jsonl", jsonl([chat(f"b{i}", model="idle") for i in range(5)])), purpose="batch"
        )
        b = await c.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions", completion_window="24h")
        done = await finished(c, b.id)
        assert not any(t.done() for t in chats)  # (the busy model's requests still run)
        assert done.status == "completed" and done.request_counts.completed == 5
        assert (await c.batches.retrieve(a.id)).request_counts.completed == 0
        await c.batches.cancel(a.id)
        for t in chats:
            t.cancel()


async def test_on_redis_another_instance_takes_over_a_batch_whose_runner_stopped():
    async with run_mock(ttft_ms=100.0, tok_ms=0.0, tokens=2) as slow:
        with RedisServer() as redis:
            cfg = {**batch_config([slow], claim_timeout=1.0), "state": redis.url}
            first = run_router(cfg)
            a = await first.__aenter__()  # (the runner: the first to ask for the lease)
            try:
                async with run_router(cfg) as b:
                    c = client(b.url, ALICE)
                    ids = [f"c{i}" for i in range(8)]
                    f = await c.files.create(file=("in.jsonl", jsonl([chat(i) for i in ids])), purpose="batch")
                    batch = await c.batches.create(
                        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
                    )
                    async with asyncio.timeout(10):
                        while (await c.batches.retrieve(batch.id)).request_counts.completed < 3:
                            await asyncio.sleep(0.05)
                    assert a.router.batches.runner.leading and a.router.batches.runner.in_flight
                    await first.__aexit__(None, None, None)  # a line in flight is cut: it runs again on b
                    first = None
                    done = await finished(c, batch.id)
                    assert b.router.batches.runner.leading
                    out = await lines_of(c, done.output_file_id)
                    assert sorted(x["custom_id"] for x in out) == sorted(ids) and done.error_file_id is None
            finally:
                if first is not None:
                    await first.__aexit__(None, None, None)


async def test_a_line_that_had_to_wait_would_be_served_after_every_interactive_request():
    """Should a line ever wait for a slot (another instance took the one it saw free), it is
    placed below every key: a request arriving after it is served first."""
    ep = Endpoint("e", "http://127.0.0.1:9", 1, models={"m:latest": "m"})
    store = MemoryStore(100)
    sched = Scheduler([ep], store, make_policy("least_busy", {}), queue_timeout=5)
    held = await sched.acquire(RouteContext("m:latest", "openai", "chat"))
    order: list[str] = []

    async def wait(name: str, client: str | None) -> None:
        lease = await sched.acquire(RouteContext("m:latest", "openai", "chat", client=client))
        order.append(name)
        lease.release()

    line = asyncio.create_task(wait("line", BATCH[0]))
    await asyncio.sleep(0.01)
    chat_ = asyncio.create_task(wait("chat", None))
    await asyncio.sleep(0.01)
    held.release()
    await asyncio.gather(line, chat_)
    assert order == ["chat", "line"]
