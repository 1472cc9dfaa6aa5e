"""Service-level objectives and goodput (`--slo ttft=500ms,e2el=10s,itl=50ms`).

A request *meets the SLO* when it succeeded and every given bound holds for it:
  ttft  time to the first content            e2el  whole request (end-to-end latency)
  tpot  (e2el - ttft) / (output tokens - 1)  itl   its largest gap between two chunks
Goodput is the stage's throughput times the share of its measured requests (those sent
inside its window, errors included) that met the SLO, in req/s. A stage meets the SLO
when its goodput is at least `--slo-share` (default 95%) of its throughput and it
completed requests — the same rule `--find-max-rate` searches with.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from .client import Result

KINDS = ("ttft", "e2el", "tpot", "itl")
UNITS = {"ms": 0.001, "s": 1.0}


def parse_duration(text: str) -> float:
    """'500ms' or '10s' -> seconds; a bare number is refused (which unit?)."""
    t = text.strip().lower()
    for unit in ("ms", "s"):
        if t.endswith(unit):
            try:
                value = float(t[: -len(unit)]) * UNITS[unit]
            except ValueError:
                break
            if value <= 0:
                raise argparse.ArgumentTypeError(f"{text!r}: an SLO bound must be > 0")
            return value
    raise argparse.ArgumentTypeError(f"{text!r}: give a duration with its unit, e.g. 500ms or 10s")


def parse_slo(text: str) -> dict[str, float]:
    """'ttft=500ms,e2el=10s' -> {'ttft': 0.5, 'e2el': 10.0} (seconds)."""
    out: dict[str, float] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or name not in KINDS:
            raise argparse.ArgumentTypeError(f"{item!r}: expected NAME=DURATION with NAME one of {', '.join(KINDS)}")
        out[name] = parse_duration(value)
    if not out:
        raise argparse.ArgumentTypeError("an empty SLO; e.g. ttft=500ms,e2el=10s")
    return out


def meets(r: Result, slo: dict[str, float]) -> bool:
    if not r.ok:
        return False
    if "e2el" in slo and r.latency > slo["e2el"]:
        return False
    if "ttft" in slo and (r.ttft is None or r.ttft > slo["ttft"]):
        return False
    if (
        "tpot" in slo
        and r.ttft is not None
        and r.out_tokens > 1
        and (r.latency - r.ttft) / (r.out_tokens - 1) > slo["tpot"]
    ):
        return False
    if "itl" in slo and r.itl and max(r.itl) > slo["itl"]:
        return False
    return True


def goodput(results: Iterable[Result], throughput: float, slo: dict[str, float]) -> dict[str, Any]:
    results = list(results)
    good = sum(1 for r in results if meets(r, slo))
    share = good / len(results) if results else 0.0
    return {"goodput": round(throughput * share, 3), "slo_met_share": round(share, 4)}


def stage_meets(m: dict[str, Any], min_share: float) -> bool:
    return bool(m["completed"]) and m.get("slo_met_share", 0.0) >= min_share


def describe(slo: dict[str, float]) -> str:
    return ",".join(f"{k}={v * 1000:g}ms" if v < 1 else f"{k}={v:g}s" for k, v in slo.items())
