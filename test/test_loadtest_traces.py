"""Real traces and arrival shapes against the mock over real sockets: Mooncake `hash_ids`
(prefix reuse the mock's KV cache sees), BurstGPT CSV (count and timing), gamma arrivals
(burstiness), `--timeslice` (slices add up to the stage), and an unknown `--model` (exit 2
within seconds, naming it and the models served)."""

from __future__ import annotations

import itertools
import json
import random
import statistics
import subprocess
import sys
import time

import pytest

from loadtest.blocks import block_text, prompt_from_blocks
from loadtest.dataset import Trace
from loadtest.engine import Stage, arrival_gaps, run_stage
from loadtest.metrics import summarize
from loadtest.workload import WorkloadSpec
from mock import MockConfig, MockProcess, run_mock
from test.loadtest_run import loadtest, mock_kv


def _jsonl(path, rows) -> str:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_blocks_are_fixed_by_their_id():
    assert block_text(7, 512) == block_text(7, 512) and len(block_text(7, 512)) == 512 * 4
    assert block_text(7, 512)[:40] != block_text(8, 512)[:40]  # different from the first words on
    a = prompt_from_blocks([1, 2, 3], 1400, 512, "a")
    b = prompt_from_blocks([1, 2, 9], 1500, 512, "b")
    assert len(a) == 1400 * 4 and len(b) == 1500 * 4
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert 1024 * 4 <= shared < 1024 * 4 + 40  # exactly the two shared blocks (plus a chance letter)
    short = prompt_from_blocks([5], 1300, 512, "c")  # a list shorter than ceil(1300/512): own text
    assert short.startswith(block_text(5, 512)) and len(short) == 1300 * 4
    assert short[2048:2100] != prompt_from_blocks([5], 1300, 512, "d")[2048:2100]


MOONCAKE = [  # (ms, input_length, hash_ids): what each request shares with the earlier ones
    (0, 1400, [1, 2, 3]),
    (150, 1500, [1, 2, 4]),  # blocks 1, 2: 1024 tokens
    (300, 700, [1, 5]),  # block 1: 512 tokens
    (450, 1024, [6, 7]),  # nothing
    (600, 1400, [1, 2, 3]),  # the whole first prompt: 1400 tokens
]
SHARED = [0, 1024, 512, 0, 1400]


async def test_mooncake_hash_ids_give_the_backend_the_traces_prefix_reuse(tmp_path):
    """The mock caches whole blocks of 64 tokens of its chat text ("<user>" + content + "\\n"),
    so a request finds the shared tokens of the trace rounded down to 64: 1024 + 512 + 0 +
    1344 tokens, and every prompt has its trace length (+2 tokens of role markup)."""
    path = _jsonl(
        tmp_path / "mooncake.jsonl",
        [{"timestamp": t, "input_length": n, "output_length": 2, "hash_ids": ids} for t, n, ids in MOONCAKE],
    )
    trace = Trace(path)
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=8) as m:
        s = summarize(
            await run_stage(
                m.url, WorkloadSpec(trace=trace), Stage("trace", trace.mean_rate, duration=None, warmup=0.0), 30
            )
        )
        kv = await mock_kv(m.url)
    assert s["completed"] == 5 and s["total_output_tokens"] == 10
    assert kv["hit_tokens"] == sum(n // 64 * 64 for n in SHARED)
    assert kv["hit_tokens"] + kv["miss_tokens"] == sum(n + 2 for _, n, _ in MOONCAKE)
    assert kv["hits"] == 3 and kv["misses"] == 2
    assert s["lateness"]["p99_ms"] < 100


def test_mooncake_block_size_from_the_command_line(tmp_path):
    """--trace-block-tokens 128: two ids shared are 256 tokens shared."""
    path = _jsonl(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1, 2, 3, 4]},
            {"timestamp": 200, "input_length": 512, "output_length": 1, "hash_ids": [1, 2, 8, 9]},
        ],
    )
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=2)) as m:
        p = subprocess.run(
            [sys.executable, "loadtest.py", "--url", m.url, "--trace", path, "--trace-block-tokens", "128", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        with __import__("urllib.request").request.urlopen(m.url + "/mock/stats") as r:
            kv = json.load(r)["kv_cache"]
    assert p.returncode == 0, p.stdout + p.stderr
    assert kv["hit_tokens"] == 256 and "sent late by" in p.stdout


BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,120,3,123,Conversation log
5.1,GPT-4,40,0,40,Conversation log
5.35,ChatGPT,300,5,305,API log
5.4,ChatGPT,80,2,82,Conversation log
5.9,GPT-4,64,4,68,API log
6.3,ChatGPT,10,1,11,Conversation log
"""


async def test_burstgpt_replays_every_row_at_its_time(tmp_path):
    """Six rows over 1.3 s at --trace-speed 2: six requests, each sent within a few ms of
    its row's time / 2; output limits from `Response tokens` (0, a failed request in
    BurstGPT, becomes 1); `Model` is not what is sent."""
    path = tmp_path / "burst.csv"
    path.write_text(BURST)
    trace = Trace(str(path), speed=2.0)
    assert [e.at for e in trace.entries] == pytest.approx([0, 0.1, 0.35, 0.4, 0.9, 1.3])
    assert [e.input_tokens for e in trace.entries] == [120, 40, 300, 80, 64, 10]
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=9) as m:
        run = await run_stage(
            m.url,
            WorkloadSpec(trace=trace, model="llama3"),
            Stage("trace", trace.mean_rate, duration=None, warmup=0.0),
            30,
        )
    s = summarize(run)
    assert s["completed"] == 6 and s["total_output_tokens"] == 3 + 1 + 5 + 2 + 4 + 1
    sent = sorted(r.start + r.send_lag - run.t0 for r in run.results)
    want = [e.at / 2 for e in trace.entries]
    assert all(abs(a - b) < 0.05 for a, b in zip(sent, want, strict=True)), (sent, want)


def test_burstgpt_from_the_command_line_by_its_header(tmp_path):
    """Recognised by its header even without the .csv name."""
    path = tmp_path / "burst.log"
    path.write_text(BURST)
    out = tmp_path / "o.json"
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=9)) as m:
        doc, _ = loadtest(
            "--url",
            m.url,
            "--trace",
            str(path),
            "--trace-speed",
            "4",
            json_out=out,
        )
    s = doc["stages"][0]
    assert s["mode"] == "trace" and s["completed"] == 6 and s["failed"] == 0
    assert s["lateness"]["late_share"] is not None


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_rate_and_a_cv_of_one_over_root_b(burstiness):
    gap = arrival_gaps(Stage("open", 50.0, arrival="gamma", burstiness=burstiness), random.Random(1))
    gaps = [gap() for _ in range(40_000)]
    mean = statistics.fmean(gaps)
    cv = statistics.pstdev(gaps) / mean
    assert mean == pytest.approx(1 / 50, rel=0.03)
    assert cv == pytest.approx(1 / burstiness**0.5, rel=0.05)


@pytest.mark.alone
async def test_gamma_arrivals_on_the_wire_are_bursty():
    """The sends themselves (not only the drawn gaps): B = 0.25 gives a CV near 2, B = 4 near 0.5."""
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=1) as m:
        cvs = {}
        for b in (0.25, 4.0):
            run = await run_stage(
                m.url,
                WorkloadSpec(stream=False),
                Stage("open", 150.0, duration=2.0, warmup=0.0, arrival="gamma", burstiness=b, seed=3),
                30,
            )
            sent = sorted(r.start + r.send_lag for r in run.results)
            gaps = [y - x for x, y in itertools.pairwise(sent)]
            cvs[b] = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert 1.5 < cvs[0.25] < 2.6 and 0.3 < cvs[4.0] < 0.75, cvs


def test_burstiness_needs_gamma_arrivals():
    p = subprocess.run(
        [sys.executable, "loadtest.py", "--rate", "5", "--burstiness", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "--arrival gamma" in p.stdout


def test_timeslices_add_up_to_the_stage(tmp_path):
    """Closed loop with 20% of answers a 503, two repetitions, 0.15 s slices of a 0.5 s window:
    per repetition four slices (the last 0.05 s), whose counts, completions and errors sum
    to the stage's."""
    out = tmp_path / "o.json"
    with MockProcess(MockConfig(ttft_ms=10.0, tok_ms=1.0, tokens=4, busy_rate=0.2)) as m:
        doc, _ = loadtest(
            "--url",
            m.url,
            "--concurrency",
            "4",
            "--duration",
            "0.5",
            "--warmup",
            "0.1",
            "--repeat",
            "2",
            "--timeslice",
            "0.15",
            "--max-error-rate",
            "1",
            json_out=out,
        )
    s = doc["stages"][0]
    slices = s["timeslices"]
    assert s["timeslice_s"] == 0.15 and [t["repetition"] for t in slices] == [1] * 4 + [2] * 4
    assert sum(t["count"] for t in slices) == s["requests"]
    assert sum(t["completed"] for t in slices) == s["completed"]
    assert sum(t["errors"] for t in slices) == s["failed"] > 0
    for t in slices:
        assert set(t) >= {
            "count",
            "throughput",
            "errors",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "latency_p50_ms",
            "latency_p99_ms",
        }
        assert t["throughput"] == pytest.approx(t["completed"] / t["duration_s"], rel=1e-2)
    assert [t["duration_s"] for t in slices[:4]] == pytest.approx([0.15, 0.15, 0.15, 0.05], abs=0.01)


@pytest.mark.parametrize("api,listing", [("ollama", "/api/tags"), ("openai", "/v1/models")])
def test_an_unknown_model_exits_2_within_seconds_naming_it_and_the_served_ones(api, listing):
    with MockProcess(MockConfig(models=["llama3", "qwen2.5:7b"])) as m:
        t = time.monotonic()
        p = subprocess.run(
            [sys.executable, "loadtest.py", "--url", m.url, "--api", api, "--model", "lama3", "--duration", "30"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - t
    assert p.returncode == 2, p.stdout + p.stderr
    assert took < 8  # interpreter start included; the 30 s stage never ran
    msg = " ".join(p.stdout.split())
    assert "'lama3' is not served" in msg and listing in msg
    assert ("llama3:latest, qwen2.5:7b" if api == "ollama" else "llama3, qwen2.5:7b") in msg
    assert "req/s" not in p.stdout  # no stage table: nothing was sent


def test_llama3_is_llama3_latest():
    from loadtest.models import same_model

    assert same_model("llama3", "llama3:latest") and not same_model("llama3", "llama3:8b")
