"""`--fault T:ACTION:TARGET[:xF]`: faults on a schedule during a run.

  --fault 30s:kill:mock-1      SIGKILL the first spawned mock (its process group)
  --fault 45s:restart:mock-1   start it again on the same port (a live one is killed first)
  --fault 30s:drain:mock-2     it refuses new requests with 503 (its busy answer) and
                               finishes those in flight, as a server being drained does
  --fault 20s:slow:mock-1:x4   its TTFT, per-token time and prefill 4x slower
  --fault 60s:recover:mock-1   its knobs back to the run's (after drain or slow)

T counts from the start of the first stage, its warm-up included (`30s`, `1.5s`, `500ms`).
`mock-N` is the N-th spawned mock (1-based; the router's endpoint `mock<N-1>`). Any other
target, or any target at all when the load tester spawned nothing, goes to `--fault-hook
CMD`: a shell command run at the fault's time with NOMYO_FAULT_ACTION, NOMYO_FAULT_TARGET,
NOMYO_FAULT_FACTOR (1 unless xF) and NOMYO_FAULT_AT_S in its environment — e.g. a script
that runs `systemctl kill ollama@$NOMYO_FAULT_TARGET`. A hook that fails or takes longer than
60 s is reported with the fault; the run goes on. Before each fault and at the end, the
router's /metrics counters of retries and resumed streams are read (fault_report.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from mock import MockConfig, MockProcess

ACTIONS = ("kill", "restart", "drain", "slow", "recover")
HOOK_TIMEOUT_S = 60.0
_TIME = re.compile(r"^(\d+(?:\.\d+)?)(ms|s)?$")
_MOCK = re.compile(r"^mock-(\d+)$")


@dataclass
class Fault:
    at_s: float
    action: str
    target: str
    factor: float = 1.0
    text: str = ""

    @property
    def label(self) -> str:
        return f"{self.action} {self.target}" + (f" x{self.factor:g}" if self.action == "slow" else "")


def parse(text: str) -> Fault:
    """`30s:kill:mock-1`, `20s:slow:mock-1:x4` (an argparse type: errors exit 2)."""
    parts = text.strip().split(":")
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(f"{text!r}: expected TIME:ACTION:TARGET[:xFACTOR], e.g. 30s:kill:mock-1")
    when, action, target = parts[0].strip(), parts[1].strip(), parts[2].strip()
    m = _TIME.match(when)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: the time {when!r} is not like 30s, 1.5s or 500ms")
    at = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    if action not in ACTIONS:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown action {action!r}; known: {', '.join(ACTIONS)}")
    if not target:
        raise argparse.ArgumentTypeError(f"{text!r}: no target")
    factor = 1.0
    if len(parts) == 4:
        f = parts[3].strip().lstrip("x")
        try:
            factor = float(f)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: the factor {parts[3]!r} is not like x4") from None
        if action != "slow" or factor <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: only slow takes a factor, and it must be > 0")
    elif action == "slow":
        raise argparse.ArgumentTypeError(f"{text!r}: slow needs a factor, e.g. {text}:x4")
    return Fault(at, action, target, factor, text.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("faults during the run (see loadtest/faults.py)")
    g.add_argument(
        "--fault",
        type=parse,
        action="append",
        default=[],
        metavar="T:ACTION:TARGET[:xF]",
        help="at T (from the first stage's start) kill, restart, drain, slow (x4) or recover a "
        "spawned mock (mock-1 ...), or call --fault-hook; repeatable (default: none)",
    )
    g.add_argument(
        "--fault-hook",
        default=None,
        metavar="CMD",
        help="shell command run for faults on targets the load tester did not spawn, with "
        "NOMYO_FAULT_ACTION/TARGET/FACTOR/AT_S in its environment (default: none)",
    )


def problem(args: argparse.Namespace) -> str | None:
    """Why the --fault options cannot run as given, or None."""
    if not args.fault:
        return "--fault-hook without --fault does nothing" if args.fault_hook else None
    if args.repeat > 1 or args.direct or args.find_max_rate:
        return "--fault runs once through the stages: leave out --repeat, --direct and --find-max-rate"
    for f in args.fault:
        m = _MOCK.match(f.target)
        spawned = args.mock_backend and m is not None
        if spawned and not 1 <= int(m.group(1)) <= args.mock_count:  # type: ignore[union-attr]
            return f"--fault {f.text}: there are mock-1 .. mock-{args.mock_count} (--mock-count)"
        if not spawned and not args.fault_hook:
            return f"--fault {f.text}: {f.target} is not a spawned mock; give --fault-hook CMD to act on it"
    return None


@dataclass
class Injector:
    """Runs the faults at their times; `done` records what happened, with perf_counter times."""

    faults: list[Fault]
    mocks: list[MockProcess]  # the fleet's list: a restart replaces its item
    mock_config: MockConfig | None
    hook: str | None
    router_url: str | None
    done: list[dict[str, Any]] = field(default_factory=list)
    t0: float = 0.0
    _stop: asyncio.Event | None = None

    async def run(self) -> None:
        """Until the schedule is done or `stop()`; an action under way is finished first, so a
        mock being restarted is in the fleet (and stopped with it) when the run ends."""
        self.t0 = time.perf_counter()
        self._stop = asyncio.Event()
        for f in sorted(self.faults, key=lambda f: f.at_s):
            delay = self.t0 + f.at_s - time.perf_counter()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except TimeoutError:
                    pass
            if self._stop.is_set():
                return
            events = await asyncio.to_thread(self.router_events)
            at = time.perf_counter()
            try:
                detail = await asyncio.to_thread(self._act, f)
                ok = True
            except Exception as e:  # a fault that could not be done is reported, the run goes on
                detail, ok = f"{type(e).__name__}: {e}", False
            took = time.perf_counter() - at
            self.done.append(
                {"fault": f, "at": at, "took_s": round(took, 3), "ok": ok, "detail": detail, "events": events}
            )

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def missed(self) -> list[str]:
        """The faults the run ended before."""
        done = {id(d["fault"]) for d in self.done}
        return [f.text for f in self.faults if id(f) not in done]

    def _act(self, f: Fault) -> str:
        m = _MOCK.match(f.target)
        if m is not None and self.mock_config is not None and 1 <= int(m.group(1)) <= len(self.mocks):
            return self._mock(f, int(m.group(1)) - 1)
        env = os.environ | {
            "NOMYO_FAULT_ACTION": f.action,
            "NOMYO_FAULT_TARGET": f.target,
            "NOMYO_FAULT_FACTOR": f"{f.factor:g}",
            "NOMYO_FAULT_AT_S": f"{f.at_s:g}",
        }
        p = subprocess.run(  # noqa: S602 - the user's own command line
            self.hook or "false", shell=True, env=env, capture_output=True, text=True, timeout=HOOK_TIMEOUT_S
        )
        said = (p.stdout + p.stderr).strip().splitlines()[-1:] or [""]
        if p.returncode:
            raise RuntimeError(f"hook exited {p.returncode}: {said[0][:200]}")
        return f"hook: {said[0][:200]}" if said[0] else "hook: done"

    def _mock(self, f: Fault, i: int) -> str:
        mock, base = self.mocks[i], self.mock_config
        assert base is not None
        if f.action == "kill":
            mock.kill()
            return f"killed pid {mock.proc.pid if mock.proc else '?'}"
        if f.action == "restart":
            mock.kill()
            self.mocks[i] = MockProcess(base, port=mock.port, host=mock.host).start()
            return f"restarted on port {mock.port}"
        if f.action == "drain":
            changes: dict[str, Any] = {"busy_rate": 1.0}
        elif f.action == "slow":
            changes = {k: getattr(base, k) * f.factor for k in ("ttft_ms", "tok_ms", "prefill_ms_per_1k_tokens")}
        else:  # recover
            changes = {k: getattr(base, k) for k in ("busy_rate", "ttft_ms", "tok_ms", "prefill_ms_per_1k_tokens")}
        req = urllib.request.Request(
            mock.url + "/mock/config", json.dumps(changes).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()
        return ", ".join(f"{k}={v:g}" for k, v in changes.items())

    def router_events(self) -> dict[str, float] | None:
        """The router's retry and resumed-stream counters (summed over endpoints), or None."""
        if not self.router_url:
            return None
        try:
            with urllib.request.urlopen(self.router_url + "/metrics", timeout=3) as r:
                text = r.read().decode(errors="replace")
        except OSError:
            return None
        if "nomyo_router_" not in text:  # another server's metrics: nothing to say about retries
            return None
        out = {"retry": 0.0, "resumed": 0.0}
        for line in text.splitlines():
            if line.startswith("nomyo_router_events_total{"):
                what = re.search(r'what="([^"]*)"', line)
                if what and what.group(1) in out:
                    out[what.group(1)] += float(line.rsplit(" ", 1)[1])
        return out
