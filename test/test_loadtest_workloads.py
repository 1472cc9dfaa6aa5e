"""Workloads from files against the mock over real sockets: --dataset (prompts, chat
histories, output lengths, with --turns) and --trace replay (sessions, --trace-speed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loadtest.dataset import Dataset, Trace
from loadtest.engine import Stage, run_stage
from loadtest.metrics import summarize
from loadtest.workload import WorkloadSpec
from mock import MockConfig, MockProcess, run_mock
from test.loadtest_run import loadtest, mock_kv


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


async def test_dataset_prompts_histories_and_output_lengths(tmp_path):
    path = _write(
        tmp_path / "d.jsonl",
        [
            {"prompt": "Why is the sky blue?", "output_tokens": 3},
            {
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                "output_tokens": 5,
            },
            {"prompt": "No length given"},
        ],
    )
    ds = Dataset(path)
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=7) as m:
        for api in ("ollama", "openai"):
            spec = WorkloadSpec(api=api, dataset=ds)
            s = summarize(await run_stage(m.url, spec, Stage("closed", 1, duration=None, requests=6, warmup=0.0), 30))
            assert s["completed"] == 6 and s["failed"] == 0
            assert s["total_output_tokens"] == 2 * (3 + 5 + 7)  # each line's length, cycling


async def test_dataset_opens_conversations_with_turns(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "x " * 400}], "output_tokens": 4}])
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=8) as m:
        spec = WorkloadSpec(dataset=Dataset(path), turns=3)
        s = summarize(await run_stage(m.url, spec, Stage("closed", 1, duration=None, requests=6, warmup=0.0), 30))
        kv = await mock_kv(m.url)
    assert s["completed"] == 6 and s["total_output_tokens"] == 24
    assert set(s["turns"]) == {"1", "2", "3"}
    assert kv["hit_tokens"] > 0  # turns 2 and 3 carry the dataset's history: a prefix the mock has seen


@pytest.mark.parametrize(
    "rows,msg",
    [
        ([{"output_tokens": 3}], 'needs "prompt"'),
        ([{"prompt": "a", "output_tokens": -1}], "output_tokens must be"),
        ([{"messages": "hello"}], '"messages" must be'),
    ],
)
def test_bad_dataset_lines_name_file_and_line(tmp_path, rows, msg):
    path = _write(tmp_path / "bad.jsonl", [{"prompt": "fine"}] + rows)
    with pytest.raises(ValueError, match=msg) as e:
        Dataset(path)
    assert "bad.jsonl:2" in str(e.value)


async def test_trace_replay_keeps_sessions_and_sizes(tmp_path):
    path = _write(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 0, "input_tokens": 300, "output_tokens": 2, "session_id": "a"},
            {"timestamp": 400, "input_tokens": 500, "output_tokens": 3, "session_id": "a"},
            {"timestamp": 100, "input_tokens": 200, "output_tokens": 4, "session_id": "b"},
            {"arrival": 0.6, "input_length": 100, "output_length": 5},
        ],
    )
    trace = Trace(path, speed=2.0)
    assert [e.at for e in trace.entries] == [0.0, 0.1, 0.4, 0.6] and trace.span == pytest.approx(0.3)
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=9) as m:
        spec = WorkloadSpec(trace=trace, session_header="X-Session")
        s = summarize(await run_stage(m.url, spec, Stage("trace", trace.mean_rate, duration=None, warmup=0.0), 30))
        kv = await mock_kv(m.url)
    assert s["completed"] == 4 and s["total_output_tokens"] == 2 + 3 + 4 + 5
    # session a's second request carries its first prompt and answer: about 300 of its
    # 500 tokens are a prefix the mock has cached
    assert kv["hit_tokens"] >= 200
    history = trace.histories["a"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert len(history[0]["content"]) + len(history[1]["content"]) + len(history[2]["content"]) >= 500 * 4 - 8


def test_trace_with_turns_from_the_command_line(tmp_path):
    path = _write(
        tmp_path / "t.jsonl",
        [{"timestamp": t, "input_tokens": 50, "output_tokens": 2, "session_id": f"s{t}"} for t in (0, 50, 100)],
    )
    out = tmp_path / "o.json"
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=4)) as m:
        doc, _ = loadtest(
            "--url",
            m.url,
            "--trace",
            path,
            "--turns",
            "2",
            "--trace-speed",
            "4",
            json_out=out,
            timeout=120,
        )
    s = doc["stages"][0]
    assert s["mode"] == "trace" and s["completed"] == 6 and s["total_output_tokens"] == 12
    assert set(s["turns"]) == {"1", "2"}


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--dataset", "/nonexistent.jsonl"], "No such file"),
        (["--trace", "T", "--ramp", "1,2"], "leave out --rate and --ramp"),
    ],
)
def test_file_workload_errors_exit_2(tmp_path, args, msg):
    args = [a if a != "T" else _write(tmp_path / "t.jsonl", [{"arrival": 0}]) for a in args]
    p = subprocess.run([sys.executable, "loadtest.py", "--quiet", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and msg in p.stdout


def test_request_options_go_where_each_api_reads_them():
    from loadtest.options import build_parser

    args = build_parser().parse_args(
        ["--request-option", "temperature=0", "--request-option", "seed=7", "--max-tokens", "5"]
    )
    opts = dict(args.request_option)
    assert opts == {"temperature": 0, "seed": 7}
    ollama = json.loads(WorkloadSpec(options=opts, max_tokens=5).body())
    assert ollama["options"] == {"temperature": 0, "seed": 7, "num_predict": 5}
    openai = json.loads(WorkloadSpec(api="openai", options=opts, max_tokens=5).body())
    assert openai["temperature"] == 0 and openai["seed"] == 7 and openai["max_tokens"] == 5
