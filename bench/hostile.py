"""A hostile backend against one router worker: is what it costs bounded?

    python bench/hostile.py [--size-mb 200] [--seconds 6] [--concurrency 4] [--relays native,python]

Per relay (`native_relay: true`, the compiled pump, and `false`, the Python relay), one
router worker with the default limits (`max_record_bytes` 8 MiB, `max_response_bytes` 64 MiB)
in front of a healthy mock (model llama3) and two hostile backends (test/hostile_backend.py):
an Ollama one (model evil) and an OpenAI one (model evil-openai). `--concurrency` clients run
steady non-stream Ollama chats against the mock (closed loop), first for `--seconds` alone
(quiet), then while curl, one request after the other:

    record     streams evil: one record of --size-mb without a newline (cut at max_record_bytes)
    whole      evil, not streamed: a --size-mb answer (passed through: relayed as it comes)
    translated evil-openai through the Ollama API, not streamed: a --size-mb answer the router
               must translate (refused beyond max_response_bytes: 502 response_too_large)

and then on for at least `--seconds`. Printed per relay: what each hostile request got (status,
bytes, seconds, the stream's last line, the router's peak RSS growth while it ran: VmHWM,
reset before it through /proc/PID/clear_refs), the router's RSS before, at its peak and after
the hostile phase, and the steady clients' requests, p50/p99/max latency quiet and hostile.
Goal: peak RSS growth under 150 MB, the steady clients' p99 within 2x of quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import aiohttp

from common import router_process, wait_tcp
from mock import MockConfig, MockProcess, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEADY = MockConfig(ttft_ms=2.0, tok_ms=0.2, tokens=16, parallel=1024)
CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hello"}]}


def status_kb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of one process, in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def reset_peak(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        return True
    except OSError:
        return False


def hostile(api: str, model: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "test.hostile_backend",
            "--port",
            str(port),
            "--api",
            api,
            "--model",
            model,
            "--stream",
            "long",
            "--whole",
            "big",
            "--size",
            str(ARGS.size_mb * 1024 * 1024),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    wait_tcp(port)
    return proc, f"http://127.0.0.1:{port}"


def curl(url: str, body: dict) -> dict:
    """One hostile request in its own process (its 200 MiB never touch the steady clients' loop)."""
    with tempfile.NamedTemporaryFile(suffix=".out", delete=False) as f:
        path = f.name
    t0 = time.monotonic()
    out = subprocess.run(
        [
            "curl",
            "-s",
            "-N",
            "-o",
            path,
            "-w",
            "%{http_code} %{size_download}",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps(body),
            url,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.split()
    took = time.monotonic() - t0
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 300))
        tail = f.read().strip().splitlines()[-1:] or [b""]
    os.unlink(path)
    return {"status": int(out[0]), "bytes": int(out[1]), "s": round(took, 2), "last": tail[0][-160:].decode("latin-1")}


class Steady:
    def __init__(self, url: str, conc: int) -> None:
        self.url, self.conc = url, conc
        self.lat: list[float] = []
        self.errors = 0
        self.stop = False

    async def run(self) -> None:
        async with aiohttp.ClientSession() as s:

            async def one() -> None:
                while not self.stop:
                    t0 = time.perf_counter()
                    try:
                        async with s.post(self.url + "/api/chat", json=CHAT) as r:
                            await r.read()
                            ok = r.status == 200
                    except aiohttp.ClientError:
                        ok = False
                    self.lat.append(time.perf_counter() - t0)
                    self.errors += not ok

            await asyncio.gather(*(one() for _ in range(self.conc)))

    def summary(self) -> dict:
        lat = sorted(self.lat)
        pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2)) if lat else (lambda q: None)
        return {
            "requests": len(lat),
            "errors": self.errors,
            "p50_ms": pick(0.5),
            "p99_ms": pick(0.99),
            "max_ms": round(lat[-1] * 1000, 1) if lat else None,
        }


async def phase(url: str, seconds: float, hostile_work=None, pid: int = 0) -> tuple[dict, list]:
    """The steady clients for `seconds` (at least), and the hostile requests meanwhile, each
    with the router's peak RSS growth while it ran (`peak_mb`, when VmHWM can be reset)."""
    st = Steady(url, ARGS.concurrency)
    task = asyncio.create_task(st.run())
    t0 = time.monotonic()
    results = []
    for name, req_url, body in hostile_work or ():
        rss = status_kb(pid)["VmRSS"]
        reset = reset_peak(pid)
        got = await asyncio.to_thread(curl, req_url, body)
        if reset:
            got["peak_mb"] = round(status_kb(pid)["VmHWM"] - rss, 1)
        results.append((name, got))
    await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    st.stop = True
    await task
    return st.summary(), results


def run(relay: str) -> dict:
    with MockProcess(STEADY) as good:
        bad, bad_url = hostile("ollama", "evil")
        worse, worse_url = hostile("openai", "evil-openai")
        try:
            eps = [
                {"url": good.url, "name": "good", "max_concurrent": 64},
                {"url": bad_url, "name": "evil", "type": "ollama", "models": ["evil"], "max_concurrent": 4},
                {
                    "url": worse_url,
                    "name": "evil-openai",
                    "type": "openai",
                    "models": ["evil-openai"],
                    "max_concurrent": 4,
                },
            ]
            with router_process(eps, native_relay=relay == "native", usage_db=None) as (url, proc):
                msgs = [{"role": "user", "content": "hi"}]
                work = [
                    ("record", url + "/api/chat", {"model": "evil", "stream": True, "messages": msgs}),
                    ("whole", url + "/api/chat", {"model": "evil", "stream": False, "messages": msgs}),
                    ("translated", url + "/api/chat", {"model": "evil-openai", "stream": False, "messages": msgs}),
                ]
                asyncio.run(phase(url, 1.0))  # warm-up
                quiet, _ = asyncio.run(phase(url, ARGS.seconds))
                before = status_kb(proc.pid)
                loud, results = asyncio.run(phase(url, ARGS.seconds, work, proc.pid))
                after = status_kb(proc.pid)
        finally:
            for p in (bad, worse):
                p.terminate()
                p.wait(10)
    reset = all("peak_mb" in r for _, r in results)
    peak = before["VmRSS"] + max(r.get("peak_mb", 0.0) for _, r in results) if reset else after["VmHWM"]
    return {
        "relay": relay,
        "hostile": dict(results),
        "rss_before_mb": round(before["VmRSS"], 1),
        "rss_peak_mb": round(peak, 1),
        "rss_after_mb": round(after["VmRSS"], 1),
        "peak_growth_mb": round(peak - before["VmRSS"], 1),
        "peak_reset": reset,
        "steady_quiet": quiet,
        "steady_hostile": loud,
        "p99_ratio": round(loud["p99_ms"] / quiet["p99_ms"], 2) if quiet["p99_ms"] else None,
    }


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--relays", default="native,python")
    ARGS = ap.parse_args()
    for relay in ARGS.relays.split(","):
        print(json.dumps(run(relay), indent=1), flush=True)


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
