"""The HTML report, opened in real (headless) Chromium: the charts render with their data
points, every section is there, the file needs nothing from the network, and no two texts
overlap (measured from the laid-out page, with a crowded ramp of ten stages too)."""

from __future__ import annotations

import json
import re

from selenium.webdriver.common.by import By

from mock import free_port
from test.loadtest_run import loadtest


def test_report_renders_in_chromium(tmp_path, browser):
    page, out = tmp_path / "r.html", tmp_path / "r.json"
    doc, _ = loadtest(
        "--mock-backend",
        "--ramp",
        "2,4",
        "--duration",
        "0.8",
        "--warmup",
        "0.2",
        "--repeat",
        "2",
        "--direct",
        "--slo",
        "e2el=5s",
        "--timeslice",
        "0.4",
        "--mock-port",
        str(free_port()),
        "--router-port",
        str(free_port()),
        "--html",
        str(page),
        json_out=out,
        timeout=180,
    )
    text = page.read_text()
    # self-contained: no script, stylesheet or image fetched from anywhere
    assert not re.search(r"(src|href)\s*=", text) and "<script" not in text
    browser.get(page.as_uri())
    charts = {c.get_attribute("data-title"): c for c in browser.find_elements(By.CSS_SELECTOR, "svg.chart")}
    stages = doc["stages"]

    def points(title: str) -> int:
        return len(charts[title].find_elements(By.CSS_SELECTOR, "circle.pt"))

    for c in charts.values():
        assert c.size["width"] > 100 and c.size["height"] > 100  # laid out, not collapsed
    # against load: router, goodput and direct throughput at both stages; p50, p99, TTFT
    assert points("Throughput (req/s)") == 3 * 2 and points("Latency (ms)") == 3 * 2
    # each stage over time in one chart, router and direct: its slices (2 repetitions x 2 of
    # 0.2 s in a 0.4 s window) as points of req/s, errors/s, TTFT and latency p50/p99, over
    # two panels, each with the two measured windows shaded
    for target in ("router", "direct"):
        for load in (2, 4):
            title = f"{target} conc {load}: over time (per 0.4 s slice)"
            assert points(title) == 4 * 6
            assert len(charts[title].find_elements(By.CSS_SELECTOR, "rect.band")) == 2 * 2
    assert not any(t.endswith("latency") for t in charts)  # one timeline per stage, not two charts
    # distributions: 41 quantiles per stage, drawn as lines of real length, on a log axis
    assert points("Latency CDF (ms)") == 41 * len(stages) and points("TTFT CDF (ms)") == 41 * len(stages)
    # the line as laid out spans its own points (how far depends on the run's latencies:
    # a narrow spread on a wide log axis is a short line, but never a collapsed one)
    line = charts["Latency CDF (ms)"].find_element(By.CSS_SELECTOR, "polyline")
    xs = [float(xy.split(",")[0]) for xy in line.get_attribute("points").split()]
    width = browser.execute_script("return arguments[0].getBBox().width", line)
    assert len(xs) == 41 and max(xs) - min(xs) > 1
    assert abs(width - (max(xs) - min(xs))) < 1
    assert "log scale" in charts["Latency CDF (ms)"].text
    assert_no_overlap(browser)
    body = browser.find_element(By.TAG_NAME, "body").text
    for section in (
        "knee:",
        "SLO:",
        "Goodput per stage",
        "Per endpoint",
        "mock0",
        "Router overhead (--direct)",
        "Configuration (what differs from the defaults)",
        "MACHINE-BUSY" if any(s["client"].get("machine_bound") for s in stages) else "Stages",
    ):
        assert section in body, section
    config = browser.find_element(By.CSS_SELECTOR, "pre").text
    assert '"repeat": 2' in config and '"ramp"' in config and "mock_host" not in config  # defaults left out
    # a stage the client limited is flagged with its reason, in the summary and the table
    from loadtest.report_html import render

    doc = json.loads(out.read_text())
    doc["stages"][0]["client"].update(
        verdict="client", bottleneck=True, machine_bound=False, reason="the client used 97% of a core"
    )
    again = render(doc)
    assert "<b>CLIENT-BOUND</b> at router load 2: the client used 97% of a core" in again
    assert again.count("CLIENT-BOUND") == 2


def text_boxes(browser) -> list[dict]:
    """Every text of every chart, and every chart, as laid out: {chart, kind, text, box}."""
    return browser.execute_script("""
        const out = [];
        document.querySelectorAll('svg.chart').forEach((svg, i) => {
          const c = svg.getBoundingClientRect();
          out.push({chart: i, kind: 'chart', text: svg.dataset.title, l: c.left, t: c.top, r: c.right, b: c.bottom});
          svg.querySelectorAll('text').forEach((t) => {
            const b = t.getBoundingClientRect();
            if (b.width > 0) out.push({chart: i, kind: t.getAttribute('class') || 'text', text: t.textContent,
                                       l: b.left, t: b.top, r: b.right, b: b.bottom});
          });
        });
        return out;""")


def assert_no_overlap(browser) -> None:
    """No two texts of a chart intersect (1 px slack for anti-aliasing), every text lies
    inside its chart, and no two charts intersect."""
    boxes = text_boxes(browser)

    def hit(a, b, slack=1.0):
        return (
            a["l"] < b["r"] - slack and b["l"] < a["r"] - slack and a["t"] < b["b"] - slack and b["t"] < a["b"] - slack
        )

    charts = [b for b in boxes if b["kind"] == "chart"]
    texts = [b for b in boxes if b["kind"] != "chart"]
    assert len(texts) > 50
    for i, a in enumerate(texts):
        frame = charts[a["chart"]]
        assert (
            frame["l"] - 1 <= a["l"]
            and a["r"] <= frame["r"] + 1
            and frame["t"] - 1 <= a["t"]
            and a["b"] <= frame["b"] + 1
        ), (a, frame)
        for b in texts[i + 1 :]:
            if b["chart"] == a["chart"]:
                assert not hit(a, b), (a, b)
    for i, a in enumerate(charts):
        for b in charts[i + 1 :]:
            assert not hit(a, b, 0.0), (a["text"], b["text"])


def test_a_crowded_report_has_no_overlapping_text(tmp_path, browser):
    """Ten stages from 1 to 512 (crowded on a linear axis), latencies over four decades,
    long names, the knee at the first stage and at the last: every text stays legible."""
    from loadtest.report_html import render

    page, out = tmp_path / "r.html", tmp_path / "r.json"
    doc, _ = loadtest(
        "--mock-backend",
        "--ramp",
        "1,2",
        "--duration",
        "0.5",
        "--warmup",
        "0.1",
        "--mock-port",
        str(free_port()),
        "--router-port",
        str(free_port()),
        "--timeslice",
        "0.1",
        json_out=out,
        timeout=180,
    )
    base = doc["stages"][0]
    stages = []
    for k, load in enumerate([1, 2, 4, 8, 16, 32, 64, 128, 256, 512]):
        s = json.loads(json.dumps(base))
        grow = 2.2**k  # latencies from ~50 ms to ~60 s
        s.update(
            load=load,
            max_concurrency=load,
            request_throughput=min(load, 40) * 19.5,
            median_e2el_ms=50 * grow,
            p99_e2el_ms=90 * grow,
            median_ttft_ms=20 * grow,
        )
        s["cdf"] = {key: [v * grow for v in vals] for key, vals in s["cdf"].items()}
        stages.append(s)
    doc["stages"] = stages
    for knee in (0, 9):
        doc["knee"].update(
            knee_stage=knee,
            knee_load=stages[knee]["load"],
            max_throughput_load=512,
            max_request_throughput=780.0,
            saturation_load=64,
        )
        page.write_text(render(doc))
        browser.get(page.as_uri())
        assert_no_overlap(browser)
        mark = browser.execute_script(
            "const s = document.querySelector('svg.chart[data-title=\"Throughput (req/s)\"]');"
            "const m = s.querySelector('line.mark').getBoundingClientRect();"
            "const axis = s.querySelector('line.yaxis').getBoundingClientRect();"
            "return [m.left, axis.left, s.querySelector('text.marklabel').textContent];"
        )
        assert mark[0] > mark[1] + 5 and mark[2] == f"knee {stages[knee]['load']}"  # off the axis, named
