"""The load tester as the tests run it: the CLI in a subprocess with its JSON read back, and
the mock's KV-cache counters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent


def loadtest(*args: str, json_out: Path, timeout: float = 60) -> tuple[dict, subprocess.CompletedProcess[str]]:
    """`python loadtest.py ARGS --quiet --json JSON_OUT`, which must exit 0: (its JSON, the run)."""
    p = subprocess.run(
        [sys.executable, "loadtest.py", *args, "--quiet", "--json", str(json_out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(json_out.read_text()), p


async def mock_kv(url: str) -> dict:
    """The mock's KV prefix-cache counters (a mock in this loop is asked without blocking)."""
    async with aiohttp.ClientSession() as s, s.get(url + "/mock/stats") as r:
        return (await r.json())["kv_cache"]
