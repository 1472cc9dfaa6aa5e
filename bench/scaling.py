"""Worker scaling: what N router workers do with a core each, measured on a 2-core machine.

    python bench/scaling.py [--workers 1,2,4] [--seconds 4] [--reps 3] [--conc 32]

A 2-core machine cannot give N workers a core each *and* run the mock and the load
generator, so this measures what decides scaling and projects from it:

  * every worker of the router on core 0 (`taskset -c 0`), the zero-delay mock, wrk and
    this script on core 1; non-stream chat at `--conc`;
  * per worker: its CPU (utime+stime from /proc) and the requests it answered (wrk tallies
    the `X-Router-Worker` header of every answer), so its CPU per request `c`;
  * the host's extra CPU per operation `h`: the hosting worker's CPU beyond what its own
    requests cost at the other workers' `c`, over all requests of the run;
  * projected req/s with a core per worker and the load spread evenly:
    R(N) = N / (c + N·h) — each worker's core serves its share, the host's also serves
    everybody's messages — and the host's own ceiling 1 / h.
The scaling printed is R(N) against one worker's 1 / c. It is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
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


def cpu_of(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def host_pid(master: int) -> int | None:
    """The hosting worker, from the state lock file (`<state dir>/<master pid>-<hash>.lock`)."""
    from nomyo_router.state import private
    for path in glob.glob(os.path.join(private.state_dir(), f"{master}-*.lock")):
        try:
            return int(open(path).read().strip() or 0) or None
        except (OSError, ValueError):
            continue
    return None


def tallied_wrk(url: str, conc: int, seconds: float) -> tuple[float, dict[int, int]]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(TALLY % BODY.replace("'", "\\'"))
        script = f.name
    try:
        out = subprocess.run(["wrk", "-t1", f"-c{conc}", f"-d{max(1, round(seconds))}s", "-s", script, url],
                             capture_output=True, text=True, timeout=seconds + 30).stdout
    finally:
        os.unlink(script)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    tally = {int(pid): int(n) for pid, n in re.findall(r"^TALLY (\d+) (\d+)$", out, re.M)}
    return rps, tally


def run_once(url: str, master: int, conc: int, seconds: float) -> dict[str, Any]:
    from common import _children
    pids = [master] + _children(master)  # one worker: the master serves itself
    before = {p: cpu_of(p) for p in pids}
    rps, tally = tallied_wrk(url, conc, seconds)
    cpu = {p: cpu_of(p) - before[p] for p in pids if p in tally}
    total = sum(tally.values())
    host = host_pid(master) if len(tally) > 1 else None
    per_req = {p: cpu[p] / tally[p] for p in cpu if tally[p]}
    others = [per_req[p] for p in per_req if p != host]
    c = statistics.mean(others) if others else float("nan")
    h = max(0.0, (cpu[host] - tally[host] * c) / total) if host in cpu and others else 0.0
    return {"rps": rps, "requests": total, "c_us": c * 1e6, "h_us": h * 1e6,
            "cpu_us_per_req": sum(cpu.values()) / total * 1e6 if total else float("nan"),
            "workers": len(tally), "host": host}


def measure(mock_url: str, workers: list[int], conc: int, seconds: float, reps: int,
            spawn) -> list[dict[str, Any]]:
    """`spawn(mock_url, workers)`: a context manager yielding (base url, master pid) of a router."""
    rows = []
    for n in workers:
        with spawn(mock_url, n) as (url, master):
            time.sleep(1.0)
            tallied_wrk(url + PATH, conc, 1)  # warm every worker's pool
            runs = [run_once(url + PATH, master, conc, seconds) for _ in range(reps)]
        row = {k: statistics.median(r[k] for r in runs) for k in ("rps", "c_us", "h_us", "cpu_us_per_req")}
        row["n"] = n
        row["served_by"] = max(r["workers"] for r in runs)
        rows.append(row)
    one = next((r for r in rows if r["n"] == 1), None)
    for r in rows:
        c, h = r["c_us"] / 1e6, r["h_us"] / 1e6
        r["projected_rps"] = r["n"] / (c + r["n"] * h)
        r["host_ceiling_rps"] = 1 / h if h else float("inf")
        r["scaling"] = r["projected_rps"] * one["c_us"] / 1e6 if one else float("nan")
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| workers | measured req/s (all on core 0) | CPU/req per worker | host CPU per op | "
          "projected req/s, a core each | host ceiling | scaling vs 1 worker |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ceiling = "–" if r["n"] == 1 else (f"{r['host_ceiling_rps']:,.0f} req/s"
                                           if r["host_ceiling_rps"] != float("inf") else "∞")
        host = "–" if r["n"] == 1 else f"{r['h_us']:.1f} µs"
        print(f"| {r['n']} | {r['rps']:,.0f} | {r['c_us']:.0f} µs | {host} | {r['projected_rps']:,.0f} | "
              f"{ceiling} | {r['scaling']:.2f}× |")


def main() -> None:
    from common import MockConfig, mock_process
    from peers import _nomyo_at

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--conc", type=int, default=32)
    args = p.parse_args()
    os.sched_setaffinity(0, {1})
    cfg = MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=8, parallel=100_000, max_queue=100_000)
    with mock_process(cfg) as m:
        rows = measure(m.url, [int(x) for x in args.workers.split(",")], args.conc, args.seconds, args.reps,
                       lambda url, n: _nomyo_at(url, 0, n))
    print(f"\nmedians of {args.reps} x {args.seconds:g}s wrk runs at c={args.conc}; router on core 0, mock+wrk on core 1")
    print_table(rows)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
