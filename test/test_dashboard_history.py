"""The dashboard's history: the router keeps its last hour of samples (5 s for the last ten
minutes, 30 s before), bounded, sampled on a timer by every worker from the merged counters,
and a dashboard opened after a minute of traffic draws that minute at once — with a model's
colour fixed by its name, an error breakdown and per-endpoint latencies, behind the admin key."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import aiohttp
import pytest
from selenium.webdriver.common.by import By

from mock import MockConfig, MockProcess
from nomyo_router.ops.history import COARSE_S, FINE_S, INTERVAL_ENV, KEEP_S, History, history_for
from test.helpers import endpoints, run_router
from test.router_proc import router_workers
from test.test_dashboard import wait_for


def test_history_keeps_an_hour_fine_then_coarse_and_bounded():
    n = [0]

    def read() -> dict:
        n[0] += 1
        return {"requests": {"m": n[0]}}

    h = History(read, interval=5.0)
    start = 1_700_000_000.0
    for k in range(2 * 3600 // 5):  # two hours at 5 s
        h.sample(at=start + 5 * k)
    now = start + 5 * (2 * 3600 // 5 - 1)
    got = [json.loads(b) for b in h.encoded()]
    ts = [s["t"] for s in got]
    assert ts == sorted(ts) and now - ts[0] <= KEEP_S and ts[-1] == now
    fine = [t for t in ts if now - t <= FINE_S]
    assert all(b - a == 5 for a, b in itertools.pairwise(fine)) and len(fine) == FINE_S // 5 + 1
    older = [t for t in ts if now - t > FINE_S]
    assert all(b - a == COARSE_S for a, b in itertools.pairwise(older)) and now - older[0] > KEEP_S - 2 * COARSE_S
    assert len(h.fine) + len(h.coarse) <= FINE_S / 5 + KEEP_S / COARSE_S + 4  # bounded whatever the uptime
    assert [json.loads(b)["t"] for b in h.encoded(since=now - 10)] == [now - 5, now]
    h.sample(at=now - 1)  # time only moves forward
    assert json.loads(h.encoded()[-1])["t"] == now


CHAT = {"stream": False, "messages": [{"role": "user", "content": "hi"}]}


def drawn(b, chart: str, name: str) -> list[tuple[float, float]]:
    """The (unix time, value) points the page drew for one series, read back from the SVG."""
    return b.execute_script(
        """
        const svg = document.getElementById(arguments[0]);
        const line = [...svg.querySelectorAll('polyline.series')].find((p) => p.dataset.name === arguments[1]);
        if (!line) return [];
        const [L, R, T, B] = svg.dataset.box.split(',').map(Number);
        const t0 = +svg.dataset.t0, t1 = +svg.dataset.t1, vmax = +svg.dataset.vmax;
        return line.getAttribute('points').trim().split(/\\s+/).filter(Boolean).map((p) => {
          const [x, y] = p.split(',').map(Number);
          return [t0 + (x - L) / (R - L) * (t1 - t0), (B - y) / (B - T) * vmax];
        });""",
        chart,
        name,
    )


async def test_a_dashboard_opened_after_a_minute_of_traffic_draws_that_minute(mock, mock2, browser):
    """A minute of traffic is fed to the history as it would be sampled: real requests, then
    a real sample of the router's counters stamped 5 s after the previous one (the test's
    stand-in for waiting a minute). The page, opened afterwards with the admin key, draws
    each 5 s interval's rate per model at its time, the same colour for a model in every
    chart, the errors by endpoint, status and class, and the endpoints' latencies."""
    cfg = {
        "endpoints": endpoints(mock, mock2),
        "admin_key": "admin-key-12345678",
        "client_keys": [{"name": "team", "key": "team-key-12345678"}],
    }
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        await r.router.history.stop()  # this test stamps the samples itself
        history = r.router.history = history_for(r.router.metrics)
        team = {"Authorization": "Bearer team-key-12345678"}

        async def chat(model: str, n: int) -> None:
            for _ in range(n):
                async with s.post(r.url + "/api/chat", json={"model": model, **CHAT}, headers=team) as resp:
                    assert resp.status == 200

        start = time.time() - 60
        sent = {}
        history.sample(at=start)
        for k in range(1, 13):
            sent[k] = (k % 4 + 1, k % 2)
            await chat("llama3", sent[k][0])
            await chat("qwen2.5:7b", sent[k][1])
            if k == 6:
                for _ in range(3):  # a model no endpoint serves: 404s of the router itself
                    async with s.post(r.url + "/api/chat", json={"model": "nosuch", **CHAT}, headers=team) as resp:
                        assert resp.status == 404
            await asyncio.sleep(0.03)  # (the counters are handed on within 20 ms)
            history.sample(at=start + 5 * k)
        await asyncio.to_thread(browser.get, r.url + "/dashboard")
        assert await wait_for(browser, lambda b: b.find_element(By.ID, "keyform").is_displayed())

        def enter_key(b) -> None:
            b.find_element(By.ID, "key").send_keys("admin-key-12345678")
            b.find_element(By.CSS_SELECTOR, "#keyform button").click()

        opened = time.monotonic()
        await asyncio.to_thread(enter_key, browser)
        points = await wait_for(browser, lambda b: len(p := drawn(b, "chart-rps", "llama3")) >= 12 and p, 10)
        assert points and time.monotonic() - opened < 5  # the past at once, not after a minute of polling
        for k, (llama, _) in sent.items():  # every 5 s interval, at its time, at its rate
            at = [v for t, v in points if abs(t - (start + 5 * k)) < 0.5]
            assert at and at[0] == pytest.approx(llama / 5, rel=0.03, abs=0.02), (k, points)
        qwen = await asyncio.to_thread(drawn, browser, "chart-rps", "qwen2.5:7b")
        assert [v for t, v in qwen if abs(t - (start + 25)) < 0.5] == [pytest.approx(0.2, abs=0.02)]

        def look(b) -> dict:
            stroke = {
                c: b.execute_script(
                    "return [...document.querySelectorAll('#' + arguments[0] + ' polyline.series')]"
                    ".find((p) => p.dataset.name === 'llama3').getAttribute('stroke')",
                    c,
                )
                for c in ("chart-rps", "chart-tps")
            }
            rows = {
                (
                    e.get_attribute("data-endpoint"),
                    e.get_attribute("data-status"),
                    e.get_attribute("data-class"),
                ): e.text
                for e in b.find_elements(By.CSS_SELECTOR, "#errors tr.error")
            }
            eps = {
                e.get_attribute("data-name"): [
                    e.find_element(By.CSS_SELECTOR, f"td.{c}").text for c in ("ttft", "tps", "queue")
                ]
                for e in b.find_elements(By.CSS_SELECTOR, "tr.endpoint")
            }
            return {
                "stroke": stroke,
                "own": b.execute_script("return colour('llama3')"),
                "errors": rows,
                "endpoints": eps,
                "span": b.find_element(By.CSS_SELECTOR, "h2 .span").text,
                "legend": b.execute_script(  # as painted: the swatch's colour and the line's
                    "return [getComputedStyle(document.querySelector(\"#legend-rps span[data-name='llama3'] i\"))"
                    ".backgroundColor, getComputedStyle([...document.querySelectorAll('#chart-rps polyline')]"
                    ".find((p) => p.dataset.name === 'llama3')).stroke]"
                ),
            }

        seen = await asyncio.to_thread(look, browser)
        assert seen["stroke"]["chart-rps"] == seen["stroke"]["chart-tps"] == seen["own"]  # by name only
        assert seen["legend"][0] == seen["legend"][1]
        # the router's own 404s, and the page's first read, made without a key (it then asks for one)
        assert sorted(seen["errors"]) == [("", "401", "http_401"), ("", "404", "http_404")]
        assert seen["errors"][("", "404", "http_404")].split()[-1] == "3"  # all 3, in the last 5 min
        assert seen["span"] == "· last 5 min"
        for name, (ttft, tps, queue) in seen["endpoints"].items():  # both endpoints took traffic
            assert ttft.count("ms") == 2 and queue.count("ms") == 2 and tps != "–", (name, seen["endpoints"])
        await asyncio.to_thread(browser.execute_script, "sessionStorage.clear()")


async def test_every_worker_samples_the_merged_counters_on_its_timer(monkeypatch):
    """Two workers, each sampling every 0.3 s (the internal knob): requests spread over both,
    and whichever worker answers /dashboard/data has samples (unix seconds, 0.3 s apart)
    whose counts are the whole router's."""
    monkeypatch.setenv(INTERVAL_ENV, "0.3")
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=2)) as m:
        cfg = {"endpoints": [{"url": m.url, "name": "one", "max_concurrent": 8}]}
        with router_workers(cfg, 2) as (url, _):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

                async def post() -> str | None:
                    async with s.post(url + "/api/chat", json={"model": "llama3", **CHAT}) as resp:
                        assert resp.status == 200
                        return resp.headers.get("X-Router-Worker")

                workers: set = set()
                sent = 0
                while len(workers) < 2 and sent < 600:  # batches until both workers served some
                    workers |= set(await asyncio.gather(*[post() for _ in range(20)]))
                    sent += 20
                await asyncio.sleep(1.0)

                async def data() -> dict:
                    async with s.get(url + "/dashboard/data") as resp:
                        return await resp.json()

                answers = {}
                for _ in range(10):
                    for d in await asyncio.gather(*[data() for _ in range(6)]):
                        answers[d["pid"]] = d
                    if len(answers) >= 2:
                        break
    assert len(workers) >= 2 and len(answers) >= 2  # the traffic and the dashboard polls spread
    now = time.time()
    for d in answers.values():
        ts = [x["t"] for x in d["samples"]]
        assert now - 30 < ts[0] and ts[-1] <= now and d["history"]["interval_s"] == 0.3
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        assert len(gaps) >= 3 and all(0.2 < g < 0.6 for g in gaps), gaps
        assert sum(d["samples"][-1]["requests"].values()) == sent  # every worker's requests
        assert d["samples"][-1]["endpoint_ttft"]["one"][-1] == sent
