"""The workers' shared state is private to the router's user: another local
user can neither reach it nor replace it. Root drops to uid 65534 in a subprocess."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import yaml

from test.router_proc import router_workers

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


def as_nobody(code: str) -> subprocess.CompletedProcess:
    # a Python the other user can run (the venv may live in root's private home)
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    return subprocess.run(
        [python, "-c", code], preexec_fn=lambda: os.setuid(NOBODY), cwd="/", capture_output=True, text=True, timeout=20
    )


@needs_root
def test_socket_and_lock_are_private_to_the_routers_user(mock_process_url, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.chmod(tmp_path, 0o755)  # the parent is reachable: only the router's own dir protects it
    with router_workers({"endpoints": [{"url": mock_process_url, "name": "m"}]}, 2):
        d = tmp_path / "nomyo-router"
        assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.stat().st_uid == os.geteuid()
        socks = list(d.glob("*.sock"))
        assert socks and stat.S_IMODE(socks[0].stat().st_mode) == 0o600
        r = as_nobody(f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(socks[0])!r})")
        assert r.returncode != 0 and "PermissionError" in r.stderr
        r = as_nobody(f"open({str(d / 'evil.lock')!r}, 'w')")
        assert r.returncode != 0 and "PermissionError" in r.stderr
        for kind in ("slots", "pins"):  # the shared-memory tables: nobody else may map them
            table = list(d.glob(f"*.{kind}"))
            assert table and stat.S_IMODE(table[0].stat().st_mode) == 0o600
            r = as_nobody(f"open({str(table[0])!r}, 'r+b')")
            assert r.returncode != 0 and "PermissionError" in r.stderr


@needs_root
@pytest.mark.parametrize("kind", ["symlink", "foreign", "world-writable"])
def test_a_planted_state_directory_stops_start_up(tmp_path, kind):
    d = tmp_path / "nomyo-router"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir()
        d.symlink_to(tmp_path / "elsewhere")
    else:
        d.mkdir()
        if kind == "foreign":
            os.chown(d, NOBODY, NOBODY)
        else:
            os.chmod(d, 0o777)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"endpoints": ["http://127.0.0.1:9"]}))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "nomyo_router", "--config", str(cfg), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert r.returncode == 2
    assert {"symlink": "symlink", "foreign": "belongs to uid", "world-writable": "writable by group"}[kind] in r.stderr


@pytest.fixture
def mock_process_url():
    from mock import MockConfig, MockProcess

    with MockProcess(MockConfig(ttft_ms=0, tok_ms=0, tokens=4)) as m:
        yield m.url
