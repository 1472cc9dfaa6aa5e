"""Worker scaling: what N router workers do with a core each, measured on a 2-core machine.

    python bench/scaling.py [--workers 1,2,4] [--seconds 4] [--reps 5] [--conc 32]

A 2-core machine cannot give N workers a core each *and* run the mock and the load
generator, so this measures what decides scaling and projects from it. The router runs on
core 0 (`taskset -c 0`), the zero-delay mock, wrk and this script on core 1; non-stream chat
at `--conc`; CPU = utime+stime of the router's worker processes (from /proc) over the
requests they answered (wrk tallies the `X-Router-Worker` header of every answer).

  * one worker with in-process state: CPU per request c1;
  * one worker set up exactly as each worker of N (`state: shared`, prometheus-client's
    multiprocess metrics): CPU per request cN — the per-request cost a worker pays for
    sharing (the slot table, the pin table, shared metrics);
  * with a core each, N workers serve N / cN req/s: while slots are free no request sends
    the host a message (`bench/state_ops.py` measures the host's CPU for a request that
    must wait), so nothing else grows with N. Scaling = N × c1 / cN;
  * for reference, N workers measured together on core 0: they time-share it, and each
    sees 1/N of the connections, so fewer requests per event-loop turn.
It is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from typing import Any

PATH = "/v1/chat/completions"  # the request of bench/peers.py's non-stream rows
BODY = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8})

TALLY = """
wrk.method = 'POST'
wrk.body = '%s'
wrk.headers['Content-Type'] = 'application/json'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) tally = {} end
function response(status, headers, body)
  if status == 200 then
    local w = headers['x-router-worker'] or headers['X-Router-Worker'] or '?'
    tally[w] = (tally[w] or 0) + 1
  end
end
function done(summary, latency, requests)
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get('tally')) do io.write('TALLY ', k, ' ', v, '\\n') end
  end
end
"""


def tallied_wrk(url: str, conc: int, seconds: float) -> tuple[float, dict[int, int]]:
    from common import wrk_output

    out = wrk_output(url, TALLY % BODY.replace("'", "\\'"), conc, seconds)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    tally = {int(pid): int(n) for pid, n in re.findall(r"^TALLY (\d+) (\d+)$", out, re.M)}
    return rps, tally


def run_once(url: str, master: int, conc: int, seconds: float) -> dict[str, Any]:
    from common import _children, cpu_of

    pids = [master] + _children(master)  # one worker: the master serves itself
    before = {p: cpu_of(p) for p in pids}
    rps, tally = tallied_wrk(url, conc, seconds)
    cpu = sum(cpu_of(p) - before[p] for p in pids if p in tally)
    total = sum(tally.values())
    return {"rps": rps, "cpu_us_per_req": cpu / total * 1e6 if total else float("nan"), "workers": len(tally)}


def _runs(spawn, conc: int, seconds: float, reps: int) -> dict[str, Any]:
    with spawn as (url, master):
        time.sleep(1.0)
        tallied_wrk(url + PATH, conc, 1)  # warm every worker's pool
        runs = [run_once(url + PATH, master, conc, seconds) for _ in range(reps)]
    return {k: statistics.median(r[k] for r in runs) for k in ("rps", "cpu_us_per_req")}


def _alternated(one, each, conc: int, seconds: float, reps: int) -> tuple[dict, dict, list[float]]:
    """Both routers up at once (the idle one costs nothing), their runs alternated — one,
    each, one, each, … — so that the machine's drift falls on both alike. Medians of each,
    and the ratio c1 / cN of every pair of neighbouring runs."""
    with one as (url1, pid1), each as (url2, pid2):
        time.sleep(1.0)
        for url in (url1, url2):
            tallied_wrk(url + PATH, conc, 1)  # warm every worker's pool
        a, b = [], []
        for _ in range(reps):
            a.append(run_once(url1 + PATH, pid1, conc, seconds))
            b.append(run_once(url2 + PATH, pid2, conc, seconds))
    ratios = [x["cpu_us_per_req"] / y["cpu_us_per_req"] for x, y in zip(a, b, strict=True)]

    def med(runs: list[dict[str, float]]) -> dict[str, float]:
        return {k: statistics.median(r[k] for r in runs) for k in ("rps", "cpu_us_per_req")}

    return med(a), med(b), ratios


def measure(mock_url: str, workers: list[int], conc: int, seconds: float, reps: int, spawn) -> list[dict[str, Any]]:
    """`spawn(mock_url, workers, shared=False)`: a context manager yielding (base url, master
    pid) of a router; `shared`: one worker set up exactly as each of N. Scaling for N is
    N × the median over alternated pairs of c1 / cN; the spread of those pairs is shown."""
    one, each, ratios = _alternated(spawn(mock_url, 1), spawn(mock_url, 1, shared=True), conc, seconds, reps)
    c1, cs = one["cpu_us_per_req"], each["cpu_us_per_req"]
    r = statistics.median(ratios)
    rows = [
        {"label": "1 worker (in-process state)", "rps": one["rps"], "cpu": c1, "projected": 1e6 / c1, "scaling": 1.0},
        {
            "label": "1 worker set up as one of N (shared store, multiprocess metrics)",
            "rps": each["rps"],
            "cpu": cs,
            "projected": None,
            "scaling": None,
        },
    ]
    for n in (w for w in workers if w > 1):
        together = _runs(spawn(mock_url, n), conc, seconds, reps)
        rows.append(
            {
                "label": f"{n} workers, a core each (projected: {n} × c1 / cN, pairs "
                f"{n * min(ratios):.2f}–{n * max(ratios):.2f}×)",
                "rps": None,
                "cpu": cs,
                "projected": n * 1e6 / c1 * r,
                "scaling": n * r,
            }
        )
        rows.append(
            {
                "label": f"{n} workers sharing core 0 (measured)",
                "rps": together["rps"],
                "cpu": together["cpu_us_per_req"],
                "projected": None,
                "scaling": None,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| router | req/s on core 0 | CPU/req | req/s with a core per worker | scaling |")
    print("|---|---|---|---|---|")
    for r in rows:
        rps = "–" if r["rps"] is None else f"{r['rps']:,.0f}"
        proj = "–" if r["projected"] is None else f"{r['projected']:,.0f}"
        scale = "–" if r["scaling"] is None else f"{r['scaling']:.2f}×"
        print(f"| {r['label']} | {rps} | {r['cpu']:.0f} µs | {proj} | {scale} |")


def main() -> None:
    from common import MockConfig, mock_process
    from spawn import _nomyo_at

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--conc", type=int, default=32)
    args = p.parse_args()
    os.sched_setaffinity(0, {1})
    cfg = MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=8, parallel=100_000, max_queue=100_000)
    with mock_process(cfg) as m:
        rows = measure(
            m.url,
            [int(x) for x in args.workers.split(",")],
            args.conc,
            args.seconds,
            args.reps,
            lambda url, n, shared=False: _nomyo_at(url, 0, n, shared),
        )
    print(
        f"\nmedians of {args.reps} x {args.seconds:g}s wrk runs at c={args.conc}; router on core 0, mock+wrk on core 1"
    )
    print_table(rows)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
