"""`loadtest compare BASELINE.json CURRENT.json --max-regression 10%`: gate CI on regressions.

Stages are matched by mode and load. A gated metric regresses when it moves the wrong
way by more than the threshold: throughput down; p50/p99 latency and TTFT up; the error
rate up by more than `--max-error-increase` (absolute). Exit 1 on any regression.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from .report import SCHEMA

HIGHER_IS_BETTER = ("request_throughput",)
LOWER_IS_BETTER = ("median_e2el_ms", "p99_e2el_ms", "median_ttft_ms", "p99_ttft_ms")


def parse_percent(text: str) -> float:
    t = text.strip()
    value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    if value < 0:
        raise argparse.ArgumentTypeError("the threshold must be >= 0")
    return value


def _load(path: str) -> dict[str, Any]:
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    return doc


def compare(base: dict[str, Any], cur: dict[str, Any], max_regression: float,
            max_error_increase: float) -> tuple[list[dict[str, Any]], bool]:
    rows: list[dict[str, Any]] = []
    by_load = {(s["mode"], s["load"]): s for s in base["stages"]}
    regressed = False
    for s in cur["stages"]:
        b = by_load.get((s["mode"], s["load"]))
        if b is None:
            continue
        for key in HIGHER_IS_BETTER + LOWER_IS_BETTER:
            bv, cv = b.get(key), s.get(key)
            if bv is None or cv is None:
                continue
            change = (cv - bv) / bv if bv else 0.0
            bad = change < -max_regression if key in HIGHER_IS_BETTER else change > max_regression
            rows.append({"load": s["load"], "metric": key, "baseline": bv, "current": cv,
                         "change": change, "regressed": bad})
            regressed |= bad
        bad = s["error_rate"] - b["error_rate"] > max_error_increase
        rows.append({"load": s["load"], "metric": "error_rate", "baseline": b["error_rate"],
                     "current": s["error_rate"], "change": s["error_rate"] - b["error_rate"], "regressed": bad})
        regressed |= bad
    bk, ck = base.get("knee", {}), cur.get("knee", {})
    if bk.get("max_request_throughput") and ck.get("max_request_throughput") is not None:
        change = (ck["max_request_throughput"] - bk["max_request_throughput"]) / bk["max_request_throughput"]
        bad = change < -max_regression
        rows.append({"load": "all", "metric": "max_request_throughput", "baseline": bk["max_request_throughput"],
                     "current": ck["max_request_throughput"], "change": change, "regressed": bad})
        regressed |= bad
    return rows, regressed


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="loadtest compare", description=__doc__.split("\n\n")[0])
    p.add_argument("baseline")
    p.add_argument("current")
    p.add_argument("--max-regression", type=parse_percent, default=0.10,
                   help="allowed relative change in the bad direction, e.g. 10%% (default)")
    p.add_argument("--max-error-increase", type=float, default=0.01,
                   help="allowed absolute rise of the error rate (default 0.01 = 1 point)")
    args = p.parse_args(argv)
    console = Console()
    try:
        base, cur = _load(args.baseline), _load(args.current)
    except (OSError, ValueError) as e:
        console.print(f"[red]compare:[/] {e}")
        return 2
    rows, regressed = compare(base, cur, args.max_regression, args.max_error_increase)
    if not rows:
        console.print("[red]compare:[/] no stage of the current run matches the baseline's loads")
        return 2
    t = Table(title=f"compare (threshold {args.max_regression:.0%})")
    for col in ("load", "metric", "baseline", "current", "change", "verdict"):
        t.add_column(col, justify="right")
    for r in rows:
        change = f"{r['change']:+.1%}" if r["metric"] != "error_rate" else f"{r['change']:+.4f}"
        verdict = "[red]REGRESSED[/]" if r["regressed"] else "ok"
        t.add_row(str(r["load"]), r["metric"], f"{r['baseline']:.4g}", f"{r['current']:.4g}", change, verdict)
    console.print(t)
    console.print("[red]regression[/]" if regressed else "[green]no regression[/]")
    return 1 if regressed else 0
