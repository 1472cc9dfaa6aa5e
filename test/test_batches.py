"""The Batch API with the official `openai` SDK against the mock: files and batches round trip
(chat and embeddings), each custom_id once in the output or error file, bad lines in the error
file, a malformed file fails the batch with `errors`, cancel, another key's 404s, /metrics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import yaml

from mock import MockConfig, MockProcess, run_mock
from nomyo_router.batch.demand import Demand
from nomyo_router.domain import Endpoint
from nomyo_router.events import RequestRecord
from nomyo_router.routing.policies import RouteContext, make_policy
from nomyo_router.routing.scheduler import Scheduler
from nomyo_router.state import MemoryStore
from nomyo_router.state.fair import BATCH
from test.conftest import RedisServer
from test.helpers import endpoints, run_router
from test.loadtest_run import loadtest
from test.router_proc import router_workers

ALICE, BOB, ADMIN = "alice-key-0123456789", "bob-key-0123456789", "admin-key-0123456789"


def batch_config(mocks: list[Any], **batch: Any) -> dict[str, Any]:
    path = os.path.join(tempfile.mkdtemp(prefix="nomyo-batch-test-"), "batch.db")
    return {
        "endpoints": endpoints(*mocks, slots=2),
        "client_keys": [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}],
        "admin_key": ADMIN,
        "batch": {"enabled": True, "path": path, "poll_interval": 0.05, **batch},
    }


def client(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=10)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def chat(cid: str, model: str = "llama3", **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": cid}], "max_tokens": 4, **extra}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


async def finished(c: openai.AsyncOpenAI, batch_id: str, timeout: float = 15.0) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            b = await c.batches.retrieve(batch_id)
            if b.status in ("completed", "failed", "cancelled", "expired"):
                return b
            await asyncio.sleep(0.05)


async def lines_of(c: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await c.files.content(file_id)
    return [json.loads(x) for x in content.content.splitlines() if x.strip()]


async def test_chat_and_embeddings_round_trip_with_bad_lines_in_the_error_file(mock):
    async with run_router(batch_config([mock])) as r:
        c = client(r.url, ALICE)
        lines = [chat(f"c{i}") for i in range(5)]
        lines += [
            chat("unknown-model", model="no-such-model"),
            {**chat("wrong-url"), "url": "/v1/nope"},
            chat("streamed", stream=True),
            {"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "llama3"}},
        ]
        f = await c.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        assert f.purpose == "batch" and f.bytes == len(jsonl(lines))
        assert (await c.files.retrieve(f.id)).id == f.id
        b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert b.status == "in_progress" and b.request_counts.total == 9
        b = await finished(c, b.id)
        assert b.status == "completed", b
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (9, 5, 4)
        out, err = await lines_of(c, b.output_file_id), await lines_of(c, b.error_file_id)
        assert sorted(x["custom_id"] for x in out) == [f"c{i}" for i in range(5)]
        assert all(x["response"]["status_code"] == 200 and x["response"]["body"]["choices"] for x in out)
        errors = {x["custom_id"]: x for x in err}
        assert sorted(errors) == ["bad-body", "streamed", "unknown-model", "wrong-url"]
        assert errors["unknown-model"]["response"]["status_code"] == 404
        assert errors["wrong-url"]["error"]["code"] == "invalid_url"
        assert errors["bad-body"]["response"]["status_code"] == 400

        e = await c.files.create(
            file=(
                "e.jsonl",
                jsonl(
                    [
                        {**chat(f"e{i}"), "url": "/v1/embeddings", "body": {"model": "llama3", "input": "hi"}}
                        for i in range(3)
                    ]
                ),
            ),
            purpose="batch",
        )
        eb = await finished(
            c, (await c.batches.create(input_file_id=e.id, endpoint="/v1/embeddings", completion_window="24h")).id
        )
        assert eb.status == "completed" and eb.request_counts.completed == 3
        emb = await lines_of(c, eb.output_file_id)
        assert all(x["response"]["body"]["data"][0]["embedding"] for x in emb)

        page = await c.batches.list(limit=1)
        assert len(page.data) == 1 and page.has_more and page.data[0].id == eb.id
        nxt = await c.batches.list(limit=1, after=page.data[0].id)
        assert nxt.data[0].id == b.id

        async with aiohttp.ClientSession() as s, asyncio.timeout(5):
            while True:  # (the counts follow the batches' end within a round of the runner)
                async with s.get(r.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}) as m:
                    text = await m.text()
                if 'nomyo_router_batch_lines{model="llama3",state="done"} 8.0' in text:
                    break
                await asyncio.sleep(0.05)
        assert 'nomyo_router_batch_lines{model="no-such-model",state="failed"} 1.0' in text

        deleted = await c.files.delete(f.id)
        assert deleted.deleted
        with pytest.raises(openai.NotFoundError):
            await c.files.retrieve(f.id)


async def test_another_key_gets_404_and_the_admin_sees_all(mock):
    cfg = batch_config([mock])
    cfg["client_keys"][1]["models"] = ["qwen2.5:7b"]  # bob may use this model only
    async with run_router(cfg) as r:
        alice, bob, admin = client(r.url, ALICE), client(r.url, BOB), client(r.url, ADMIN)
        f = await alice.files.create(file=("in.jsonl", jsonl([chat("a")])), purpose="batch")
        b = await alice.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        for call in (
            bob.files.retrieve(f.id),
            bob.files.content(f.id),
            bob.files.delete(f.id),
            bob.batches.retrieve(b.id),
            bob.batches.cancel(b.id),
            bob.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"),
        ):
            with pytest.raises(openai.NotFoundError):
                await call
        assert [x.id for x in (await bob.files.list()).data] == []
        assert [x.id for x in (await bob.batches.list()).data] == []
        assert (await admin.batches.retrieve(b.id)).id == b.id
        assert f.id in [x.id for x in (await admin.files.list()).data]
        done = await finished(alice, b.id)
        assert (await admin.files.retrieve(done.output_file_id)).purpose == "batch_output"
        fb = await bob.files.create(
            file=("b.jsonl", jsonl([chat("mine", model="qwen2.5:7b"), chat("not")])), purpose="batch"
        )
        mine = await finished(
            bob,
            (
                await bob.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions", completion_window="24h")
            ).id,
        )
        assert [x["custom_id"] for x in await lines_of(bob, mine.output_file_id)] == ["mine"]
        [refused] = await lines_of(bob, mine.error_file_id)
        assert refused["custom_id"] == "not" and refused["response"]["status_code"] == 403


async def test_a_malformed_file_fails_the_batch_and_a_large_one_is_refused(mock):
    async with run_router(batch_config([mock], max_file_bytes=4096)) as r:
        c = client(r.url, ALICE)
        bad = jsonl([chat("x")]) + b"not json\n" + jsonl([chat("x"), {"method": "POST"}])
        f = await c.files.create(file=("bad.jsonl", bad), purpose="batch")
        b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert b.status == "failed" and b.errors is not None
        assert [(e.code, e.line) for e in b.errors.data] == [
            ("invalid_json_line", 2),
            ("duplicate_custom_id", 3),
            ("missing_custom_id", 4),
        ]
        with pytest.raises(openai.APIStatusError) as big:
            await c.files.create(file=("big.jsonl", b"x" * 5000), purpose="batch")
        assert big.value.status_code == 413 and "4096" in big.value.message
        with pytest.raises(openai.BadRequestError):
            await c.batches.create(input_file_id=f.id, endpoint="/v1/nope", completion_window="24h")  # type: ignore[arg-type]


async def test_cancel_starts_no_new_line(mock):
    async with run_mock(ttft_ms=300.0, tok_ms=0.0, tokens=2) as slow:
        async with run_router(batch_config([slow])) as r:
            c = client(r.url, ALICE)
            f = await c.files.create(file=("in.jsonl", jsonl([chat(f"c{i}") for i in range(20)])), purpose="batch")
            b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
            await asyncio.sleep(0.2)  # one line runs (max_share 0.5 of 2 slots)
            async with aiohttp.ClientSession() as s:  # the dashboard shows it running
                async with s.get(r.url + "/dashboard/data", headers={"Authorization": f"Bearer {ADMIN}"}) as d:
                    shown = (await d.json())["batches"]
            assert [(x["id"], x["client"], x["status"], x["total"]) for x in shown] == [
                (b.id, "alice", "in_progress", 20)
            ]
            cancelled = await c.batches.cancel(b.id)
            assert cancelled.status in ("cancelling", "cancelled")
            done = await finished(c, b.id)
            assert done.status == "cancelled" and done.cancelled_at is not None
            ran = done.request_counts.completed
            assert ran <= 2, done.request_counts  # the line running then, perhaps the next one
            await asyncio.sleep(0.5)
            assert (await c.batches.retrieve(b.id)).request_counts.completed == ran
            assert len(await lines_of(c, done.output_file_id)) == ran


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


async def test_lines_count_against_tokens_per_day_not_rpm(mock):
    cfg = batch_config([mock])
    cfg["client_keys"] = [{"name": "alice", "key": ALICE, "rpm": 1}, {"name": "bob", "key": BOB, "tokens_per_day": 1}]
    async with run_router(cfg) as r:
        alice, bob = client(r.url, ALICE), client(r.url, BOB)
        seen: list[tuple[str | None, str | None, int | None]] = []
        r.router.events.on_request_done(lambda rec: seen.append((rec.client, rec.batch, rec.completion_tokens)))
        fa = await alice.files.create(file=("a.jsonl", jsonl([chat(f"a{i}") for i in range(3)])), purpose="batch")
        ba = await alice.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert (await finished(alice, ba.id)).request_counts.completed == 3  # rpm 1 does not hold them back
        await alice.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "hi"}])  # rpm unspent
        assert sum(1 for c, b, t in seen if c == "alice" and b == ba.id and t) == 3  # usage, marked with the batch

        fb = await bob.files.create(file=("b.jsonl", jsonl([chat(f"b{i}") for i in range(3)])), purpose="batch")
        bb = await bob.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions", completion_window="24h")
        async with asyncio.timeout(5):  # the first line spends the day's budget: the others wait for the next day
            while (await bob.batches.retrieve(bb.id)).request_counts.completed < 1:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        now = await bob.batches.retrieve(bb.id)
        assert now.status == "in_progress" and now.request_counts.completed == 1, now.request_counts
        with pytest.raises(openai.RateLimitError):
            await bob.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "hi"}])


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


async def test_a_batch_past_its_window_expires_each_custom_id_once(monkeypatch):
    from nomyo_router.batch import objects

    monkeypatch.setattr(objects, "WINDOW_S", 1)  # (24 hours in the API: a second here)
    async with run_mock(ttft_ms=200.0, tok_ms=0.0, tokens=2) as slow, run_router(batch_config([slow])) as r:
        c = client(r.url, ALICE)
        ids = [f"c{i}" for i in range(10)]
        f = await c.files.create(file=("in.jsonl", jsonl([chat(i) for i in ids])), purpose="batch")
        b = await c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        done = await finished(c, b.id)
        assert done.status == "expired" and done.expired_at is not None
        out, err = await lines_of(c, done.output_file_id), await lines_of(c, done.error_file_id)
        assert len(out) < 10 and sorted(x["custom_id"] for x in out + err) == sorted(ids)
        assert {x["error"]["code"] for x in err} == {"batch_expired"}


def test_an_unusable_batch_file_stops_the_start_in_one_line(tmp_path):
    (tmp_path / "batch.db").write_bytes(b"\x00garbage, not SQLite\xff" * 20)
    cfg = tmp_path / "c.yaml"
    config = {"endpoints": ["http://127.0.0.1:9"], "usage_db": None, "batch": {"enabled": True, "path": "batch.db"}}
    cfg.write_text(yaml.safe_dump(config))
    r = subprocess.run(
        [sys.executable, "-m", "nomyo_router", "--config", str(cfg), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["nomyo-router: batch.path: cannot open batch.db: file is not a database"]


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


async def test_the_api_is_off_unless_enabled(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r:
        with pytest.raises(openai.NotFoundError) as off:
            await client(r.url, "anything").files.list()
        assert "batch: {enabled: true}" in off.value.message


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
