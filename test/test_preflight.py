"""An unusable usage_db stops `--check` and every start-up within seconds, with the path as
configured and the operating system's reason; a usable one passes and --check creates
nothing. Real `python -m nomyo_router` runs."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from mock import free_port


def run(tmp_path: Path, usage_db: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"endpoints": ["http://127.0.0.1:9"], "usage_db": usage_db}))
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "nomyo_router", "--config", str(cfg), "--log-level", "warning", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)},
    )
    return r, time.monotonic() - t0


@contextlib.contextmanager
def read_only_dir(tmp_path: Path, with_db: bool) -> Iterator[Path]:
    """A directory nobody may write: a read-only tmpfs when root (root ignores mode bits), else
    mode 0555."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0:
        if with_db:
            sqlite3.connect(d / "u.db").execute("CREATE TABLE t (x)").connection.close()
        d.chmod(0o555)
        try:
            yield d
        finally:
            d.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs to make a read-only directory")
    try:
        if with_db:
            sqlite3.connect(d / "u.db").execute("CREATE TABLE t (x)").connection.close()
        subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


def planted(path: Path, text: str, usage_db: str) -> str:
    path.write_text(text)
    return usage_db


MODES = [("--check",), ("--workers", "1"), ("--workers", "2")]
IDS = ["check", "one-worker", "two-workers"]


@pytest.mark.parametrize("args", MODES, ids=IDS)
@pytest.mark.parametrize(
    "make, reason",
    [
        pytest.param(
            lambda t: "/nonexistent/dir/u.db",
            "No such file or directory (the directory does not exist)",
            id="missing-dir",
        ),
        pytest.param(
            lambda t: str(t),
            "Is a directory (usage_db names the database file, e.g. DIR/nomyo-usage.db)",
            id="a-directory",
        ),
        pytest.param(
            lambda t: planted(t / "f", "", str(t / "f" / "u.db")),
            "Not a directory (a part of the path is not a directory)",
            id="file-on-the-way",
        ),
        pytest.param(
            lambda t: planted(t / "x.db", "x" * 200, "x.db"),
            "file is not a database",  # (relative)
            id="not-a-database",
        ),
    ],
)
def test_an_unusable_usage_db_stops_check_and_start_up(tmp_path, args, make: Callable[[Path], str], reason):
    path = make(tmp_path)
    extra = () if args == ("--check",) else ("--port", str(free_port()))
    r, took = run(tmp_path, path, *args, *extra)
    assert r.returncode == 2 and took < 10, (r.returncode, took, r.stderr[-500:])
    assert f"nomyo-router: usage_db: cannot open {path}: {reason}\n" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args", MODES, ids=IDS)
@pytest.mark.parametrize("with_db", [False, True], ids=["new-db", "existing-db"])
def test_a_read_only_directory_stops_check_and_start_up(tmp_path, args, with_db):
    with read_only_dir(tmp_path, with_db) as d:
        path = str(d / "u.db")
        extra = () if args == ("--check",) else ("--port", str(free_port()))
        r, took = run(tmp_path, path, *args, *extra)
    assert r.returncode == 2 and took < 10, (r.returncode, took, r.stderr[-500:])
    reason = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
    assert f"nomyo-router: usage_db: cannot open {path}: {reason}" in r.stderr, r.stderr


def test_check_of_a_usable_path_passes_and_creates_nothing(tmp_path):
    r, _ = run(tmp_path, "./sub/u.db", "--check")
    assert r.returncode == 2 and "sub/u.db: No such file or directory" in r.stderr  # (the dir is missing)
    (tmp_path / "sub").mkdir()
    r, _ = run(tmp_path, "./sub/u.db", "--check")
    assert r.returncode == 0 and r.stdout.endswith("ok, 1 endpoint(s)\n"), r.stderr
    assert os.listdir(tmp_path / "sub") == []  # no database, no probe file: the router creates it at start
    db = sqlite3.connect(tmp_path / "sub" / "u.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE usage (x)")
    db.close()
    r, _ = run(tmp_path, "./sub/u.db", "--check")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "sub")) == ["u.db"]


def test_no_usage_db_and_redis_state_are_not_checked(tmp_path):
    cfg = tmp_path / "c.yaml"
    for extra in ({"usage_db": None}, {"usage_db": "/nonexistent/u.db", "state": "redis://127.0.0.1:9/0"}):
        cfg.write_text(yaml.safe_dump({"endpoints": ["http://127.0.0.1:9"], **extra}))
        r = subprocess.run(
            [sys.executable, "-m", "nomyo_router", "--config", str(cfg), "--check"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
