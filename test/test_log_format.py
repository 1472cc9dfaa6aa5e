"""`log_format: json` makes every line the router writes one JSON object: the supervisor's and
the workers', uvicorn's loggers and the router's, access lines at INFO with their fields.

A real `nomyo-router --workers 2` against the mock, its stdout and stderr kept whole: served,
refused and unknown-model requests, a reload (SIGHUP), a stop; then every line is parsed."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile

import aiohttp

from loadtest.router_process import write_config
from mock import free_port, run_mock
from mock.runner import stop_group
from nomyo_router.ops import logformat
from test.conftest import FAST
from test.router_proc import ready

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


async def _until(path: str, text: str, count: int, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        with open(path, encoding="utf-8") as f:
            if f.read().count(text) >= count:
                return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"fewer than {count} {text!r} in the router's stderr")
        await asyncio.sleep(0.1)


async def test_every_line_of_a_two_worker_run_is_one_json_object(tmp_path):
    out_path, err_path = str(tmp_path / "stdout"), str(tmp_path / "stderr")
    async with run_mock(**FAST) as m:
        config = {
            "endpoints": [{"url": m.url, "name": "m0", "max_concurrent": 2}],
            "access_log": True,
            "log_format": "json",
            "usage_db": os.path.join(tempfile.gettempdir(), f"nomyo-usage-logs-{os.getpid()}.db"),
        }
        path, port = write_config(config), free_port()
        argv = [sys.executable, "-P", "-m", "nomyo_router", "--config", path, "--port", str(port), "--workers", "2"]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            await ready(url)
            await _until(err_path, "Application startup complete", 2)  # (a SIGHUP before would end a worker)
            async with aiohttp.ClientSession() as s:
                async with s.post(url + "/api/chat", json=CHAT) as r:
                    assert r.status == 200
                async with s.post(url + "/api/chat", json={**CHAT, "model": "no-such-model"}) as r:
                    assert r.status == 404
                async with s.post(url + "/api/chat", data=b"{not json") as r:
                    assert r.status == 400
                proc.send_signal(signal.SIGHUP)
                await _until(err_path, "config reloaded", 2)  # both workers
                async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                    assert r.status == 200
        finally:
            stop_group(proc, 15.0)
            os.unlink(path)
    lines = []
    for name in (out_path, err_path):
        with open(name, encoding="utf-8") as f:
            lines += f.read().splitlines()
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not one JSON object: {line!r}") from None
    assert all(isinstance(r, dict) and {"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert all(r["time"].endswith("Z") and r["time"][10] == "T" for r in records)
    loggers = {r["logger"] for r in records}
    assert {"uvicorn.error", "nomyo_router.reload", "nomyo_router.access"} <= loggers, loggers
    pids = {r["message"] for r in records if r["message"].startswith("Started server process")}
    assert len(pids) == 2  # both workers' uvicorn lines
    access = [r for r in records if r["logger"] == "nomyo_router.access"]
    assert all(r["level"] == "INFO" for r in access)
    by_status = {(r["route"], r["status"]): r for r in access}
    served = by_status[("/api/chat", 200)]
    assert served["model"] == "llama3" and served["endpoint"] == "m0" and served["tokens_out"] == FAST["tokens"]
    assert served["message"] == "/api/chat 200"
    assert by_status[("/api/chat", 404)]["model"] == "no-such-model"
    assert ("/v1/chat/completions", 200) in by_status  # after the reload too


def test_a_reload_switches_the_format_of_the_routers_handler_only():
    """`logformat.use` (a reload that changed `log_format`) swaps the formatter of the handler
    `logformat.config` installed, leaves anyone else's alone, and a traceback stays on the
    JSON line."""
    ours, theirs = logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())
    ours.setFormatter(logformat.TextFormatter())
    theirs.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(ours)
    root.addHandler(theirs)
    try:
        logformat.use("json")
        try:
            raise ValueError("bad\nthing")
        except ValueError:
            logging.getLogger("nomyo_router.test").error("it failed:\n%s", "twice", exc_info=True)
    finally:
        root.removeHandler(ours)
        root.removeHandler(theirs)
    (line,) = ours.stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["logger"] == "nomyo_router.test"
    assert record["message"] == "it failed:\ntwice"
    assert record["exception"].startswith("Traceback") and "ValueError: bad\nthing" in record["exception"]
    assert theirs.stream.getvalue().startswith("it failed:\ntwice\nTraceback")  # theirs untouched
