"""The live dashboard, loaded in a real (headless) Chromium against a running router."""

from __future__ import annotations

import asyncio

import aiohttp
from selenium.webdriver.common.by import By

from test.helpers import endpoints, run_router

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


async def wait_for(browser, check, timeout: float = 15.0):
    """Poll `check(browser)` (run off the event loop, which serves the router) until truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await asyncio.to_thread(check, browser)
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(0.2)


def endpoint_names(b) -> list[str]:
    return [e.get_attribute("data-name") for e in b.find_elements(By.CSS_SELECTOR, "tr.endpoint")]


def chart_points(b) -> int:
    return sum(
        len((p.get_attribute("points") or "").split())
        for p in b.find_elements(By.CSS_SELECTOR, "#chart-rps polyline.series")
    )


async def test_dashboard_shows_endpoints_live_numbers_and_a_chart(mock, mock2, browser, tmp_path):
    cfg = {"endpoints": endpoints(mock, mock2), "usage_db": str(tmp_path / "u.db")}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:

        async def traffic(n: int) -> None:
            for _ in range(n):
                async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                    assert resp.status == 200

        await traffic(5)
        await asyncio.to_thread(browser.get, r.url + "/dashboard")
        assert await wait_for(browser, lambda b: sorted(endpoint_names(b)) == ["m0", "m1"])
        total = await wait_for(browser, lambda b: b.find_element(By.ID, "c-total").text)
        assert total == "5"
        for _ in range(4):  # traffic while the page polls: rates and a line appear
            await traffic(5)
            await asyncio.sleep(0.6)
        assert await wait_for(browser, lambda b: chart_points(b) >= 2)
        assert int(await wait_for(browser, lambda b: b.find_element(By.ID, "c-total").text == "25" and "25")) == 25
        assert browser.find_element(By.ID, "status").text == "ok"
        assert "llama3" in browser.find_element(By.ID, "legend-rps").text
        assert browser.find_element(By.ID, "c-p50").text.endswith("ms")


async def test_dashboard_data_need_the_key(mock, browser):
    cfg = {
        "endpoints": endpoints(mock),
        "client_keys": [{"name": "team", "key": "team-key-12345678"}],
        "metrics_key": "ops-key-12345678",
    }
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        async with s.get(r.url + "/dashboard/data") as resp:
            assert resp.status == 401
        client = {"Authorization": "Bearer team-key-12345678"}
        for path in ("/dashboard/data", "/dashboard", "/metrics"):  # every client's traffic: not a client's
            async with s.get(r.url + path, headers=client) as resp:
                assert resp.status == 403, path
        await asyncio.to_thread(browser.get, r.url + "/dashboard")
        assert await wait_for(browser, lambda b: b.find_element(By.ID, "keyform").is_displayed())
        assert endpoint_names(browser) == []  # nothing shown without the key

        def enter_key(b) -> None:
            b.find_element(By.ID, "key").send_keys("ops-key-12345678")
            b.find_element(By.CSS_SELECTOR, "#keyform button").click()

        await asyncio.to_thread(enter_key, browser)
        assert await wait_for(browser, lambda b: endpoint_names(b) == ["m0"])
        await asyncio.to_thread(browser.execute_script, "sessionStorage.clear()")
