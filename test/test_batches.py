"""The Batch API with the official `openai` SDK against the mock: files and batches round trip
(chat and embeddings), each custom_id once in the output or error file, bad lines in the error
file, a malformed file fails the batch with `errors`, cancel, expiry, another key's 404s,
tokens_per_day and not rpm, /metrics and the dashboard. (The runner: test_batch_runner.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
import openai
import pytest
import yaml

from mock import run_mock
from test.batch_api import ADMIN, ALICE, BOB, batch_config, chat, client, finished, jsonl, lines_of
from test.helpers import endpoints, run_router


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


async def test_the_api_is_off_unless_enabled(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r:
        with pytest.raises(openai.NotFoundError) as off:
            await client(r.url, "anything").files.list()
        assert "batch: {enabled: true}" in off.value.message
