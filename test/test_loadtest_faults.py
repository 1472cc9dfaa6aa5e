"""Faults on a schedule: a spawned mock killed and restarted during a run shows in the JSON,
the terminal and the HTML report (marked on the timeline, with its recovery time); bad
--fault values exit 2; a fault on a server the load tester did not spawn calls the hook."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from selenium.webdriver.common.by import By

from loadtest.faults import parse
from mock import MockConfig, MockProcess, free_port
from test.loadtest_run import ROOT, loadtest
from test.test_loadtest_html import assert_no_overlap


def test_kill_and_restart_of_a_spawned_mock_with_its_recovery(tmp_path, browser):
    page = tmp_path / "f.html"
    doc, p = loadtest(
        *("--mock-backend", "--rate", "40", "--duration", "3", "--warmup", "0.5", "--max-error-rate", "1"),
        *("--fault", "1.5s:kill:mock-1", "--fault", "2.5s:restart:mock-1", "--html", str(page)),
        *("--mock-port", str(free_port()), "--router-port", str(free_port())),
        json_out=tmp_path / "f.json",
        timeout=120,
    )
    kill, restart = doc["faults"]
    assert kill["fault"] == "1.5s:kill:mock-1" and kill["ok"] and restart["ok"]
    assert 1.4 < kill["at_s"] < 2.0 and 2.4 < restart["at_s"] < 3.0
    assert kill["level_before"]["requests"] > 20 and kill["level_before"]["error_share"] <= 0.05
    # the only mock is gone: requests fail until it is back, so the kill never recovers by itself
    assert kill["errors"] > 5 and kill["error_recovery_s"] is None and kill["recovered_s"] is None
    # after the restart, error rate and p99 return to the level before the kill, within the run
    assert restart["level_before"] == kill["level_before"]
    assert restart["recovered_s"] is not None and 0 <= restart["recovered_s"] < restart["horizon_s"]
    assert kill["router_retries"] is not None and restart["router_resumed"] is not None  # read from /metrics
    assert doc["stages"][0]["errors"] and [f["label"] for f in doc["stages"][0]["faults"]] == [
        "kill mock-1",
        "restart mock-1",
    ]
    assert "fault 2.5s:restart:mock-1 at" in p.stdout and "p99 back to" in p.stdout
    browser.get(page.as_uri())
    timeline = next(
        c for c in browser.find_elements(By.CSS_SELECTOR, "svg.chart") if "over time" in c.get_attribute("data-title")
    )
    labels = [t.text for t in timeline.find_elements(By.CSS_SELECTOR, "text.marklabel")]
    assert labels == ["kill mock-1", "restart mock-1"]
    assert len(timeline.find_elements(By.CSS_SELECTOR, "line.mark")) == 2 * 2  # both panels
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Faults" in body and "2.5s:restart:mock-1" in body
    assert_no_overlap(browser)


@pytest.mark.parametrize(
    "bad,why",
    [
        ("30:kill", "TIME:ACTION:TARGET"),
        ("soon:kill:mock-1", "not like 30s"),
        ("1s:explode:mock-1", "unknown action"),
        ("1s:slow:mock-1", "slow needs a factor"),
        ("1s:kill:mock-1:x2", "only slow takes a factor"),
    ],
)
def test_bad_faults_are_refused(bad, why):
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        parse(bad)


def test_a_bad_fault_exits_2():
    p = subprocess.run(
        [sys.executable, "loadtest.py", "--mock-backend", "--fault", "1s:explode:mock-1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 2 and "unknown action" in p.stderr, p.stderr


def test_fault_on_a_server_not_spawned_needs_and_calls_the_hook(tmp_path):
    p = subprocess.run(
        [sys.executable, "loadtest.py", "--fault", "1s:kill:gpu-1"], capture_output=True, text=True, cwd=ROOT
    )
    assert p.returncode == 2 and "--fault-hook" in p.stdout
    said = tmp_path / "hook.txt"
    hook = f'echo "$NOMYO_FAULT_ACTION $NOMYO_FAULT_TARGET $NOMYO_FAULT_FACTOR" >> {said}; echo slowed it'
    with MockProcess(MockConfig(ttft_ms=5.0, tokens=2, tok_ms=1.0, parallel=64)) as m:
        doc, _ = loadtest(
            *("--url", m.url, "--rate", "20", "--duration", "0.8", "--warmup", "0"),
            *("--fault", "0.3s:slow:gpu-1:x3", "--fault-hook", hook),
            json_out=tmp_path / "h.json",
        )
    assert said.read_text().split() == ["slow", "gpu-1", "3"]
    (f,) = doc["faults"]
    assert f["ok"] and f["detail"] == "hook: slowed it" and f["router_retries"] is None  # a mock has no router metrics


def test_a_killed_mock_does_not_break_the_cache_report():
    from loadtest.prefix import kv_stats

    dead = f"http://127.0.0.1:{free_port()}"
    kv = kv_stats([dead])
    assert kv["hit_rate"] is None and "unreachable" in kv["per_mock"][dead]
