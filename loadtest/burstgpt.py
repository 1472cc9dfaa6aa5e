"""BurstGPT traces: a CSV of real ChatGPT/GPT-4 service arrivals and sizes.

Header: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`; one row per
request, `Timestamp` in seconds. A file is taken for BurstGPT when its name ends in `.csv`
or its first line is that header. Arrivals are the timestamps relative to the first row;
`Request tokens` sizes the prompt and `Response tokens` the output limit. The `Model`
column names the service's model (ChatGPT, GPT-4), not one the target serves, so `--model`
is what is sent. BurstGPT logs failed requests with 0 response tokens; they are replayed
with an output limit of 1, the least a server accepts, so the row count stays the trace's.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from typing import Any

HEADER = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


def is_burstgpt(path: str) -> bool:
    """By name (`.csv`) or by its first line."""
    if path.lower().endswith(".csv"):
        return True
    try:
        with open(path, newline="") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError):
        return False
    return [c.strip() for c in first.split(",")][:4] == list(HEADER[:4])


def read(path: str, make: Callable[[float, int, int | None], Any]) -> list[Any]:
    """One `make(at_seconds, request_tokens, response_limit)` per row, in file order;
    ValueError naming the file and line on a bad row."""
    out = []
    with open(path, newline="") as f:
        rows = csv.reader(f)
        head = [c.strip() for c in next(rows, [])]
        missing = [c for c in ("Timestamp", "Request tokens", "Response tokens") if c not in head]
        if missing:
            raise ValueError(
                f"trace {path}:1: a BurstGPT CSV needs the columns {', '.join(HEADER)}; missing {', '.join(missing)}"
            )
        at_i, req_i, resp_i = (head.index(c) for c in ("Timestamp", "Request tokens", "Response tokens"))
        for n, row in enumerate(rows, 2):
            if not row or not "".join(row).strip():
                continue
            try:
                at = float(row[at_i])
                req, resp = int(float(row[req_i])), int(float(row[resp_i]))
            except (ValueError, IndexError):
                raise ValueError(
                    f"trace {path}:{n}: expected numbers in Timestamp, Request tokens and Response tokens, got {row!r}"
                ) from None
            if at < 0 or req < 0 or resp < 0:
                raise ValueError(f"trace {path}:{n}: times and token counts must be >= 0")
            out.append(make(at, req, max(resp, 1)))
    if not out:
        raise ValueError(f"trace {path}: no rows")
    return out
