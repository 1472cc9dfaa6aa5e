"""runtime/: a started router has loaded only what serving a generation needs; the handlers of
the operator's routes (model management, the dashboard, usage, the cache's routes, reload,
/api/status) are built, and their modules imported, on first use, once."""

from __future__ import annotations

import json
import subprocess
import sys

OPERATOR_MODULES = [
    "nomyo_router.api.manage",
    "nomyo_router.api.blobs",
    "nomyo_router.api.status",
    "nomyo_router.ops.dashboard",
    "nomyo_router.ops.usage.routes",
    "nomyo_router.ops.usage.stream",
    "nomyo_router.cache.routes",
    "nomyo_router.cache.semantic",
    "nomyo_router.ops.tracing",
    "nomyo_router.routing.kv_events",
    "aiohttp",
    "starlette",
]

SCRIPT = """
import asyncio, json, sys
from nomyo_router.config import parse_config
from nomyo_router.runtime.lifespan import shutdown, startup

async def main():
    config = parse_config({"endpoints": [{"url": "http://127.0.0.1:9", "name": "gone"}], "usage_db": None})
    router = await startup(config)
    assert not isinstance(router, str), router
    at_start = sorted(m for m in sys.modules if m in MODULES)
    h = router.handlers
    built = [h.manager, h.blobs, h.status, h.dashboard, h.usage, h.usage_stream, h.cache, h.reload]
    again = [h.manager, h.blobs, h.status, h.dashboard, h.usage, h.usage_stream, h.cache, h.reload]
    same = all(a is b for a, b in zip(built, again))
    after = sorted(m for m in sys.modules if m in MODULES)
    await shutdown(router)
    print(json.dumps({"at_start": at_start, "after": after, "same": same, "types": [type(b).__name__ for b in built]}))

MODULES = set(json.loads(sys.argv[1]))
asyncio.run(main())
"""


def test_operator_handlers_are_built_on_first_use_and_once():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(OPERATOR_MODULES)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["at_start"] == [], f"imported at start, before any operator route was asked: {got['at_start']}"
    assert got["types"] == [
        "Manager",
        "Blobs",
        "Status",
        "Dashboard",
        "UsageRoutes",
        "UsageStream",
        "CacheRoutes",
        "ReloadRoute",
    ]
    assert got["same"], "a handler object was built twice"
    # built on first use: model management, the dashboard, usage and the cache's routes are loaded now
    # (aiohttp only when a model-management call is made)
    assert {
        "nomyo_router.api.manage",
        "nomyo_router.api.blobs",
        "nomyo_router.api.status",
        "nomyo_router.ops.dashboard",
        "nomyo_router.ops.usage.routes",
        "nomyo_router.ops.usage.stream",
        "nomyo_router.cache.routes",
    } <= set(got["after"])
    assert "aiohttp" not in got["after"] and "starlette" not in got["after"]
