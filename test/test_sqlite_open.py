"""Every `--workers N` process opens the usage database (and the response cache) at the same
moment at start-up. SQLite answers "database is locked" at once, busy timeout or not, to
some of the connections switching a new file to WAL together: a worker that took it as final
failed its start-up, and uvicorn then stops the whole router. Real processes, real files."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from nomyo_router.ops.preflight import PathProblem
from nomyo_router.ops.sqlite_file import fold_wal, open_shared

SCHEMA = ["CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, n INTEGER)"]


def _open_and_add(path: str, go: Event) -> str:
    go.wait(10)
    try:
        db = open_shared(path, SCHEMA)
        db.execute("INSERT INTO t VALUES ('k', 1) ON CONFLICT (k) DO UPDATE SET n = n + 1")
        db.close()
        return "ok"
    except sqlite3.Error as e:
        return repr(e)


def test_processes_opening_a_new_file_together_all_open_it(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # (a fork of the test process, which has threads, can hang)
    processes, rounds = 6, 60
    with ctx.Manager() as manager, ctx.Pool(processes) as pool:
        for r in range(rounds):
            path = str(tmp_path / f"{r}.db")
            go = manager.Event()
            results = [pool.apply_async(_open_and_add, (path, go)) for _ in range(processes)]
            go.set()
            assert [x.get(30) for x in results] == ["ok"] * processes
            db = sqlite3.connect(path)
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert db.execute("SELECT n FROM t").fetchall() == [(processes,)]  # nothing lost
            db.close()
            assert (Path(path).stat().st_mode & 0o777) == 0o600


def test_an_error_other_than_a_lock_is_not_retried(tmp_path: Path) -> None:
    (tmp_path / "bad.db").write_bytes(b"not a database, and longer than a header" * 4)
    with pytest.raises(PathProblem, match=r"^database: cannot open .*bad\.db: file is not a database$"):
        open_shared(str(tmp_path / "bad.db"), SCHEMA, deadline_s=60)  # (at once: the test would time out)


def _add_and_die(path: str) -> None:
    db = open_shared(path, SCHEMA)
    db.execute("INSERT INTO t VALUES ('k', 7)")
    os._exit(0)  # (like a worker that never closed: its rows are in the -wal file only)


def test_what_the_workers_left_in_the_wal_is_folded_in_and_the_files_go(tmp_path: Path) -> None:
    """Workers that exit together (or one that is killed) can each leave `-wal` and `-shm`
    behind; the supervisor folds them in once all have exited. Nothing written is lost."""
    path = str(tmp_path / "u.db")
    proc = multiprocessing.get_context("spawn").Process(target=_add_and_die, args=(path,))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.db", "u.db-shm", "u.db-wal"]
    fold_wal(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.db"]
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT n FROM t WHERE k = 'k'").fetchall() == [(7,)]
    finally:
        db.close()
    fold_wal(path)  # nothing to fold: no file is created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.db"]
