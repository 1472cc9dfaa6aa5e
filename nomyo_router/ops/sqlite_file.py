"""Opening a SQLite file that every `--workers N` process of a router writes (the usage
database, the response cache), safely when they all start at the same moment.

Each worker opens the file in WAL mode with a busy timeout, so their writes wait for each
other instead of failing. Switching to WAL is the one step the busy timeout does not cover:
SQLite answers "database is locked" at once, without waiting, when another connection holds
the file while the first one to open it is creating its schema or its WAL index. A worker
that took that answer as final would fail its start-up, and uvicorn stops the whole router
when a worker fails to start; so the opening is retried, with a short growing pause, until
`OPEN_DEADLINE_S`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable

from .preflight import PathProblem

BUSY_TIMEOUT_S = 10.0  # how long a write waits for another process's transaction
OPEN_DEADLINE_S = 10.0  # how long opening keeps retrying a locked file


def private_db_file(path: str) -> None:
    """Create the database 0600 before SQLite opens it, whatever the umask: the usage database
    names every client and model with their traffic, the cache holds answers to prompts.
    SQLite itself would create it 0644 under umask 022; it creates the `-wal` and `-shm` files
    with the database file's own mode, so they are 0600 too. A database or a leftover
    `-wal`/`-shm` of ours from an older version is tightened."""
    if not _plain_file(path):
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for extra in (path + "-wal", path + "-shm"):
        with contextlib.suppress(OSError):  # absent (the usual case), or someone else's
            st = os.stat(extra)
            if st.st_uid == os.geteuid() and st.st_mode & 0o077:
                os.chmod(extra, 0o600)


def open_shared(
    path: str, schema: Iterable[str], key: str = "database", deadline_s: float = OPEN_DEADLINE_S
) -> sqlite3.Connection:
    """A private, autocommit connection in WAL mode with `schema` applied (statements that may
    run again: `CREATE … IF NOT EXISTS`). Raises PathProblem (one line naming `key`, the config
    key that names the file, the path as configured and the reason) when the file stays locked
    past `deadline_s`, or at once for any other error. (The start-up checks, ops/preflight.py,
    find almost every such file before a worker starts; this covers what changed since.)"""
    try:
        return _open_shared(path, list(schema), deadline_s)
    except (sqlite3.Error, OSError) as e:
        reason = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
        raise PathProblem(f"{key}: cannot open {path}: {reason}") from e


def _open_shared(path: str, statements: list[str], deadline_s: float) -> sqlite3.Connection:
    private_db_file(path)
    end = time.monotonic() + deadline_s
    pause = 0.01
    while True:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            for statement in statements:
                db.execute(statement)
            return db
        except sqlite3.OperationalError as e:
            db.close()
            if not _locked(e) or time.monotonic() + pause > end:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def fold_wal(path: str) -> None:
    """Fold the `-wal` file back into the database and remove it and `-shm`, once no process
    has the database open. SQLite does this itself when the last connection closes, but only
    a connection that finds itself alone does it: workers that close at the same moment each
    see the other still there, and both leave the files. The supervisor calls this after all
    its workers have exited, so its connection is the last one. Best effort: a file that
    cannot be opened now is left as it is (SQLite replays the WAL at the next open)."""
    if not _plain_file(path) or not os.path.exists(path + "-wal"):
        return
    with contextlib.suppress(sqlite3.Error, OSError):
        db = sqlite3.connect(path, timeout=1.0, isolation_level=None)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            db.close()


def _plain_file(path: str) -> bool:
    """A path to a file, not SQLite's in-memory database or a `file:` URI."""
    return path != ":memory:" and not path.startswith("file:")


def _locked(e: sqlite3.OperationalError) -> bool:
    text = str(e)
    return "locked" in text or "busy" in text
