"""`--sweep RATES`: open-loop stages, the Pareto front of throughput against latency in the
JSON (checked against the stages it came from) and drawn in the HTML report in Chromium."""

from __future__ import annotations

from selenium.webdriver.common.by import By

from loadtest.sweep import CHART_TITLE, METRICS, pareto
from mock import MockConfig, MockProcess
from test.loadtest_run import loadtest
from test.test_loadtest_html import assert_no_overlap


def test_pareto_front():
    # (throughput, latency): (5, 90) is dominated by (6, 80); (6, 80) and (6, 85) tie on throughput
    pts = [(1.0, 10.0), (5.0, 90.0), (6.0, 80.0), (6.0, 85.0), (3.0, 10.0), (9.0, 300.0)]
    assert pareto(pts) == [4, 2, 5]


def test_sweep_front_against_its_stages_and_in_chromium(tmp_path, browser):
    """4 mock slots of 40 ms: 100 req/s at most, so the last rate queues."""
    page = tmp_path / "s.html"
    with MockProcess(MockConfig(ttft_ms=40.0, tokens=1, tok_ms=0.0, parallel=4, max_queue=10_000)) as m:
        doc, p = loadtest(
            *("--url", m.url, "--sweep", "20,60,200", "--duration", "0.6", "--warmup", "0.1", "--html", str(page)),
            json_out=tmp_path / "s.json",
            timeout=120,
        )
    stages, sweep = doc["stages"], doc["sweep"]
    assert [s["mode"] for s in stages] == ["open"] * 3 and [s["load"] for s in stages] == [20, 60, 200]
    assert [q["rate"] for q in sweep["points"]] == [20, 60, 200]
    for m, (key, _) in METRICS.items():
        front = sweep["pareto"][m]
        assert front, m
        for s in stages:
            x, y = s["request_throughput"], s[key]
            better = [
                o for o in stages if o is not s and o["request_throughput"] >= x and o[key] <= y
                and (o["request_throughput"] > x or o[key] < y)
            ]  # fmt: skip
            assert (s["load"] in front) == (not better), (m, s["load"], front)
    assert "sweep: Pareto front by rate" in p.stdout
    browser.get(page.as_uri())
    chart = next(
        c for c in browser.find_elements(By.CSS_SELECTOR, "svg.chart") if c.get_attribute("data-title") == CHART_TITLE
    )
    assert chart.size["height"] > 100
    assert len(chart.find_elements(By.CSS_SELECTOR, "circle.pt")) == 3 * len(METRICS)  # every stage, every metric
    lines = {ln.get_attribute("data-name"): ln for ln in chart.find_elements(By.CSS_SELECTOR, "polyline")}
    for m, (_, label) in METRICS.items():  # each front joined through its points, and nothing else
        assert len(lines[f"{label} front"].get_attribute("points").split()) == len(sweep["pareto"][m])
    assert not any(name.endswith("dominated") for name in lines)
    assert "on the front of" in browser.find_element(By.TAG_NAME, "body").text
    assert_no_overlap(browser)
