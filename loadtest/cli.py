"""loadtest: drive a router or an LLM server, ramp to the knee, report and gate.

The flags are declared in `options.py` (its USAGE has examples); this module runs them:
start the fleet if asked, drive the stages, print and write the report, and exit 1 when a
stage misses its error budget or SLO.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import sys
from typing import Any

from rich.console import Console

from mock.config import from_namespace

from . import batch as batch_mod
from . import compare as compare_mod
from . import dataset as dataset_mod
from . import fault_report
from . import faults as faults_mod
from . import models as models_mod
from . import prefix as prefix_mod
from . import search as search_mod
from . import slo as slo_mod
from . import sweep as sweep_mod
from .drive import drive
from .engine import Stage, StageRun
from .knee import find_knee
from .options import build_parser
from .orchestrate import Fleet, install_sigterm_as_interrupt
from .report import document, print_summary, write_json
from .report_html import write_html
from .workload import WorkloadSpec


def stages_from(args: argparse.Namespace, trace: dataset_mod.Trace | None = None) -> list[Stage]:
    if trace is not None:  # one stage: the whole trace, every request measured
        return [Stage(mode="trace", load=round(trace.mean_rate, 3), duration=None, warmup=0.0, seed=args.seed)]
    open_loop = args.rate is not None or args.sweep is not None
    if args.sweep:
        loads = args.sweep
    elif args.ramp:
        loads = args.ramp
    elif open_loop:
        if args.rate <= 0:
            raise SystemExit("loadtest: --rate needs a value unless --ramp gives the rates")
        loads = [args.rate]
    else:
        loads = [float(args.concurrency)]
    return [
        Stage(
            mode="open" if open_loop else "closed",
            load=load,
            duration=args.duration,
            requests=args.requests,
            warmup=args.warmup,
            arrival=args.arrival,
            seed=args.seed + i,
            burstiness=args.burstiness,
        )
        for i, load in enumerate(loads)
    ]


def batch_settings(args: argparse.Namespace) -> dict[str, object]:
    """The router's Batch API, on for `--batch-lines` (its file in the temporary directory)."""
    if not args.batch_lines:
        return {}
    import atexit
    import shutil
    import tempfile

    where = tempfile.mkdtemp(prefix="nomyo-loadtest-batch-")
    atexit.register(shutil.rmtree, where, True)
    path = os.path.join(where, "batch.db")
    return {"batch": {"enabled": True, "path": path}}


def run(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 150)
    mock_cfg = from_namespace(args, prefix="mock-")
    if args.serve_mock:
        from mock.runner import serve_forever

        serve_forever(mock_cfg, args.mock_host, args.mock_port or 11434)
        return 0
    if args.find_max_rate and (not args.slo or args.direct):
        console.print("[red]loadtest:[/] --find-max-rate needs --slo (what rate meets which SLO?) and no --direct")
        return 2
    if args.batch_lines and (args.direct or args.find_max_rate):
        console.print(
            "[red]loadtest:[/] --batch-lines compares stages alone and beside a batch: "
            "not with --direct or --find-max-rate"
        )
        return 2
    if args.direct and not args.mock_backend:
        console.print("[red]loadtest:[/] --direct needs --mock-backend")
        return 2
    try:
        dataset, trace = dataset_mod.load(args)
    except ValueError as e:
        console.print(f"[red]loadtest:[/] {e}", highlight=False, soft_wrap=True)
        return 2
    stages = stages_from(args, trace)
    model = args.model or (mock_cfg.models[0] if args.mock_backend else "llama3")
    spec = WorkloadSpec(
        api=args.api,
        endpoint=args.endpoint,
        stream=args.stream,
        model=model,
        prompt=args.prompt,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        options=dict(args.request_option),
        turns=args.turns,
        context_tokens=args.context_tokens,
        session_header=args.session_header,
        headers=dict(args.header),
        prefixes=prefix_mod.Prefixes(args.prefix_groups, args.prefix_tokens, args.prefix_skew, args.seed)
        if args.prefix_groups > 0
        else None,
        dataset=dataset,
        trace=trace,
        think=dataclasses.replace(args.think_ms, rng=random.Random(args.seed)) if args.think_ms else None,
        tool_tokens=args.tool_tokens,
    )
    if args.repeat < 1:
        console.print("[red]loadtest:[/] --repeat must be >= 1")
        return 2
    shape = _shape_problem(args) or faults_mod.problem(args)
    if shape:
        console.print(f"[red]loadtest:[/] {shape}", highlight=False)
        return 2
    config: dict[str, object] = {k: v for k, v in vars(args).items() if k not in ("header",)}
    defaults = {a.dest: a.default for a in build_parser()._actions}
    config["changed"] = {
        k: v for k, v in vars(args).items() if k in defaults and v != defaults[k] and k not in ("help",)
    }
    config["workload"] = {
        "api": spec.api,
        "endpoint": spec.endpoint,
        "stream": spec.stream,
        "model": spec.model,
        # by file name: the same file in another checkout stays comparable
        "dataset": os.path.basename(args.dataset) if args.dataset else None,
        "trace": os.path.basename(args.trace) if args.trace else None,
    }
    config["stages"] = [vars(s) for s in stages]
    for cfg in (config, config["changed"]):  # type: ignore[attr-defined]
        if "fault" in cfg:
            cfg["fault"] = [f.text for f in args.fault]
        if cfg.get("think_ms") is not None:
            t = args.think_ms
            cfg["think_ms"] = {"mean_ms": t.mean_ms, "dist": t.dist, "shape": t.shape}
    fleet: Fleet | None = None
    if args.mock_backend:
        wanted = [("--router-port", args.router_port)]
        wanted += [("--mock-port", args.mock_port + i) for i in range(args.mock_count)] if args.mock_port else []
        for flag, port in wanted:
            if port is not None and not _port_free(args.mock_host, port):
                console.print(
                    f"[red]loadtest:[/] {flag}: port {port} is already in use; something else "
                    f"would be measured. Pick a free port or leave {flag} out."
                )
                return 2
    install_sigterm_as_interrupt()
    try:
        if args.mock_backend:
            peak = max(s.load for s in stages) if stages[0].mode == "closed" and not args.find_max_rate else 1024
            fleet = Fleet(
                mock_config=mock_cfg,
                mock_count=args.mock_count,
                mock_port=args.mock_port,
                router_port=args.router_port,
                router_workers=args.router_workers,
                router_max_conc=args.router_max_conc or int(peak),
                router_extra={**dict(args.router_set), **batch_settings(args)},
                keep_config=args.keep_config,
            )
            console.print(
                f"starting {args.mock_count} mock(s) and a router ({args.router_workers} worker(s))...", highlight=False
            )
            fleet.start()
            config["router_config"] = fleet.router_config()
            if args.keep_config:
                console.print(f"router config kept at {fleet.config_path}")
            url, direct_url = fleet.router_url, (fleet.direct_url if args.direct else None)
        else:
            url, direct_url = args.url, None
        known = models_mod.check(url, args.api, spec.model, dict(args.header))
        if not known.ok:
            console.print(f"[red]loadtest:[/] {known.message}", highlight=False, soft_wrap=True)
            return 2
        if known.message:
            console.print(f"[yellow]loadtest:[/] {known.message}", highlight=False, soft_wrap=True)
        runs: list[StageRun] = []
        injector = None
        if args.find_max_rate:
            search, results = asyncio.run(search_mod.find_max_rate(args, url, spec, console))
            direct = None
        elif args.fault:
            injector = faults_mod.Injector(
                args.fault,
                fleet.mocks if fleet else [],
                mock_cfg if fleet else None,
                args.fault_hook,
                url,
            )
            results, direct = asyncio.run(_with_faults(injector, drive(args, spec, stages, url, None, console, runs)))
        elif args.batch_lines:
            results, beside = asyncio.run(batch_mod.alongside(args, spec, stages, url, console, drive))
            direct = None
        else:
            results, direct = asyncio.run(drive(args, spec, stages, url, direct_url, console))
        if injector is not None:
            faults = fault_report.analyse(injector.done, runs, injector.router_events())
            fault_report.mark_stages(results, runs, faults)
            config["faults_done"] = fault_report.public(faults)
            for text in injector.missed():
                console.print(f"[yellow]loadtest:[/] --fault {text}: the run ended before its time", highlight=False)
        if fleet is not None:
            kv = prefix_mod.kv_stats([m.url for m in fleet.mocks])
            config["mock_kv_cache"] = kv
            if kv["hit_rate"] is not None:
                console.print(
                    f"mock KV prefix cache: {kv['hit_rate']:.1%} of prompt tokens were cached (all stages, all mocks)",
                    highlight=False,
                )
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: tearing down[/]")
        return 130
    except (RuntimeError, TimeoutError) as e:
        console.print(f"[red]loadtest:[/] {e}")
        return 1
    finally:
        if fleet is not None:
            fleet.stop()
    knee = find_knee(results)
    print_summary(console, results, knee, "open" if args.find_max_rate else stages[0].mode, direct)
    faults_done = config.pop("faults_done", None)
    doc = document(config, results, knee, direct)
    if faults_done is not None:
        doc["faults"] = faults_done
        for line in fault_report.lines(faults_done):
            console.print(line, highlight=False, soft_wrap=True)
    if args.sweep:
        doc["sweep"] = sweep_mod.summarize(results)
        console.print(sweep_mod.summary_line(doc["sweep"]), highlight=False, soft_wrap=True)
    if args.batch_lines:
        doc["batch"] = beside
        batch_mod.print_report(console, beside)
    if args.find_max_rate:
        doc["max_rate"] = search
        console.print(search_mod.summary_line(search), highlight=False, soft_wrap=True)
    if args.json:
        write_json(args.json, doc)
        console.print(f"wrote {args.json}")
    if args.html:
        write_html(args.html, doc)
        console.print(f"wrote {args.html}")
    if args.find_max_rate:  # probes above the limit fail by design; the search itself is the verdict
        problems = [] if search["max_rate"] is not None else [search_mod.summary_line(search)]
    else:
        problems = stage_problems(results + (direct or []), args.max_error_rate)
    if args.slo and not args.find_max_rate:
        problems += [
            f"{m.get('target', 'router')} stage at load {m['load']:g}: SLO {slo_mod.describe(args.slo)} "
            f"met by {m['slo_met_share']:.1%} of requests < {args.slo_share:.0%} "
            f"(goodput {m['goodput']} of {m['request_throughput']} req/s)"
            for m in results
            if m["completed"] and not slo_mod.stage_meets(m, args.slo_share)
        ]
    if problems:  # the reason is the last thing printed
        console.print("[red]FAILED:[/] " + "; ".join(problems), highlight=False, soft_wrap=True)
        return 1
    return 0


async def _with_faults(injector: faults_mod.Injector, work: Any) -> Any:
    """The stages, with the faults' schedule running beside them from the first one's start."""
    task = asyncio.ensure_future(injector.run())
    try:
        return await work
    finally:
        injector.stop()
        await asyncio.gather(task, return_exceptions=True)


def _shape_problem(args: argparse.Namespace) -> str | None:
    if args.burstiness <= 0:
        return "--burstiness must be > 0"
    if args.burstiness != 1.0 and args.arrival != "gamma":
        return "--burstiness shapes gamma arrivals: add --arrival gamma (and --rate)"
    if args.timeslice is not None and args.timeslice <= 0:
        return "--timeslice must be > 0 seconds"
    if args.tool_tokens < 0:
        return "--tool-tokens must be >= 0"
    if (args.think_ms or args.tool_tokens) and args.turns < 2 and not args.trace:
        return "--think-ms and --tool-tokens act between a session's turns: add --turns N (N >= 2) or a session --trace"
    if args.sweep and (args.ramp or args.rate is not None or args.find_max_rate or args.trace):
        return "--sweep gives the stages' rates itself: leave out --ramp, --rate, --find-max-rate and --trace"
    return None


def stage_problems(stages: list[dict], max_error_rate: float) -> list[str]:
    """Why a run must not pass: a stage with nothing completed, or too many errors."""
    out = []
    for m in stages:
        where = f"{m.get('target', 'router')} stage at load {m['load']:g}"
        if m["completed"] == 0:
            why = ", ".join(f"{k} x{v}" for k, v in m["errors"].items()) or "no request was sent"
            out.append(f"{where}: no request completed ({why})")
        elif m["error_rate"] > max_error_rate:
            errors = ", ".join(f"{k} x{v}" for k, v in m["errors"].items())
            out.append(f"{where}: error rate {m['error_rate']:.1%} > {max_error_rate:.1%} ({errors})")
    return out


def _port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "compare":
        return compare_mod.main(argv[1:])
    args = build_parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
