"""A batch alongside the interactive load: `--batch-lines N`.

The stages run twice: first alone, then again right after a batch of N lines of the same
workload was submitted through the router's Batch API (`/v1/files`, `/v1/batches`). Then the
interactive load stops and the batch is waited for (up to `--batch-wait` seconds). Reported:
each stage's interactive p95 alone and with the batch and their ratio (the router's goal:
within 1.25x), the batch's lines per second during the load and after it, and how long after
the load it finished. With `--mock-backend` the router is started with `batch.enabled`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from .engine import Stage
from .workload import WorkloadSpec

P95 = 38  # the cdf's point at 95 % (0, 2.5, ..., 100 %: timeline.cdf)
_PATHS = {"chat": "/v1/chat/completions", "generate": "/v1/completions", "embed": "/v1/embeddings"}
Drive = Callable[..., Awaitable[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a batch alongside (the OpenAI Batch API)")
    g.add_argument(
        "--batch-lines",
        type=int,
        default=0,
        help="run the stages alone, then again beside a batch of N lines; report both",
    )
    g.add_argument("--batch-wait", type=float, default=300.0, help="seconds to wait for the batch after the load")


def lines(spec: WorkloadSpec, n: int) -> bytes:
    """`n` lines of the interactive workload's request, as OpenAI-API bodies."""
    body: dict[str, Any] = {"model": spec.model}
    if spec.endpoint == "embed":
        body["input"] = spec.user_text()
    elif spec.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": spec.user_text()}]
    else:
        body["prompt"] = spec.user_text()
    if spec.max_tokens is not None and spec.endpoint != "embed":
        body["max_tokens"] = spec.max_tokens
    url = _PATHS[spec.endpoint]
    return b"".join(
        json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": url, "body": body}).encode() + b"\n"
        for i in range(n)
    )


async def submit(s: aiohttp.ClientSession, url: str, spec: WorkloadSpec, n: int) -> str:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", lines(spec, n), filename="loadtest.jsonl")
    async with s.post(url + "/v1/files", data=form) as r:
        if r.status != 200:
            raise RuntimeError(f"the router refused the batch file ({r.status}): {(await r.text())[:300]}")
        file_id = (await r.json())["id"]
    body = {"input_file_id": file_id, "endpoint": _PATHS[spec.endpoint], "completion_window": "24h"}
    async with s.post(url + "/v1/batches", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"the router refused the batch ({r.status}): {(await r.text())[:300]}")
        batch_id: str = (await r.json())["id"]
        return batch_id


async def state(s: aiohttp.ClientSession, url: str, batch_id: str) -> dict[str, Any]:
    async with s.get(f"{url}/v1/batches/{batch_id}") as r:
        b: dict[str, Any] = await r.json()
        return b


def p95(m: dict[str, Any]) -> float | None:
    points = m.get("cdf", {}).get("e2el_ms") or []
    return points[P95] if len(points) > P95 else None


async def alongside(
    args: argparse.Namespace, spec: WorkloadSpec, stages: list[Stage], url: str, console: Console, drive: Drive
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the stages' results alone, the comparison with a batch running)."""
    alone, _ = await drive(args, spec, stages, url, None, console)
    headers = dict(spec.headers)
    async with aiohttp.ClientSession(headers=headers) as s:
        batch_id = await submit(s, url, spec, args.batch_lines)
        t0 = time.monotonic()
        beside, _ = await drive(args, spec, stages, url, None, console)
        t1 = time.monotonic()
        during = (await state(s, url, batch_id))["request_counts"]
        while (b := await state(s, url, batch_id))["status"] not in ("completed", "failed", "cancelled", "expired"):
            if time.monotonic() - t1 > args.batch_wait:
                break
            await asyncio.sleep(0.2)
        t2 = time.monotonic()
    counts = b["request_counts"]
    ran_during = during["completed"] + during["failed"]
    ran_after = counts["completed"] + counts["failed"] - ran_during
    rows = []
    for a, w in zip(alone, beside, strict=True):
        pa, pw = p95(a), p95(w)
        rows.append({"load": a.get("load"), "p95_alone_ms": pa, "p95_with_batch_ms": pw, "ratio": _ratio(pw, pa)})
    report = {
        "lines": args.batch_lines,
        "status": b["status"],
        "request_counts": counts,
        "lines_per_s_during": round(ran_during / max(t1 - t0, 1e-9), 3),
        "lines_per_s_after": round(ran_after / max(t2 - t1, 1e-9), 3),
        "finished_after_load_s": round(t2 - t1, 3) if b["status"] == "completed" else None,
        "stages": rows,
        "with_batch": beside,
    }
    return alone, report


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def print_report(console: Console, rep: dict[str, Any]) -> None:
    t = Table(title=f"interactive latency beside a batch of {rep['lines']} lines")
    for col in ("load", "p95 alone (ms)", "p95 with batch (ms)", "ratio (goal <= 1.25)"):
        t.add_column(col, justify="right")
    for r in rep["stages"]:
        t.add_row(
            *(
                ("-" if v is None else f"{v:g}")
                for v in (r["load"], r["p95_alone_ms"], r["p95_with_batch_ms"], r["ratio"])
            )
        )
    console.print(t)
    done = rep["finished_after_load_s"]
    console.print(
        f"batch: {rep['lines_per_s_during']:g} lines/s beside the load, {rep['lines_per_s_after']:g} after it; "
        + (f"finished {done:g} s after the load" if done is not None else f"{rep['status']} when the wait ended"),
        highlight=False,
    )
