"""Idle memory of the router's processes, measured as bench/peers.py does.

    python bench/idle_rss.py [--workers 1,2] [--launcher cli,uvicorn,bare] [--reps 3]

A zero-delay mock, then the router in front of it (`nomyo-router --config …` or
`uvicorn nomyo_router.app:app --workers N`), one chat request through it (so the worker has
discovered the model and opened its upstream connection), 1 s of quiet, then RSS (VmRSS),
PSS and USS (private) of every process: the master, the multiprocessing resource tracker
and each worker. Medians over --reps starts. A benchmark, not a test.

`bare` measures bench/bare_proxy.py the same way (one process, whatever --workers says):
uvloop, httptools and msgspec relaying the request with nothing of the router, the floor
under the router's idle memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import _children, free_port, mock_process, wait_http  # noqa: E402
from loadtest.router_process import router_argv  # noqa: E402
from spawn import _served  # noqa: E402


def memory(pid: int) -> dict[str, float]:
    """VmRSS, Pss and private (USS) of one process, in MB."""
    out = {"rss": 0.0, "pss": 0.0, "uss": 0.0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss"] = int(line.split()[1]) / 1024
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "Pss":
                    out["pss"] = int(rest.split()[0]) / 1024
                elif key in ("Private_Clean", "Private_Dirty"):
                    out["uss"] += int(rest.split()[0]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def role(pid: int, root: int) -> str:
    cmd = cmdline(pid)
    if pid == root:
        return "master" if "--workers" in cmd and " 1 " not in f"{cmd} " else "worker"
    if "resource_tracker" in cmd:
        return "tracker"
    return "worker"


def one_start(mock_url: str, launcher: str, workers: int) -> dict[str, list[dict[str, float]]]:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(
            {"endpoints": [{"url": mock_url, "name": "mock", "max_concurrent": 4096}], "max_queue": 100_000}, f
        )
    port = free_port()
    env = dict(os.environ, NOMYO_ROUTER_CONFIG=path)
    if launcher == "cli":
        cmd = router_argv(path, port, workers)
    elif launcher == "bare":
        bare = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bare_proxy.py")
        cmd = [sys.executable, "-P", bare, str(port)]
        env["UPSTREAM"] = mock_url
    else:
        cmd = [
            sys.executable,
            "-m",
            "uvicorn",
            "nomyo_router.app:app",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        if launcher != "bare":  # the bare proxy has no /health; the first answered chat says it is up
            wait_http(url + "/health", 30, proc)
        for _ in range(workers * 4):  # reach every worker with luck; each discovers on start anyway
            _served(url + "/v1/chat/completions", proc, 30.0)
        time.sleep(1.0)
        by_role: dict[str, list[dict[str, float]]] = {}
        for pid in [proc.pid] + _children(proc.pid):
            by_role.setdefault(role(pid, proc.pid) if workers > 1 else "worker", []).append(memory(pid))
        return by_role
    finally:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.unlink(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2")
    p.add_argument("--launcher", default="cli,uvicorn")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    with mock_process() as mock:
        for launcher in args.launcher.split(","):
            counts = [1] if launcher == "bare" else [int(w) for w in args.workers.split(",")]
            for workers in counts:
                runs = [one_start(mock.url, launcher, workers) for _ in range(args.reps)]
                total = statistics.median(sum(m["rss"] for ms in r.values() for m in ms) for r in runs)
                parts = []
                for name in ("master", "tracker", "worker"):
                    per = [m for r in runs for m in r.get(name, [])]
                    if per:
                        parts.append(
                            f"{name} RSS {statistics.median(m['rss'] for m in per):.1f} "
                            f"PSS {statistics.median(m['pss'] for m in per):.1f} "
                            f"USS {statistics.median(m['uss'] for m in per):.1f}"
                        )
                print(f"{launcher:8s} --workers {workers}: total RSS {total:.1f} MB; " + "; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
