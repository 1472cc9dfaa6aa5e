"""The dashboard reads right in a real (headless) Chromium: its rate cards hold steady under a
steady load (a window of seconds, not the difference of two polls), and models shown
together never share a colour."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math

import aiohttp
from selenium.webdriver.common.by import By

from mock import run_mock
from test.helpers import endpoints, run_router
from test.test_dashboard import wait_for

# names whose colours were one when the colour was a hash of the name (tiny, tiny-oa-embed)
MODELS = ["tiny", "tiny-oa-embed", "llama3", "qwen2.5:7b", "phi3", "gemma2", "mistral", "nomic-embed", "deepseek-r1"]


def chat(model: str) -> dict[str, object]:
    return {"model": model, "stream": False, "messages": [{"role": "user", "content": "hi"}]}


async def test_the_rate_cards_never_read_zero_under_a_steady_load(browser, tmp_path):
    # Two clients in step, each answer 1.2 s long: requests end in pairs, and one poll in
    # three or so sees none end since the last (the cards read 0.0 there when they were a
    # one-second difference).
    async with run_mock(ttft_ms=0.0, tok_ms=150.0, tokens=8) as m:
        cfg = {"endpoints": endpoints(m, slots=4), "usage_db": str(tmp_path / "u.db")}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            stop = asyncio.Event()

            async def client() -> None:
                while not stop.is_set():
                    async with s.post(r.url + "/api/chat", json=chat("llama3")) as resp:
                        assert resp.status == 200
                        await resp.read()

            load = [asyncio.create_task(client()) for _ in range(2)]
            try:
                await asyncio.to_thread(browser.get, r.url + "/dashboard")
                card = lambda b: b.find_element(By.ID, "c-rps").text  # noqa: E731
                assert await wait_for(browser, lambda b: card(b) not in ("", "–", "0.0"))
                seen = []
                for _ in range(8):  # four seconds of readings, two per poll
                    seen.append(await asyncio.to_thread(card, browser))
                    seen.append(await asyncio.to_thread(lambda b: b.find_element(By.ID, "c-tps").text, browser))
                    await asyncio.sleep(0.5)
            finally:
                stop.set()
                for task in load:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
    assert all(v not in ("–", "0.0") and float(v) > 0 for v in seen), seen
    rps = [float(v) for v in seen[::2]]
    assert max(rps) < 4  # two clients, 1.2 s each: about 1.7 a second, never the 2-in-1 s of a burst


async def test_models_shown_together_never_share_a_colour(browser, tmp_path):
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=4, models=MODELS) as m:
        cfg = {"endpoints": endpoints(m), "usage_db": str(tmp_path / "u.db")}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            for model in MODELS:
                async with s.post(r.url + "/api/chat", json=chat(model)) as resp:
                    assert resp.status == 200, await resp.text()
            await asyncio.to_thread(browser.get, r.url + "/dashboard")

            def colours(b, selector: str, prop: str) -> dict[str, str]:
                """{data-name: computed colour} of what `selector` finds, read in one go (each
                poll draws the charts and legends anew)."""
                return dict(
                    b.execute_script(
                        "return [...document.querySelectorAll(arguments[0])].map((e) => [e.dataset.name, "
                        "getComputedStyle(e.querySelector('i') || e)[arguments[1]]])",
                        selector,
                        prop,
                    )
                )

            assert await wait_for(
                browser, lambda b: len(colours(b, "#legend-rps span", "backgroundColor")) == len(MODELS)
            )
            rps = await asyncio.to_thread(colours, browser, "#legend-rps span", "backgroundColor")
            tps = await asyncio.to_thread(colours, browser, "#legend-tps span", "backgroundColor")
            strokes = await asyncio.to_thread(colours, browser, "#chart-rps polyline.series", "stroke")
    assert sorted(rps) == sorted(MODELS)
    rgb = {n: [int(x) for x in c[c.index("(") + 1 : -1].split(",")[:3]] for n, c in rps.items()}
    for a, b in itertools.combinations(MODELS, 2):  # no two alike, nor close (a hash gave these two 307° and 302°)
        assert math.dist(rgb[a], rgb[b]) > 40, (a, rps[a], b, rps[b])
    assert tps == rps  # a model has one colour in every chart
    assert {n: strokes[n] for n in rps} == rps  # and its line has the legend's colour
