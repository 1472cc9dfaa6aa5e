"""An unusable usage_db or response-cache file stops `--check` and every start-up within
seconds, with one line naming the key, the path as configured and the operating system's or
SQLite's reason, and exit status 2 at any worker count; a usable one passes and --check
creates nothing. A failure only a worker finds stops the router with a non-zero status too.
Real `python -m nomyo_router` runs."""

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


def run(
    tmp_path: Path, usage_db: str | None, *args: str, cache: str | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    cfg = tmp_path / "c.yaml"
    config: dict[str, object] = {"endpoints": ["http://127.0.0.1:9"], "usage_db": usage_db}
    if cache is not None:
        config["cache"] = {"enabled": True, "backend": "sqlite", "path": cache}
    cfg.write_text(yaml.safe_dump(config))
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


def with_port(args: tuple[str, ...]) -> tuple[str, ...]:
    return args if args == ("--check",) else (*args, "--port", str(free_port()))


@pytest.mark.parametrize("args", MODES, ids=IDS)
def test_a_garbage_cache_file_stops_start_up_in_one_line(tmp_path, args):
    (tmp_path / "answers.db").write_bytes(b"\x00garbage, not SQLite\xff" * 20)
    r, took = run(tmp_path, None, *with_port(args), cache="answers.db")
    assert r.returncode == 2 and took < 10, (r.returncode, took, r.stderr[-500:])
    assert r.stderr.splitlines() == ["nomyo-router: cache.path: cannot open answers.db: file is not a database"]
    assert (tmp_path / "answers.db").read_bytes().startswith(b"\x00garbage")  # never moved aside or replaced


@pytest.mark.parametrize("args", MODES[1:], ids=IDS[1:])
def test_a_read_only_cache_file_stops_start_up_in_one_line(tmp_path, args):
    with read_only_dir(tmp_path, with_db=True) as d:
        path = str(d / "u.db")
        r, took = run(tmp_path, None, *with_port(args), cache=path)
    assert r.returncode == 2 and took < 10, (r.returncode, took, r.stderr[-500:])
    reason = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
    assert r.stderr.splitlines() == [f"nomyo-router: cache.path: cannot open {path}: {reason}"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_worker_that_fails_to_start_stops_the_router_with_a_non_zero_status(tmp_path, workers):
    """A file only a worker opens (a `file:` name is not checked before: SQLite reads it as a
    file in a directory `file:` that does not exist): one line naming it, and an exit status
    systemd's `Restart=on-failure` acts on, with one worker and with a supervisor of two."""
    path = "file:nowhere/u.db"
    r, took = run(tmp_path, path, *with_port(("--workers", workers)))
    assert r.returncode == 3 and took < 20, (r.returncode, took, r.stderr[-800:])
    assert f"usage_db: cannot open {path}: unable to open database file" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_an_unusable_state_path_stops_start_up_in_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"endpoints": ["http://127.0.0.1:9"], "usage_db": None}))
    for env, line in (
        (
            {"NOMYO_ROUTER_STATE_PATH": "/nonexistent/st"},
            "NOMYO_ROUTER_STATE_PATH: cannot open /nonexistent/st: No such file or directory "
            "(the directory does not exist)",
        ),
        (
            {"XDG_RUNTIME_DIR": "/nonexistent/run"},
            "shared-state directory: cannot open /nonexistent/run/nomyo-router: No such file or directory "
            "(the directory does not exist)",
        ),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "nomyo_router", "--config", str(cfg), "--workers", "2", "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, **env},
        )
        assert r.returncode == 2 and r.stderr.splitlines() == [f"nomyo-router: {line}"], r.stderr
