"""compare on a busy machine: identical runs under CPU burners never fail, a 2x slower server
always does (with --strict), and flagged stages are 'not comparable on this machine' (exit 3).

Two real runs at once under burners, each stage repeated: one against a mock with 6
repetitions, whose 20 ways of splitting into 3 + 3 repetitions are 20 pairs of identical
runs, and one with 3 against a mock twice as slow."""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys

import pytest

from loadtest import compare as compare_mod
from loadtest.report import write_json
from mock import MockConfig, MockProcess
from test.loadtest_run import ROOT

BURN = "import time\nt = time.time() + 60\nwhile time.time() < t: pass\n"


def _start(out, url, repeat):
    return subprocess.Popen(
        [sys.executable, "loadtest.py", "--url", url, "--quiet", "--concurrency", "8", "--duration", "0.35"]
        + ["--warmup", "0.1", "--repeat", str(repeat), "--max-error-rate", "1", "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )


def _done(p, out):
    said, _ = p.communicate(timeout=120)
    assert p.returncode == 0, said
    return json.loads(out.read_text())


def _half(doc, picks):
    d = copy.deepcopy(doc)
    for s in d["stages"]:
        s["repetitions"] = [s["repetitions"][i] for i in picks]
    return d


def _rc(tmp_path, base, cur, *flags):
    b, c = tmp_path / "b.json", tmp_path / "c.json"
    write_json(str(b), base)
    write_json(str(c), cur)
    return compare_mod.main([str(b), str(c), *flags])


@pytest.mark.alone
def test_busy_machine_identical_runs_pass_and_a_2x_slower_mock_fails(tmp_path, capsys):
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 1)]
    try:
        # both runs at once (the busier for it): the server, and one twice as slow
        with (
            MockProcess(MockConfig(ttft_ms=20.0, tokens=32, tok_ms=1.0, parallel=4096)) as m,
            MockProcess(MockConfig(ttft_ms=40.0, tokens=32, tok_ms=2.0, parallel=4096)) as m2,
        ):
            runs = [(_start(tmp_path / f"{n}.json", u, k), tmp_path / f"{n}.json") for n, u, k in
                    (("same", m.url, 6), ("slow", m2.url, 3))]  # fmt: skip
            same, slow = (_done(p, out) for p, out in runs)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    splits = list(itertools.combinations(range(6), 3))
    assert len(splits) == 20
    flagged = bool(compare_mod.busy_stages(same, slow))
    same_rc, strict_rc, slow_rc, slow_default_rc = [], [], [], []
    for k, picks in enumerate(splits):
        rest = [i for i in range(6) if i not in picks]
        base, cur = _half(same, picks), _half(same, rest)
        strict_rc.append(_rc(tmp_path, base, cur, "--strict"))
        slow_rc.append(_rc(tmp_path, base, slow, "--strict"))
        if k % 4 == 0:  # without --strict: five pairs of each suffice to show the exit code
            same_rc.append(_rc(tmp_path, base, cur))
            slow_default_rc.append(_rc(tmp_path, base, slow))
    out = capsys.readouterr().out
    assert strict_rc == [0] * 20, out  # identical runs pass 20 of 20, flags or not
    assert slow_rc == [1] * 20, out  # a 2x slower server fails 20 of 20
    assert 1 not in same_rc  # identical runs never read as a regression
    if compare_mod.busy_stages(same, same):
        assert same_rc == [3] * 5 and "NOT COMPARABLE ON THIS MACHINE" in out
    # without --strict a flagged stage is not comparable: exit 3, never 1
    assert slow_default_rc == ([3] * 5 if flagged else [1] * 5)


def test_a_flagged_stage_is_not_comparable_unless_strict(tmp_path, capsys):
    def doc(p50, flag):
        s = {"target": "router", "mode": "closed", "load": 8, "request_throughput": 100, "median_e2el_ms": p50}
        s.update({"p99_e2el_ms": p50 * 2, "median_ttft_ms": 10, "p99_ttft_ms": 20, "error_rate": 0.0})
        s["client"] = {"bottleneck": flag == "client", "machine_bound": flag == "machine"}
        return {"schema": "nomyo-loadtest/1", "config": {}, "stages": [s]}

    assert _rc(tmp_path, doc(50, None), doc(100, "machine")) == 3
    out = capsys.readouterr().out
    assert "NOT COMPARABLE ON THIS MACHINE" in out and "router 8: MACHINE-BUSY in current" in out
    assert _rc(tmp_path, doc(50, "client"), doc(50, None)) == 3
    assert "CLIENT-BOUND in baseline" in capsys.readouterr().out
    assert _rc(tmp_path, doc(50, None), doc(100, "machine"), "--strict") == 1
    assert _rc(tmp_path, doc(50, None), doc(50, None)) == 0
