"""Who limited a stage: the load generator itself, or the machine it shares?

Over each stage we read /proc/stat (all cores: busy, idle, iowait, steal jiffies) and
/proc/loadavg, beside this process's own CPU time. Then:
  client CPU   this process's CPU time / wall time, in cores (asyncio uses one core)
  others       (all busy CPU - the client's) / wall time, in cores: the router, a backend
               on the same machine, other jobs
  steal        the share of CPU time the hypervisor gave to other guests
  load         1-minute load average per core at the stage's end
Verdict:
  CLIENT-BOUND  its own CPU >= 0.85 of a core, or it was late (loop lag p99 > 20 ms, or
                open-loop send lag p99 > 10 ms) while the machine had idle CPU: the client
                itself is the limit — its numbers measure the client;
  MACHINE-BUSY  otherwise, whenever the machine was saturated (>= 90% of all cores busy,
                or steal >= 10%, or load average > 1.5 per core), late or not: every
                process on it, the server's too when it shares the box, waited for CPU,
                so latencies include that contention and more load could not have been
                sent. A saturated machine is flagged even when the client kept its
                timing: the numbers then measure the machine as much as the server.
Without /proc (not Linux) only the client's own signals are used.
"""

from __future__ import annotations

import os
from typing import Any

CPU_BOTTLENECK = 0.85  # share of one core
LAG_BOTTLENECK_MS = 20.0
SEND_LAG_BOTTLENECK_MS = 10.0
MACHINE_BUSY = 0.90  # share of all cores
STEAL_BUSY = 0.10
LOAD_PER_CORE_BUSY = 1.5


def snapshot() -> dict[str, float] | None:
    """Cumulative jiffies of all cores (total, idle incl. iowait, steal) and the load average."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
        with open("/proc/loadavg") as f:
            load1 = float(f.readline().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    total = sum(fields[:8])
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    steal = fields[7] if len(fields) > 7 else 0.0
    return {"total": total, "idle": idle, "steal": steal, "load1": load1}


def delta(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    if a is None or b is None or b["total"] <= a["total"]:
        return None
    return {
        "total": b["total"] - a["total"],
        "idle": b["idle"] - a["idle"],
        "steal": b["steal"] - a["steal"],
        "load1": b["load1"],
    }


def combine(parts: list[dict[str, float] | None]) -> dict[str, float] | None:
    """Several stage runs (repetitions) as one."""
    got = [p for p in parts if p]
    if not got:
        return None
    return {
        "total": sum(p["total"] for p in got),
        "idle": sum(p["idle"] for p in got),
        "steal": sum(p["steal"] for p in got),
        "load1": max(p["load1"] for p in got),
    }


def assess(
    cpu_s: float, wall_s: float, lag_ms: float, send_lag_ms: float, open_loop: bool, machine: dict[str, float] | None
) -> dict[str, Any]:
    """The `client` block of a stage's metrics."""
    ncpu = os.cpu_count() or 1
    client = cpu_s / wall_s if wall_s else 0.0
    out: dict[str, Any] = {
        "cpu_share": round(client, 3),
        "loop_lag_p99_ms": round(lag_ms, 3),
        "send_lag_p99_ms": round(send_lag_ms, 3),
        "cpu_count": ncpu,
    }
    busy = steal = others = load = None
    if machine:
        busy = 1 - machine["idle"] / machine["total"]
        steal = machine["steal"] / machine["total"]
        others = max(busy * ncpu - client, 0.0)  # cores' worth of CPU used by everything else
        load = machine["load1"] / ncpu
        out.update(
            {
                "machine_busy_share": round(busy, 3),
                "others_cores": round(others, 3),
                "steal_share": round(steal, 4),
                "load_per_core": round(load, 3),
            }
        )
    late = lag_ms > LAG_BOTTLENECK_MS or (open_loop and send_lag_ms > SEND_LAG_BOTTLENECK_MS)
    own_cpu = client >= CPU_BOTTLENECK
    machine_busy = busy is not None and (
        busy >= MACHINE_BUSY
        or steal >= STEAL_BUSY  # type: ignore[operator]
        or load > LOAD_PER_CORE_BUSY
    )  # type: ignore[operator]
    verdict = reason = None
    if own_cpu:
        verdict, reason = "client", f"the client used {client:.0%} of a core"
    elif machine_busy:
        verdict = "machine"
        state = (
            f"the machine was saturated ({busy:.0%} of {ncpu} cores busy, {others:.2f} cores used by "
            f"other processes, steal {steal:.0%}, load {load:.2f}/core)"
        )
        reason = (
            f"the client was late (loop lag p99 {lag_ms:.0f} ms, send lag p99 {send_lag_ms:.0f} ms) "
            f"at {client:.0%} of a core while {state}"
            if late
            else f"{state}; the client used {client:.0%} of a core"
        )
    elif late:
        verdict = "client"
        reason = (
            f"the client was late (loop lag p99 {lag_ms:.0f} ms, send lag p99 {send_lag_ms:.0f} ms) "
            "with idle CPU on the machine"
            if busy is not None
            else f"the client was late (loop lag p99 {lag_ms:.0f} ms, send lag p99 {send_lag_ms:.0f} ms)"
        )
    out.update(
        {"bottleneck": verdict == "client", "machine_bound": verdict == "machine", "verdict": verdict, "reason": reason}
    )
    return out
