"""Agent sessions: a session trace replayed with think time between turns and tool output
appended, through the router to two mocks, with and without its affinity: per-turn TTFT and
the prefix-cache hit rate the backend reports (the mock's usage.cached_tokens) differ."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from selenium.webdriver.common.by import By

from loadtest.sessions import parse_think
from loadtest.workload import Conversation, WorkloadSpec
from mock import free_port
from test.loadtest_run import ROOT, loadtest
from test.test_loadtest_html import assert_no_overlap

NO_AFFINITY = ("--router-set", "conversation_affinity=false", "--router-set", "routing=least_busy")


def _trace(path, sessions=12, turns=4):
    """Sessions that overlap, with think times of 20-99 ms that differ by session and turn, so
    a router balancing by load without affinity sends a session's turns to either mock."""

    def rest(i):
        return [
            {"delay_ms": (17 * i + 29 * k) % 80 + 20, "tool_tokens": 100, "output_tokens": 8} for k in range(turns - 1)
        ]

    lines = [
        {
            "session_id": f"s{i}",
            "timestamp": (i % 4) * 10,
            "turns": [{"input_tokens": 400, "output_tokens": 8}, *rest(i)],
        }
        for i in range(sessions)
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def _run(tmp_path, trace, *extra):
    doc, p = loadtest(
        *("--mock-backend", "--mock-count", "2", "--api", "openai", "--trace", str(trace)),
        *("--mock-prefill-ms-per-1k-tokens", "100", "--mock-port", str(free_port())),
        *("--router-port", str(free_port()), *extra),
        json_out=tmp_path / "s.json",
        timeout=120,
    )
    return doc, p


def test_session_replay_with_think_time_and_affinity(tmp_path, browser):
    trace, page = _trace(tmp_path / "agents.jsonl"), tmp_path / "s.html"
    pinned, p = _run(tmp_path, trace, "--html", str(page))
    spread, _ = _run(tmp_path, trace, *NO_AFFINITY)
    a, b = pinned["stages"][0]["sessions"], spread["stages"][0]["sessions"]
    for f in (a, b):
        assert f["sessions"] == 12 and f["turns_max"] == 4 and f["turns_mean"] == 4
        assert [t["turn"] for t in f["per_turn"]] == [1, 2, 3, 4]
        assert all(t["completed"] == 12 and t["ttft_p50_ms"] > 0 for t in f["per_turn"])
        assert f["cache_source"].startswith("openai")
        assert f["per_turn"][0]["cache_hit_rate"] == 0.0  # nothing of a session is cached before it
        # think time: every turn waited at least its delay after the previous answer
        for s in f["listed"]:
            i = int(s["id"][1:])
            assert [w >= ((17 * i + 29 * k) % 80 + 20) / 1000 for k, w in enumerate(s["think_s"])] == [True] * 3
        # the prompt grows by the answer, 100 tokens of tool output and the new text each turn
        sizes = [t["prompt_tokens_mean"] for t in f["per_turn"]]
        assert sizes == sorted(sizes) and sizes[1] - sizes[0] >= 100
    # pinned to the mock holding its history, a session's later turns find most of it cached
    # (78% measured); spread by load, a turn moves to the other mock about every other time
    # and finds less there (48-53% in 4 runs)
    assert set(a["by_affinity"]) == {"hit"} and "hit" not in b["by_affinity"]
    assert a["cache_hit_rate_turn2plus"] >= b["cache_hit_rate_turn2plus"] + 0.1
    # the mock's own counters agree with what its answers reported
    assert pinned["config"]["mock_kv_cache"]["hit_rate"] == pytest.approx(a["cache_hit_rate"], abs=0.01)
    assert "12 sessions, 4 turns on average; TTFT p50 by turn" in p.stdout
    browser.get(page.as_uri())
    charts = {c.get_attribute("data-title"): c for c in browser.find_elements(By.CSS_SELECTOR, "svg.chart")}
    for title, series in (("TTFT by turn", 2), ("prefix-cache hits by turn", 1)):
        c = next(v for k, v in charts.items() if k.endswith(title))
        assert len(c.find_elements(By.CSS_SELECTOR, "circle.pt")) == 4 * series  # a point per turn
    assert "Sessions" in browser.find_element(By.TAG_NAME, "body").text
    assert_no_overlap(browser)


def test_think_and_tool_options():
    t = parse_think("2000:gamma:0.5")
    assert (t.mean_ms, t.dist, t.shape) == (2000, "gamma", 0.5)
    draws = [t.seconds() for _ in range(4000)]
    assert 1.8 < sum(draws) / len(draws) < 2.2
    assert parse_think("1500").seconds() == 1.5
    for bad in ("fast", "100:weibull", "100:poisson:2", "-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_think(bad)
    spec = WorkloadSpec(turns=3, tool_tokens=50)
    conv = Conversation(spec, 0, 0)
    before = conv.prompt_tokens
    conv.record("an answer")
    assert "[tool output" in conv.messages[-1]["content"] and conv.prompt_tokens >= before + 50
    p = subprocess.run(
        [sys.executable, "loadtest.py", "--think-ms", "100"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert p.returncode == 2 and "--turns" in p.stdout


def test_a_bad_session_line_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": "a", "turns": [{"input_tokens": 10}]}\n{"session_id": "b", "turns": []}\n')
    p = subprocess.run(
        [sys.executable, "loadtest.py", "--trace", str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert p.returncode == 2 and f"{bad}:2" in p.stdout and "turns" in p.stdout


async def test_the_mock_counts_prompt_eval_as_ollama_does_when_asked():
    """With eval_count_uncached, Ollama's prompt_eval_count leaves out the prompt tokens its KV
    cache held; the switch goes through the mock's command line both ways."""
    import aiohttp

    from mock import run_mock
    from mock.config import MockConfig as Config
    from mock.runner import config_args

    assert "--eval-count-uncached" in config_args(Config(eval_count_uncached=True))
    assert "--no-eval-count-uncached" in config_args(Config())
    history = [{"role": "user", "content": "tell me about the sea " * 60}]
    async with run_mock(tokens=4, tok_ms=0, ttft_ms=0, eval_count_uncached=True) as m, aiohttp.ClientSession() as s:
        counts = []
        for _ in range(2):
            body = {"model": "llama3", "messages": history, "stream": False}
            async with s.post(m.url + "/api/chat", json=body) as r:
                counts.append((await r.json())["prompt_eval_count"])
        kv = (await (await s.get(m.url + "/mock/stats")).json())["kv_cache"]
    assert counts[0] > 300 and counts[1] == counts[0] - kv["hit_tokens"] < counts[0] // 4
