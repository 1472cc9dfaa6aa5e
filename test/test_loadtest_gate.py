"""The load tester as a CI gate: compare's per-metric thresholds, advisory metrics,
"not comparable", noise from repetitions; --repeat and --slo end to end against the mock."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from loadtest import compare as compare_mod
from loadtest.report import document, write_json
from mock import free_port
from test.loadtest_run import loadtest


def _stage(thr, p50, p99=None, ttft=10.0, err=0.0, load=8, reps=None, target="router"):
    s = {
        "target": target,
        "mode": "closed",
        "load": load,
        "request_throughput": thr,
        "median_e2el_ms": p50,
        "p99_e2el_ms": p99 if p99 is not None else p50 * 2,
        "median_ttft_ms": ttft,
        "p99_ttft_ms": ttft * 2,
        "error_rate": err,
    }
    if reps:
        s["repetitions"] = [
            {
                "request_throughput": t,
                "median_e2el_ms": p,
                "p99_e2el_ms": p * 2,
                "median_ttft_ms": ttft,
                "p99_ttft_ms": ttft * 2,
                "error_rate": err,
            }
            for t, p in reps
        ]
    return s


def _doc(*stages, model="llama3", api="ollama"):
    cfg = {"workload": {"api": api, "endpoint": "chat", "stream": True, "model": model}}
    return document(cfg, list(stages), {}, None)


def _compare(tmp_path, base, cur, *flags):
    b, c = tmp_path / "b.json", tmp_path / "c.json"
    write_json(str(b), base)
    write_json(str(c), cur)
    return compare_mod.main([str(b), str(c), *flags])


def test_per_metric_thresholds(tmp_path):
    base = _doc(_stage(100, 50, p99=100))
    cur = _doc(_stage(92, 50, p99=125))  # throughput -8%, p99 +25%
    assert _compare(tmp_path, base, cur, "--max-regression", "throughput=10%,p50=15%,p99=30%,ttft=15%") == 0
    assert _compare(tmp_path, base, cur, "--max-regression", "throughput=5%,p99=30%") == 1
    assert _compare(tmp_path, base, cur, "--max-regression", "throughput=10%,p99=20%") == 1


def test_advisory_metric_is_reported_but_never_fails(tmp_path, capsys):
    base, cur = _doc(_stage(100, 50, p99=100)), _doc(_stage(100, 50, p99=200))
    assert _compare(tmp_path, base, cur) == 1
    capsys.readouterr()
    assert _compare(tmp_path, base, cur, "--advisory", "p99") == 0
    assert "advisory" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["15", "p99=30", "p99=abc%", "latency=10%"])
def test_bare_numbers_and_unknown_metrics_are_rejected(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as e:
        _compare(tmp_path, _doc(_stage(100, 50)), _doc(_stage(100, 50)), "--max-regression", bad)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "%" in err or "unknown metric" in err


@pytest.mark.parametrize(
    "cur,why",
    [
        (_doc(_stage(100, 50, load=16)), "different stages"),
        (_doc(_stage(100, 50), _stage(100, 50, load=16)), "different stages"),
        (_doc(_stage(100, 50), model="qwen2.5:7b"), "different model"),
        (_doc(_stage(100, 50), api="openai"), "different api"),
    ],
)
def test_runs_that_cannot_be_compared_exit_2(tmp_path, capsys, cur, why):
    assert _compare(tmp_path, _doc(_stage(100, 50)), cur) == 2
    out = capsys.readouterr().out
    assert "NOT COMPARABLE" in out and why in out
    if why == "different stages":  # the stage lists, brackets and all (not eaten as markup)
        assert re.search(r"baseline \[router:\S+:8\], current \[router:\S+:(8 router:\S+:)?16\]", out), out


@pytest.mark.parametrize("content", [b"not json at all", b"\xff\xfe binary", b"[1, 2]"], ids=["text", "binary", "list"])
def test_a_file_that_is_not_a_report_is_named(tmp_path, capsys, content):
    good, bad = tmp_path / "good.json", tmp_path / "[bad].json"
    good.write_text(json.dumps(_doc(_stage(100, 50))))
    bad.write_bytes(content)
    assert compare_mod.main([str(good), str(bad)]) == 2
    out = capsys.readouterr().out
    assert f"compare: {bad}: " in out.replace("\n", ""), out


def test_a_change_within_the_noise_of_repetitions_passes(tmp_path, capsys):
    """Medians differ by 20%, but the repetitions overlap: the change is noise."""
    base = _doc(_stage(100, 50, reps=[(70, 50), (100, 50), (130, 50), (90, 50), (115, 50)]))
    cur = _doc(_stage(80, 50, reps=[(60, 50), (80, 50), (125, 50), (75, 50), (95, 50)]))
    assert _compare(tmp_path, base, cur) == 0
    assert "within noise" in capsys.readouterr().out
    # the same medians with tight repetitions: a regression
    base = _doc(_stage(100, 50, reps=[(99, 50), (100, 50), (101, 50)]))
    cur = _doc(_stage(80, 50, reps=[(79, 50), (80, 50), (81, 50)]))
    assert _compare(tmp_path, base, cur) == 1


def test_noise_interval_statistics():
    from loadtest.noise import change_interval, spread

    point, lo, hi = change_interval([100, 101, 99, 100, 102], [120, 119, 121, 122, 120])
    assert point == pytest.approx(0.2) and 0.15 < lo <= point <= hi < 0.25
    point, lo, hi = change_interval([100, 60, 140], [120, 70, 150])
    assert lo < 0 < hi
    s = spread([{"request_throughput": 10}, {"request_throughput": 12}, {"request_throughput": 11}])
    assert s["request_throughput"] == {"median": 11.0, "min": 10, "max": 12, "rel_spread": round(2 / 11, 4)}


def _run(*args, timeout=180):
    return subprocess.run(
        [
            sys.executable,
            "loadtest.py",
            "--mock-backend",
            "--quiet",
            "--mock-port",
            str(free_port()),
            "--router-port",
            str(free_port()),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_repeat_records_repetitions_and_compare_reads_them(tmp_path):
    out = tmp_path / "a.json"
    p = _run("--ramp", "2,4", "--duration", "0.3", "--warmup", "0.1", "--repeat", "3", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["config"]["workload"] == {
        "api": "ollama",
        "endpoint": "chat",
        "stream": True,
        "model": "llama3",
        "dataset": None,
        "trace": None,
    }
    for s in doc["stages"]:
        assert len(s["repetitions"]) == 3
        assert all(r["request_throughput"] > 0 for r in s["repetitions"])
        sp = s["spread"]["request_throughput"]
        assert sp["min"] <= sp["median"] <= sp["max"]
        assert s["completed"] >= sum(1 for _ in s["repetitions"])
    # a run against itself never regresses; a stage this shared machine flagged is not comparable (3)
    assert compare_mod.main([str(out), str(out)]) == (3 if compare_mod.busy_stages(doc, doc) else 0)
    assert compare_mod.main([str(out), str(out), "--strict"]) == 0


def test_slo_goodput_and_exit_code(tmp_path):
    """The mock answers in ~52 ms (20 ms TTFT + 32 x 1 ms): an SLO of 1 s is met by every
    request, one of 10 ms TTFT by none — exit 1 with the SLO named in the last line."""
    out = tmp_path / "slo.json"
    p = _run(
        "--concurrency", "2", "--duration", "0.4", "--warmup", "0.1", "--slo", "ttft=1s,e2el=2s", "--json", str(out)
    )
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads(out.read_text())["stages"][0]
    assert s["slo_met_share"] == 1.0 and s["goodput"] == s["request_throughput"] > 0
    assert "good/s" in p.stdout
    p = _run("--concurrency", "2", "--duration", "0.4", "--warmup", "0.1", "--slo", "ttft=10ms")
    assert p.returncode == 1
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("FAILED:") and "SLO ttft=10ms" in last and "met by 0.0%" in last


@pytest.mark.parametrize("bad", ["ttft=500", "speed=1s", "ttft=-1s"])
def test_bad_slo_is_refused(bad):
    p = subprocess.run([sys.executable, "loadtest.py", "--slo", bad], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--slo" in p.stderr


def test_find_max_rate_finds_the_slo_limited_rate_within_one_step(tmp_path):
    """8 slots x 400 ms = 20 req/s. With e2el <= 700 ms a request may wait 300 ms (slack
    for a scheduling hiccup of this shared machine); above capacity the wait grows by
    (1/20 - 1/r) per request sent, so in a 2 s stage >= 95% of requests meet the SLO while
    r <= 20 / (1 - 0.3 / (0.95 * 2)) = 23.75 req/s: the SLO-limited rate. The search must
    bracket it and answer within one bisection step."""
    from mock import MockConfig, MockProcess

    out = tmp_path / "search.json"
    with MockProcess(MockConfig(ttft_ms=400.0, tokens=1, tok_ms=0.0, parallel=8, max_queue=10_000)) as m:
        doc, p = loadtest(
            "--url",
            m.url,
            "--no-stream",
            "--slo",
            "e2el=700ms",
            "--find-max-rate",
            "15,30",
            "--search-stages",
            "5",
            "--duration",
            "2",
            "--warmup",
            "0",
            json_out=out,
            timeout=180,
        )
    r = doc["max_rate"]
    truth = 20 / (1 - 0.3 / (0.95 * 2))
    good, bad = r["bracket"]
    assert r["stages"] <= 5 and r["max_rate"] == good
    probes = {q["rate"]: q["pass"] for q in r["probes"]}
    assert probes[15] and not probes[30]
    assert all(ok == (rate <= good) for rate, ok in probes.items())  # one consistent boundary
    assert abs(good - truth) <= (bad - good) + 0.5, r  # within one step of the SLO-limited rate
    assert "max rate at SLO e2el=700ms" in p.stdout
