"""`GET /api/usage`: stored token accounting as JSON (or CSV with `?format=csv`).

Query parameters: `since` and `until` (YYYY-MM-DD, inclusive, UTC days), `model`, `client`,
`format=json|csv`. Each row counts requests, errors and tokens; `relayed_prompt_tokens` and
`relayed_completion_tokens` are the part of its tokens the router counted itself (the rest
are the backends' own counts), and a JSON row's `tokens_from` says which in one word. A
client key sees only its own rows; the router key (`router_api_key`) and the admin key see
everyone's; without keys the router is open and so is this.
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any
from urllib.parse import parse_qs

from ...api.errors import ApiError
from ...server.asgi import Receive, Scope, Send, send_response
from .store import FIELDS, Counts, Row, Usage

_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
ALL_CLIENTS = ("default", "admin")  # key names that may read every client's usage


def _params(scope: Scope) -> dict[str, str]:
    raw = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    out = {k: v[-1] for k, v in raw.items()}
    unknown = set(out) - {"since", "until", "model", "client", "format"}
    if unknown:
        raise ApiError(
            400, f"unknown query parameter(s) {', '.join(sorted(unknown))}; use since, until, model, client, format"
        )
    for k in ("since", "until"):
        if k in out and not _DAY.match(out[k]):
            raise ApiError(400, f"{k} must be a UTC day as YYYY-MM-DD, got {out[k]!r}")
    if out.get("format", "json") not in ("json", "csv"):
        raise ApiError(400, "format must be json or csv")
    return out


def select(rows: list[tuple[Row, Counts]], p: dict[str, str]) -> list[tuple[Row, Counts]]:
    return [
        (r, c)
        for r, c in rows
        if p.get("since", "") <= r[0] <= p.get("until", "9999-99-99")
        and ("model" not in p or r[1] == p["model"])
        and ("client" not in p or r[3] == p["client"])
    ]


def summary(rows: list[tuple[Row, Counts]]) -> dict[str, Any]:
    def add(into: dict[str, int], c: Counts) -> None:
        for name, n in zip(FIELDS, c, strict=True):
            into[name] = into.get(name, 0) + n

    totals: dict[str, int] = dict.fromkeys(FIELDS, 0)
    groups: dict[str, dict[str, dict[str, int]]] = {"by_day": {}, "by_model": {}, "by_endpoint": {}, "by_client": {}}
    for (day, model, endpoint, client), c in rows:
        add(totals, c)
        for group, key in (("by_day", day), ("by_model", model), ("by_endpoint", endpoint), ("by_client", client)):
            add(groups[group].setdefault(key, {}), c)
    return {
        "totals": totals,
        **groups,
        "rows": [
            {
                "day": r[0],
                "model": r[1],
                "endpoint": r[2],
                "client": r[3],
                **dict(zip(FIELDS, c, strict=True)),
                "tokens_from": tokens_from(c),
            }
            for r, c in rows
        ],
    }


def tokens_from(c: Counts) -> str | None:
    """Whose counts a row's tokens are: "backend" (the backends' usage), "relayed" (counted
    by the router as it relayed them), "both" (some of each), None (no tokens)."""
    tokens, relayed = c[2] + c[3], c[4] + c[5]
    if not tokens:
        return None
    return "relayed" if relayed >= tokens else "backend" if not relayed else "both"


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: str) -> str:
    """A text cell a spreadsheet will not run: model and client names come from requests and
    the config, and a cell starting with `=`, `+`, `-`, `@`, a tab or a carriage return is a
    formula to Excel and LibreOffice (`=cmd|' /C calc'!A0`). A leading `'` makes it text."""
    return "'" + value if value.startswith(_FORMULA_START) else value


def to_csv(rows: list[tuple[Row, Counts]]) -> bytes:
    """RFC 4180 line ends (CRLF): the writer then also quotes a cell holding a CR, which with
    LF line ends it left bare, cutting the row in two for every reader."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n")
    w.writerow(("day", "model", "endpoint", "client", *FIELDS))
    for r, c in rows:
        w.writerow((*(_cell(v) for v in r), *c))
    return out.getvalue().encode()


class UsageRoutes:
    """`GET /api/usage` over the process's usage store (None: accounting is off)."""

    def __init__(self, usage: Usage | None) -> None:
        self.usage = usage

    async def usage_report(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.usage is None:
            raise ApiError(404, "usage accounting is off; set usage_db in the config to turn it on")
        p = _params(scope)
        client = scope.get("nomyo.client")
        if client is not None and client.name not in ALL_CLIENTS:
            p["client"] = client.name  # a client key sees its own usage only
        rows = select(await self.usage.rows(), p)
        if p.get("format") == "csv":
            await send_response(send, 200, to_csv(rows), b"text/csv; charset=utf-8")
        else:
            await send_response(send, 200, json.dumps(summary(rows)).encode())
