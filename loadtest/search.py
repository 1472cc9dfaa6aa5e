"""`--find-max-rate LO,HI`: the highest open-loop rate that still meets the SLO.

A probe is one open-loop stage at a rate; it *passes* when its goodput is at least
`--slo-share` (95%) of its throughput (loadtest/slo.py) and its error rate is within
`--max-error-rate`. The search probes LO (must pass) and HI (must fail), then bisects the
bracket [highest passing, lowest failing]: geometrically while HI/LO > 2 (wide ranges
take few stages), arithmetically after; it stops when the bracket is narrower than
`--search-precision` of its lower end or after `--search-stages` probes in all. The
answer is the bracket's lower end; the true limit lies inside the bracket (one step).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from rich.console import Console

from . import slo as slo_mod
from .drive import measure
from .engine import Stage
from .numbers import sig
from .workload import WorkloadSpec


def parse_bounds(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI in req/s, e.g. 1,256; got {text!r}") from None
    if not 0 < lo < hi:
        raise argparse.ArgumentTypeError("need 0 < LO < HI")
    return lo, hi


def add_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--find-max-rate",
        type=parse_bounds,
        nargs="?",
        const=(1.0, 256.0),
        default=None,
        metavar="LO,HI",
        help="search the highest open-loop rate meeting --slo between LO and HI req/s "
        "(bisection; no value: 1,256; default: off)",
    )
    g.add_argument("--search-stages", type=int, default=8, help="most probes (stages) the search may run")
    g.add_argument(
        "--search-precision",
        type=float,
        default=0.05,
        help="stop when the bracket is narrower than this share of its lower end",
    )


def passes(m: dict[str, Any], args: argparse.Namespace) -> bool:
    return slo_mod.stage_meets(m, args.slo_share) and m["error_rate"] <= args.max_error_rate


async def find_max_rate(
    args: argparse.Namespace, url: str, spec: WorkloadSpec, console: Console
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lo, hi = args.find_max_rate
    probes: list[dict[str, Any]] = []

    async def probe(rate: float) -> bool:
        stage = Stage(
            mode="open",
            load=round(rate, 3),
            duration=args.duration,
            requests=args.requests,
            warmup=args.warmup,
            arrival=args.arrival,
            seed=args.seed + len(probes),
            burstiness=args.burstiness,
        )
        label = f"search {len(probes) + 1}/{args.search_stages} rate={sig(stage.load, trim=True)}"
        m = await measure(args, url, spec, stage, "router", label, console)
        m["slo_pass"] = passes(m, args)
        probes.append(m)
        return m["slo_pass"]

    good: float | None = None
    bad: float | None = None
    if await probe(lo):
        good = lo
        if await probe(hi):
            good = hi
        else:
            bad = hi
            while len(probes) < args.search_stages and (bad - good) / good > args.search_precision:
                mid = math.sqrt(good * bad) if bad / good > 2 else (good + bad) / 2
                if await probe(mid):
                    good = mid
                else:
                    bad = mid
    else:
        bad = lo
    result = {
        "max_rate": round(good, 3) if good is not None else None,
        "bracket": [round(good, 3) if good is not None else None, round(bad, 3) if bad is not None else None],
        "step": round(bad - good, 3) if good is not None and bad is not None else None,
        "stages": len(probes),
        "slo": args.slo,
        "slo_share": args.slo_share,
        "probes": [
            {
                "rate": m["load"],
                "pass": m["slo_pass"],
                "request_throughput": m["request_throughput"],
                "goodput": m.get("goodput"),
                "slo_met_share": m.get("slo_met_share"),
                "error_rate": m["error_rate"],
            }
            for m in probes
        ],
    }
    return result, sorted(probes, key=lambda m: m["load"])


def summary_line(r: dict[str, Any]) -> str:
    slo = slo_mod.describe(r["slo"])
    if r["max_rate"] is None:
        return f"max rate at SLO {slo}: none — even {sig(r['bracket'][1], trim=True)} req/s misses it"
    if r["bracket"][1] is None:
        return (
            f"max rate at SLO {slo}: at least {sig(r['max_rate'], trim=True)} req/s (the upper bound passed; raise HI)"
        )
    lo, hi = (sig(b, trim=True) for b in r["bracket"])
    top = sig(r["max_rate"], trim=True)
    return f"max rate at SLO {slo}: {top} req/s (the limit lies in [{lo}, {hi}], {r['stages']} stages)"
