"""Per-session figures of conversations and agent sessions: turns, TTFT per turn index, and
the prefix-cache hit rate the backend reports.

The hit rate of a set of requests is the share of their prompt tokens the backend found in
its prefix cache, by what it reports:
  - OpenAI-compatible (vLLM, OpenAI, the mock): `usage.prompt_tokens_details.cached_tokens`
    over `usage.prompt_tokens` — exact;
  - Ollama: 1 - `prompt_eval_count` (the tokens it evaluated) over the prompt as the load
    tester counts it (4 characters a token) — approximate, as that count is;
  - neither: no rate (the mock's own counters, all requests together, are the run's
    `mock_kv_cache`).
Split by the router's `X-Router-Affinity` outcome of turns 2+, so a run with and one
without `conversation_affinity` show what the pin keeps. At most LISTED sessions are listed
one by one in the JSON (the figures cover all).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

import numpy as np

from . import numbers
from .client import Result
from .svg import Panel, chart

LISTED = 100


def _source(rs: list[Result]) -> str | None:
    if any(r.cached_tokens is not None and r.prompt_tokens for r in rs):
        return "openai usage.prompt_tokens_details.cached_tokens"
    if any(r.prompt_eval is not None and r.prompt_est for r in rs):
        return "ollama prompt_eval_count against the prompt"
    return None


def hit_rate(rs: list[Result]) -> float | None:
    cached = total = 0
    for r in rs:
        if r.cached_tokens is not None and r.prompt_tokens:
            cached, total = cached + min(r.cached_tokens, r.prompt_tokens), total + r.prompt_tokens
        elif r.prompt_eval is not None and r.prompt_est:
            cached, total = cached + max(r.prompt_est - r.prompt_eval, 0), total + r.prompt_est
    return round(cached / total, 4) if total else None


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 3) if values else None


def figures(results: list[Result]) -> dict[str, Any] | None:
    """The stage's `sessions` block, or None when no request belonged to a multi-turn session."""
    rs = [r for r in results if r.session is not None]
    if not rs or max(r.turn for r in rs) < 2:
        return None
    ok = [r for r in rs if r.ok]
    by_turn: dict[int, list[Result]] = defaultdict(list)
    by_session: dict[str, list[Result]] = defaultdict(list)
    for r in rs:
        by_turn[r.turn].append(r)
        by_session[r.session].append(r)  # type: ignore[index]
    later = [r for r in ok if r.turn >= 2]
    by_aff: dict[str, list[Result]] = defaultdict(list)
    for r in later:
        by_aff[r.affinity or "none"].append(r)
    turns = [max(r.turn for r in s if r.ok) if any(r.ok for r in s) else 0 for s in by_session.values()]
    return {
        "sessions": len(by_session),
        "turns_mean": round(float(np.mean(turns)), 3),
        "turns_max": max(turns),
        "cache_source": _source(ok),
        "cache_hit_rate": hit_rate(ok),
        "cache_hit_rate_turn2plus": hit_rate(later),
        "per_turn": [
            {
                "turn": t,
                "requests": len(by_turn[t]),
                "completed": sum(1 for r in by_turn[t] if r.ok),
                "ttft_p50_ms": _ms([r.ttft for r in by_turn[t] if r.ok and r.ttft is not None], 50),
                "ttft_p99_ms": _ms([r.ttft for r in by_turn[t] if r.ok and r.ttft is not None], 99),
                "prompt_tokens_mean": round(float(np.mean([r.prompt_est for r in by_turn[t]])), 1),
                "cache_hit_rate": hit_rate([r for r in by_turn[t] if r.ok]),
            }
            for t in sorted(by_turn)
        ],
        "by_affinity": {k: {"requests": len(v), "cache_hit_rate": hit_rate(v)} for k, v in sorted(by_aff.items())},
        "listed": [
            {
                "id": sid,
                "turns": sum(1 for r in s if r.ok),
                "errors": sum(1 for r in s if not r.ok),
                "ttft_ms": [None if r.ttft is None else round(r.ttft * 1000, 3) for r in _by_turn(s)],
                # the waits between an answer and the next turn: think or tool time, as replayed
                "think_s": [round(b.start - a.end, 3) for a, b in itertools.pairwise(_by_turn(s))],
                "cache_hit_rate": hit_rate([r for r in s if r.ok]),
            }
            for sid, s in list(by_session.items())[:LISTED]
        ],
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{numbers.sig(100 * v)}%"


def line(load: str, f: dict[str, Any]) -> str:
    """The terminal's line for a stage's sessions."""
    ttft = ", ".join(numbers.sig(t["ttft_p50_ms"]) for t in f["per_turn"])
    hits = ", ".join(_pct(t["cache_hit_rate"]) for t in f["per_turn"])
    aff = "; ".join(f"{k} {_pct(v['cache_hit_rate'])}" for k, v in f["by_affinity"].items())
    turns = numbers.sig(f["turns_mean"], trim=True)
    return (
        f"  load {load}: {f['sessions']} sessions, {turns} turns on average; TTFT p50 by "
        f"turn {ttft} ms; prefix-cache hits by turn {hits}"
        + (f" ({f['cache_source']}); turns 2+ by affinity: {aff}" if f["cache_source"] else " (not reported)")
    )


def section(stages: list[dict[str, Any]], table: Any, name: Any) -> str:
    """The HTML: per stage, TTFT and the cache hit rate by turn index, and a table."""
    out = []
    for s in stages:
        f = s.get("sessions")
        if not f:
            continue
        label = name(s)
        turns = [t["turn"] for t in f["per_turn"]]
        ttft = Panel(
            [
                ("TTFT p50", "#9467bd", turns, [t["ttft_p50_ms"] for t in f["per_turn"]]),
                ("TTFT p99", "#e377c2", turns, [t["ttft_p99_ms"] for t in f["per_turn"]]),
            ],
            "ms",
            height=180,
        )
        hits = Panel(
            [("hit rate", "#2ca02c", turns, [t["cache_hit_rate"] for t in f["per_turn"]])],
            "share of prompt tokens",
            height=180,
        )
        out.append(
            "<div class='row'>"
            + chart(f"{label}: TTFT by turn", ttft, "turn", xticks=turns, w=420)
            + chart(f"{label}: prefix-cache hits by turn", hits, "turn", xticks=turns, w=420)
            + "</div>"
        )
        head = ["turn", "requests", "ok", "prompt tokens", "TTFT p50 ms", "TTFT p99 ms", "cache hit rate"]
        rows = [
            [t["turn"], t["requests"], t["completed"], numbers.sig(t["prompt_tokens_mean"]),
             numbers.sig(t["ttft_p50_ms"]), numbers.sig(t["ttft_p99_ms"]), _pct(t["cache_hit_rate"])]
            for t in f["per_turn"]
        ]  # fmt: skip
        aff = ", ".join(f"{k}: {_pct(v['cache_hit_rate'])} of {v['requests']}" for k, v in f["by_affinity"].items())
        mean = numbers.sig(f["turns_mean"], trim=True)
        out.append(
            f"<p>{label}: {f['sessions']} sessions, {mean} turns on average; cache hits "
            f"{_pct(f['cache_hit_rate'])} of prompt tokens, turns 2+ {_pct(f['cache_hit_rate_turn2plus'])} "
            f"({f['cache_source'] or 'not reported by the backend'}); turns 2+ by the router's affinity: "
            f"{aff or '-'}</p>" + table(head, rows)
        )
    if not out:
        return ""
    return (
        "<h2>Sessions</h2><p>Per turn index: TTFT, and the share of prompt tokens the backend "
        "found in its prefix cache (as it reports it).</p>" + "".join(out)
    )


def _by_turn(rs: list[Result]) -> list[Result]:
    return sorted(rs, key=lambda r: r.turn)
