"""The HTML report, opened in real (headless) Chromium: the charts render with their data
points, every section is there, and the file needs nothing from the network."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from selenium.webdriver.common.by import By

from mock import free_port


def test_report_renders_in_chromium(tmp_path, browser):
    page, out = tmp_path / "r.html", tmp_path / "r.json"
    p = subprocess.run([sys.executable, "loadtest.py", "--mock-backend", "--ramp", "2,4", "--duration", "0.8",
                        "--warmup", "0.2", "--repeat", "2", "--direct", "--slo", "e2el=5s",
                        "--mock-port", str(free_port()), "--router-port", str(free_port()), "--quiet",
                        "--html", str(page), "--json", str(out)], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    text = page.read_text()
    # self-contained: no script, stylesheet or image fetched from anywhere
    assert not re.search(r'(src|href)\s*=', text) and "<script" not in text
    browser.get(page.as_uri())
    charts = {c.get_attribute("data-title"): c for c in browser.find_elements(By.CSS_SELECTOR, "svg.chart")}
    stages = json.loads(out.read_text())["stages"]

    def points(title: str) -> int:
        return len(charts[title].find_elements(By.CSS_SELECTOR, "circle.pt"))

    for c in charts.values():
        assert c.size["width"] > 100 and c.size["height"] > 100  # laid out, not collapsed
    # against load: router, goodput and direct throughput at both stages; p50, p99, TTFT
    assert points("Throughput (req/s)") == 3 * 2 and points("Latency (ms)") == 3 * 2
    # each stage over time, router and direct: a line with points and the measured windows shaded
    for target in ("router", "direct"):
        for load in (2, 4):
            t = charts[f"{target} conc {load}: throughput and errors"]
            assert points(f"{target} conc {load}: throughput and errors") >= 3
            assert len(t.find_elements(By.CSS_SELECTOR, "rect.band")) == 2  # two repetitions
            assert points(f"{target} conc {load}: latency") >= 3
    # distributions: 41 quantiles per stage, drawn as lines of real length
    assert points("Latency CDF (ms)") == 41 * len(stages) and points("TTFT CDF (ms)") == 41 * len(stages)
    width = browser.execute_script(
        "return document.querySelector('svg.chart[data-title=\"Latency CDF (ms)\"] polyline').getBBox().width")
    assert width > 50
    body = browser.find_element(By.TAG_NAME, "body").text
    for section in ("knee:", "SLO:", "Goodput per stage", "Per endpoint", "mock0", "Router overhead (--direct)",
                    "Configuration (what differs from the defaults)", "MACHINE-BUSY" if any(
                        s["client"].get("machine_bound") for s in stages) else "Stages"):
        assert section in body, section
    config = browser.find_element(By.CSS_SELECTOR, "pre").text
    assert '"repeat": 2' in config and '"ramp"' in config and "mock_host" not in config  # defaults left out
    # a stage the client limited is flagged with its reason, in the summary and the table
    from loadtest.report_html import render
    doc = json.loads(out.read_text())
    doc["stages"][0]["client"].update(verdict="client", bottleneck=True, machine_bound=False,
                                      reason="the client used 97% of a core")
    again = render(doc)
    assert "<b>CLIENT-BOUND</b> at router load 2: the client used 97% of a core" in again
    assert again.count("CLIENT-BOUND") == 2
