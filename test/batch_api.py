"""The Batch API as the tests use it: a router config with it on, the official `openai`
client, input files, and waiting for a batch's end."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from typing import Any

import openai

from test.helpers import endpoints

ALICE, BOB, ADMIN = "alice-key-0123456789", "bob-key-0123456789", "admin-key-0123456789"


def batch_config(mocks: list[Any], **batch: Any) -> dict[str, Any]:
    path = os.path.join(tempfile.mkdtemp(prefix="nomyo-batch-test-"), "batch.db")
    return {
        "endpoints": endpoints(*mocks, slots=2),
        "client_keys": [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}],
        "admin_key": ADMIN,
        "batch": {"enabled": True, "path": path, "poll_interval": 0.05, **batch},
    }


def client(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=10)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def chat(cid: str, model: str = "llama3", **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": cid}], "max_tokens": 4, **extra}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


async def finished(c: openai.AsyncOpenAI, batch_id: str, timeout: float = 15.0) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            b = await c.batches.retrieve(batch_id)
            if b.status in ("completed", "failed", "cancelled", "expired"):
                return b
            await asyncio.sleep(0.05)


async def lines_of(c: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await c.files.content(file_id)
    return [json.loads(x) for x in content.content.splitlines() if x.strip()]
