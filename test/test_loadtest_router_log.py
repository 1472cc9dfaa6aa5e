"""The load tester keeps the router's stderr in a file, not in a pipe nobody reads: a router
that writes more than a pipe holds (64 KiB) during a run would block on its next line, and the
run with it. What it said is shown when it fails to start."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from loadtest.orchestrate import Fleet
from mock import MockConfig

FAST = MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=4)


def test_a_router_that_cannot_start_says_why():
    fleet = Fleet(FAST, router_extra={"max_queue": -1})  # refused by the config's bounds
    with pytest.raises(RuntimeError) as e:
        fleet.start()
    assert "the router's stderr" in str(e.value) and "max_queue" in str(e.value)
    assert fleet.router_log is None  # closed by stop()


def test_a_router_writing_more_than_a_pipe_holds_keeps_serving():
    """An access line per request (~300 B): 600 requests write ~180 KiB to its stderr."""
    body = json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    with Fleet(FAST, router_extra={"access_log": True}) as fleet:
        assert fleet.router is not None and fleet.router.stderr is None and fleet.router_log is not None
        for _ in range(600):
            req = urllib.request.Request(
                fleet.router_url + "/api/chat", body.encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                assert r.status == 200
        assert os.fstat(fleet.router_log.fileno()).st_size > 128 * 1024
