"""Against a real Ollama (`../shared/real-backends`, v0.24, a tiny random-weight model): the
same calls direct and through the router. Skipped, with the reason, where it is absent."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import anthropic
import pytest

from mock import free_port
from test.helpers import run_router

REPO = Path(__file__).resolve().parent.parent
SHARED = next((p for p in (REPO.parent / "shared", Path("/work/shared")) if (p / "real-backends").is_dir()), None)
KEY = "router-key-0123456789"


@pytest.fixture(scope="module")
def ollama_url() -> Iterator[str]:
    if SHARED is None:
        pytest.skip("../shared/real-backends is absent: no real Ollama to compare with")
    port = free_port()
    data = tempfile.mkdtemp(prefix="ollama-test-")
    out = subprocess.run([str(SHARED / "real-backends" / "start-ollama.sh"), str(port), "2", data],
                         capture_output=True, text=True, timeout=180)
    if out.returncode != 0:
        pytest.fail(f"start-ollama.sh failed: {out.stderr[-500:]}")
    pid = int(out.stdout.strip().splitlines()[-1])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        os.kill(pid, 15)


async def test_anthropic_messages_through_the_router_with_a_key(ollama_url):
    cfg = {"endpoints": [{"url": ollama_url, "name": "real"}], "router_api_key": KEY}
    async with run_router(cfg) as r:
        direct = anthropic.AsyncAnthropic(base_url=ollama_url, api_key="unused", max_retries=0)
        routed = anthropic.AsyncAnthropic(base_url=r.url, api_key=KEY, max_retries=0)
        try:
            ask = dict(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            a, b = await direct.messages.create(**ask), await routed.messages.create(**ask)
            assert (a.type, a.role, a.model, a.stop_reason) == (b.type, b.role, b.model, b.stop_reason)
            assert b.content and b.usage.output_tokens == a.usage.output_tokens
            async with routed.messages.stream(**ask) as stream:
                events = [e.type async for e in stream]
            assert events[0] == "message_start" and events[-1] == "message_stop"
            with pytest.raises(anthropic.AuthenticationError):
                bad = anthropic.AsyncAnthropic(base_url=r.url, api_key="wrong-key-00000", max_retries=0)
                try:
                    await bad.messages.create(**ask)
                finally:
                    await bad.close()
            with pytest.raises(anthropic.NotFoundError):
                await routed.messages.create(**{**ask, "model": "no-such-model"})
        finally:
            await direct.close()
            await routed.close()
