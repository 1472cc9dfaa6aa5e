"""nomyo-router beside its peers, in one pinned run on this machine.

    python bench/peers.py [--seconds 4] [--reps 3] [--conc 1,8,32] [--only nomyo,floor,olla,vllm-router]

It measures the router an outside user would: the `nomyo-router` command installed beside the
interpreter that runs this script (`.venv-pip/bin/python bench/peers.py`: the build `pip
install .` gives, `make pip-build`; `.venv-compiled/bin/python`: the compiled one, `make
compiled`), started with nothing but a plain config (`spawn.plain_config`: the mock's URL and
`--slots` for it) and its port, and every peer, the router included, started afresh for each
run: no run is served by a process that an earlier run warmed (`--warm` keeps one process per
peer across the runs, the method of the figures before; Olla is restarted after every run
either way). `--also .venv-compiled/bin/nomyo-router` measures a second build in the same
interleaved run, as "nomyo-router (also)", with its ratios to the first.

Builds or installs the peers it can, into ~/.cache/nomyo-router/peers (reused next time):
  * Olla (Go): `go install github.com/thushan/olla@latest`; when the module proxy does not
    serve it, `--olla-src DIR` builds a checkout with `go build`, `--olla-bin PATH` takes a binary;
  * vllm-router (Rust, from PyPI): `pip install vllm-router` into its own venv, round_robin policy;
  * the floor: bench/minimal_passthrough.py (uvicorn + one aiohttp session, nothing else).
A peer that cannot be had is skipped with the reason printed; the run goes on without it.

Every router under test runs on core 0 (`taskset -c 0`); the zero-delay mock, wrk and this
script run on core 1. All of them serve the same OpenAI route (/v1/chat/completions) from the
same mock. Each (peer, scenario) is measured `--reps` times, peers interleaved within a
repetition so drift hits them alike, and the median is printed:
  * non-stream chat (8 tokens) at each `--conc`: req/s, p50, and the peer's CPU per request
    (utime+stime of its process tree over the run / requests wrk completed);
  * 200-token streams at `--stream-conc`: req/s and the peer's CPU per relayed chunk (CPU per
    request / 200: one chunk per token);
  * added p50 at c=1 over the direct mock, and idle RSS;
  * worker scaling (`--scaling 1,2`, bench/scaling.py): nomyo-router with 1 and 2 workers on
    core 0, each worker's CPU per request and the state host's CPU per operation, and the
    req/s projected for a core per worker, from `--scaling-pairs` (5) alternated pairs of runs.
It is a benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from contextlib import ExitStack

import scaling
from common import MockConfig, _children, cpu_of, mock_process, rss_mb, wrk
from rivals import log, olla_binary, run_floor, run_olla, run_vllm_router, vllm_router_binary
from spawn import MODEL, PATH, Peer, _nomyo_at, run_nomyo

TOKENS = 200  # the mock's answer length; non-stream requests ask for 8 of them


# ---- measuring ----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime+stime of `pid` and its live descendants (threads are counted in their process)."""
    return sum(cpu_of(p) for p in [pid] + _children(pid))


def measure(peer: Peer | None, mock: str, body: str, conc: int, seconds: float, route: str = PATH) -> dict[str, float]:
    """One wrk run through `peer` (None: straight to the mock) on `route` (the peer's own
    prefix kept, e.g. Olla's /olla/proxy)."""
    url = (peer.url + peer.path.replace(PATH, route)) if peer else mock + route
    c0 = cpu_seconds(peer.pid) if peer else 0.0
    r = wrk(url, body, conc, seconds)
    r["requests"] = r["rps"] * round(seconds)  # wrk runs whole seconds
    r["cpu_s"] = cpu_seconds(peer.pid) - c0 if peer else float("nan")
    r["cpu_us_per_req"] = r["cpu_s"] / r["requests"] * 1e6 if peer and r["requests"] else float("nan")
    # only answered requests count: a peer failing fast would otherwise look fast
    r["rps"] = max(0.0, r["requests"] - r["non2xx"]) / round(seconds)
    return r


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def print_ratios(
    table: dict[str, dict[str, dict[str, float]]],
    added: dict[str, dict[str, float]],
    labels: list[str],
    me: str,
    other: str,
) -> None:
    """`me` over `other` in every scenario: req/s, CPU per request and added p50 at c=1."""
    for label in labels:
        theirs = table[label][other]["rps"]
        if theirs:
            print(f"{me} / {other} at {label}: {table[label][me]['rps'] / theirs:.2f}x req/s")
        else:
            print(f"{me} / {other} at {label}: {other} answered nothing with 2xx")
    for label in labels:
        mine, theirs = table[label][me]["cpu_us_per_req"], table[label][other]["cpu_us_per_req"]
        print(f"{me} / {other} at {label}: {mine / theirs:.2f}x CPU/request ({mine:.0f} / {theirs:.0f} µs)")
    for label, by_name in added.items():
        mine, theirs = by_name[me], by_name[other]
        print(f"{me} / {other} at {label}: {mine / theirs:.2f}x added p50 (+{mine:.0f} / +{theirs:.0f} µs)")


def added_p50(cell: dict[str, dict[str, float]], names: list[str]) -> dict[str, float]:
    """Each peer's median p50 over the direct mock's in one scenario, in µs."""
    return {n: (cell[n]["p50_ms"] - cell["direct"]["p50_ms"]) * 1000 for n in names}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="length of one wrk run")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each (peer, scenario); medians printed")
    p.add_argument("--conc", default="1,8,32", help="non-stream concurrencies")
    p.add_argument("--stream-conc", type=int, default=32, help="concurrency of the 200-token stream run (0: none)")
    p.add_argument(
        "--ollama-conc", default="32", help="concurrencies of the same non-stream chat on /api/chat ('': none)"
    )
    p.add_argument("--only", default="nomyo,floor,olla,vllm-router")
    p.add_argument("--olla-bin", default=None)
    p.add_argument("--olla-src", default=None, help="a checkout of github.com/thushan/olla to `go build`")
    p.add_argument("--vllm-router", default="vllm-router==0.1.17", help="pip requirement")
    p.add_argument("--no-pin", action="store_true", help="do not pin (peers and mock/wrk share all cores)")
    p.add_argument("--scaling", default="1,2", help="worker counts for the scaling table ('' : none)")
    p.add_argument(
        "--scaling-pairs",
        type=int,
        default=5,
        help="alternated pairs of runs behind the scaling figure (bench/scaling.py's --reps)",
    )
    p.add_argument(
        "--slots",
        type=int,
        default=4096,
        help="the router's max_concurrent for the mock (0: its default of 2; beyond them requests queue, by design)",
    )
    p.add_argument(
        "--also",
        default=None,
        metavar="NOMYO_ROUTER",
        help="another build's nomyo-router command (e.g. .venv-compiled/bin/nomyo-router), measured in the same "
        "interleaved run as 'nomyo-router (also)'",
    )
    p.add_argument("--warm", action="store_true", help="one process per peer across all runs (Olla still restarted)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk")
    wanted = set(args.only.split(","))
    pin = not args.no_pin and len(os.sched_getaffinity(0)) >= 2 and shutil.which("taskset") is not None
    core = 0 if pin else None
    if pin:
        os.sched_setaffinity(0, {1})  # this script, the mock (started below) and wrk: core 1
    olla = olla_binary(args) if "olla" in wanted else None
    vrouter = vllm_router_binary(args) if "vllm-router" in wanted else None

    mock_cfg = MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=TOKENS, parallel=100_000, max_queue=100_000)
    whole = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8})
    stream = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "stream": True, "max_tokens": TOKENS}
    )
    ollama = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello there"}],
            "stream": False,
            "options": {"num_predict": 8},
        }
    )
    scenarios = [(f"c={c}", whole, c, PATH) for c in (int(x) for x in args.conc.split(","))]
    scenarios += [
        (f"/api/chat c={c}", ollama, c, "/api/chat") for c in (int(x) for x in args.ollama_conc.split(",") if x)
    ]
    if args.stream_conc:
        scenarios.append((f"stream c={args.stream_conc}", stream, args.stream_conc, PATH))

    with ExitStack() as stack:
        mock = stack.enter_context(mock_process(mock_cfg)).url
        peers: list[Peer] = []
        if "nomyo" in wanted:
            peers.append(stack.enter_context(run_nomyo(mock, core, slots=args.slots or None)))
            if args.also:
                also = run_nomyo(mock, core, slots=args.slots or None, exe=args.also, name="nomyo-router (also)")
                peers.append(stack.enter_context(also))
        if "floor" in wanted:
            peers.append(stack.enter_context(run_floor(mock, core)))
        if olla:
            peers.append(stack.enter_context(run_olla(olla, mock, core)))
        if vrouter:
            peers.append(stack.enter_context(run_vllm_router(vrouter, mock, core)))
        time.sleep(1.0)
        idle = {pe.name: rss_mb(pe.pid) for pe in peers}
        scaled = (
            scaling.measure(
                mock,
                [int(x) for x in args.scaling.split(",")],
                32,
                args.seconds,
                args.scaling_pairs,
                lambda m, n, shared=False: _nomyo_at(m, core, n, shared),
            )
            if args.scaling and "nomyo" in wanted
            else []
        )
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        order: list[Peer | None] = [None, *peers]
        for rep in range(args.reps):
            for label, body, conc, route in scenarios:
                for peer in order:
                    name = peer.name if peer else "direct"
                    r = measure(peer, mock, body, conc, args.seconds, route)
                    results.setdefault((name, label), []).append(r)
                    if peer is not None and peer.restart is not None and not (args.warm and peer.name != "olla"):
                        peer.restart(peer)  # the next run meets a fresh process, as in a harness of its own
                    log(
                        f"rep {rep + 1}/{args.reps} {label:14} {name:13} {r['rps']:8.0f} req/s p50 "
                        f"{r['p50_ms']:7.3f} ms cpu {r['cpu_us_per_req']:6.0f} us/req"
                        + (f" non2xx {r['non2xx']}" if r["non2xx"] else "")
                    )
                order = order[1:] + order[:1]  # rotate who goes first

    names = ["direct"] + [pe.name for pe in peers]
    table: dict[str, dict[str, dict[str, float]]] = {}
    for (name, label), rows in results.items():
        table.setdefault(label, {})[name] = {k: median(rows, k) for k in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req")}
        table[label][name]["non2xx"] = sum(r["non2xx"] for r in rows)
    print(
        f"\nmedians of {args.reps} x {args.seconds:g}s wrk runs, "
        + ("one process per peer across runs" if args.warm else "every peer started afresh for each run")
        + f"; the router with {args.slots or 'its default of 2'} slots for the mock; "
        + ("peers pinned to core 0, mock+wrk to core 1" if pin else "not pinned")
    )
    print("| scenario | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, *_ in scenarios:
        cells = []
        for n in names:
            m = table[label][n]
            if n == "direct":
                cells.append(f"{m['rps']:,.0f} req/s")
            elif label.startswith("stream"):
                cells.append(f"{m['rps']:,.0f} req/s ({m['cpu_us_per_req'] / TOKENS:.1f} µs CPU/chunk)")
            else:
                cells.append(f"{m['rps']:,.0f} req/s ({m['cpu_us_per_req']:.0f} µs CPU/req)")
            if m["non2xx"]:
                cells[-1] += f" [{m['non2xx']:.0f} non-2xx]"
        print(f"| {label} | " + " | ".join(cells) + " |")
    added = {label: added_p50(table[label], names[1:]) for label, _, conc, _ in scenarios if conc == 1}
    for label, by_name in added.items():
        print(f"| added p50 at {label} | – | " + " | ".join(f"+{by_name[n]:.0f} µs" for n in names[1:]) + " |")
    print("| idle RSS | – | " + " | ".join(f"{idle[n]:.1f} MB" for n in names[1:]) + " |")
    for me in (n for n in names if n.startswith("nomyo-router")):
        if "olla" in names:
            print_ratios(table, added, [label for label, *_ in scenarios], me, "olla")
    if "nomyo-router (also)" in names:
        print_ratios(table, added, [label for label, *_ in scenarios], "nomyo-router (also)", "nomyo-router")
    if scaled:
        print(
            f"\nworker scaling, c=32 non-stream (bench/scaling.py: every worker on core {core}; "
            "projected = a core each)"
        )
        scaling.print_table(scaled)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "pinned": pin,
                    "fresh_per_run": not args.warm,
                    "slots": args.slots,
                    "reps": args.reps,
                    "seconds": args.seconds,
                    "idle_rss_mb": idle,
                    "table": table,
                    "scaling": scaled,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
