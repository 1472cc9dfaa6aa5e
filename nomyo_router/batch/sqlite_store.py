"""The batch store in one SQLite file (`batch.path`), shared by every `--workers N` process
of a router (see base.py for what it keeps and how a line gets one result).

A line's result and its new state are written in one statement that only a queued row
matches. `SqliteFile`'s calls are synchronous and short, one at a time (a lock);
`SqliteAnswerStore` runs each in a thread, so a large upload never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..ops.sqlite_file import open_shared
from .base import ACTIVE, BatchStore, Line, NewLine

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, content BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL, status TEXT NOT NULL, obj TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, model TEXT NOT NULL,
    state TEXT NOT NULL, request TEXT NOT NULL, result TEXT, PRIMARY KEY (batch_id, idx))""",
    "CREATE INDEX IF NOT EXISTS lines_state ON lines (state, batch_id)",
    "CREATE INDEX IF NOT EXISTS lines_model ON lines (batch_id, model, state, idx)",
    "CREATE TABLE IF NOT EXISTS leader (id INTEGER PRIMARY KEY, holder TEXT NOT NULL, until REAL NOT NULL)",
]


class SqliteFile:
    """Files, batches and lines in one SQLite file (`path`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        self._db = open_shared(self.path, SCHEMA, "batch.path")

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _q(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            assert self._db is not None
            return self._db.execute(sql, args).fetchall()

    # ---- files ---------------------------------------------------------------------------------
    def put_file(self, obj: dict[str, Any], owner: str, content: bytes) -> None:
        self._q(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                obj["id"],
                owner,
                obj["filename"],
                obj["purpose"],
                obj["bytes"],
                obj["created_at"],
                obj["expires_at"],
                content,
            ),
        )

    def get_file(self, file_id: str) -> tuple[dict[str, Any], str] | None:
        rows = self._q(
            "SELECT id, filename, purpose, bytes, created_at, expires_at, owner FROM files WHERE id = ?", (file_id,)
        )
        return (_file(rows[0]), rows[0][6]) if rows else None

    def content(self, file_id: str) -> bytes | None:
        rows = self._q("SELECT content FROM files WHERE id = ?", (file_id,))
        return bytes(rows[0][0]) if rows else None

    def list_files(
        self, owner: str | None, purpose: str | None, after: str | None, limit: int, desc: bool
    ) -> list[Any]:
        where, args = _owned(owner)
        if purpose:
            where, args = where + " AND purpose = ?", [*args, purpose]
        if after:
            op = "<" if desc else ">"
            where += f" AND rowid {op} (SELECT rowid FROM files WHERE id = ?)"
            args.append(after)
        order = "DESC" if desc else "ASC"
        rows = self._q(
            f"SELECT id, filename, purpose, bytes, created_at, expires_at FROM files WHERE {where} "
            f"ORDER BY rowid {order} LIMIT ?",
            [*args, limit],
        )
        return [_file(r) for r in rows]

    def delete_file(self, file_id: str) -> None:
        self._q("DELETE FROM files WHERE id = ?", (file_id,))

    # ---- batches -------------------------------------------------------------------------------
    def create_batch(self, obj: dict[str, Any], owner: str, lines: Iterable[NewLine]) -> None:
        """The batch and its lines, at once: (idx, custom_id, model, request JSON, result JSON
        of a line refused before it ran, else None)."""
        with self._lock:
            db = self._db
            assert db is not None
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT INTO batches VALUES (?, ?, ?, ?, ?)",
                    (obj["id"], owner, obj["created_at"], obj["status"], json.dumps(obj)),
                )
                db.executemany(
                    "INSERT INTO lines VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        (obj["id"], i, cid, model, "queued" if result is None else "failed", req, result)
                        for i, cid, model, req, result in lines
                    ),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def get_batch(self, batch_id: str) -> tuple[dict[str, Any], str] | None:
        rows = self._q("SELECT obj, owner FROM batches WHERE id = ?", (batch_id,))
        return (json.loads(rows[0][0]), rows[0][1]) if rows else None

    def list_batches(self, owner: str | None, after: str | None, limit: int) -> list[dict[str, Any]]:
        where, args = _owned(owner)
        if after:
            where += " AND rowid < (SELECT rowid FROM batches WHERE id = ?)"
            args.append(after)
        rows = self._q(f"SELECT obj FROM batches WHERE {where} ORDER BY rowid DESC LIMIT ?", [*args, limit])
        return [json.loads(r[0]) for r in rows]

    def save_batch(self, obj: dict[str, Any], only_if: Sequence[str] = ()) -> bool:
        """Write the batch's new object; `only_if`: only when its status is one of these."""
        sql, args = "UPDATE batches SET status = ?, obj = ? WHERE id = ?", [obj["status"], json.dumps(obj), obj["id"]]
        if only_if:
            sql += f" AND status IN ({','.join('?' * len(only_if))})"
            args += list(only_if)
        with self._lock:
            assert self._db is not None
            return self._db.execute(sql, args).rowcount == 1

    def active(self) -> list[dict[str, Any]]:
        """The batches still running, each with its owner under `_owner`."""
        marks = ",".join("?" * len(ACTIVE))
        rows = self._q(f"SELECT obj, owner FROM batches WHERE status IN ({marks})", ACTIVE)
        return [{**json.loads(obj), "_owner": owner} for obj, owner in rows]

    def counts(self, batch_id: str) -> dict[str, int]:
        rows = self._q("SELECT state, COUNT(*) FROM lines WHERE batch_id = ? GROUP BY state", (batch_id,))
        return {state: n for state, n in rows}

    # ---- lines ---------------------------------------------------------------------------------
    def models(self, batch_id: str) -> list[str]:
        return [r[0] for r in self._q("SELECT DISTINCT model FROM lines WHERE batch_id = ?", (batch_id,))]

    def queued(self, batch_id: str, model: str, skip: set[tuple[str, int]], limit: int) -> list[Line]:
        """Up to `limit` queued lines of the batch for `model`, in their order, not in `skip`."""
        rows = self._q(
            "SELECT batch_id, idx, custom_id, model, request FROM lines "
            "WHERE batch_id = ? AND model = ? AND state = 'queued' ORDER BY idx LIMIT ?",
            (batch_id, model, limit + len(skip)),
        )
        return [tuple(r) for r in rows if (r[0], r[1]) not in skip][:limit]

    def finish_line(self, batch_id: str, idx: int, ok: bool, result: str) -> bool:
        """The line's one result: False when it already had one (run twice)."""
        with self._lock:
            assert self._db is not None
            cur = self._db.execute(
                "UPDATE lines SET state = ?, result = ? WHERE batch_id = ? AND idx = ? AND state = 'queued'",
                ("done" if ok else "failed", result, batch_id, idx),
            )
            return cur.rowcount == 1

    def fail_queued(self, batch_id: str, result_of: Callable[[str], str]) -> None:
        """Every line still queued fails with `result_of(custom_id)` (an expired batch)."""
        rows = self._q("SELECT idx, custom_id FROM lines WHERE batch_id = ? AND state = 'queued'", (batch_id,))
        for idx, cid in rows:
            self.finish_line(batch_id, idx, False, result_of(cid))

    def results(self, batch_id: str, state: str) -> bytes:
        rows = self._q("SELECT result FROM lines WHERE batch_id = ? AND state = ? ORDER BY idx", (batch_id, state))
        return b"".join(r[0].encode() + b"\n" for r in rows)

    def finalize(self, obj: dict[str, Any], files: Sequence[tuple[dict[str, Any], bytes]], owner: str) -> bool:
        """The batch's output and error files and its final object, in one transaction (only
        while it is still active: one runner finalizes it)."""
        with self._lock:
            db = self._db
            assert db is not None
            db.execute("BEGIN IMMEDIATE")
            try:
                marks = ",".join("?" * len(ACTIVE))
                cur = db.execute(
                    f"UPDATE batches SET status = ?, obj = ? WHERE id = ? AND status IN ({marks})",
                    (obj["status"], json.dumps(obj), obj["id"], *ACTIVE),
                )
                if cur.rowcount != 1:
                    db.execute("ROLLBACK")
                    return False
                for f, content in files:
                    db.execute(
                        "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            f["id"],
                            owner,
                            f["filename"],
                            f["purpose"],
                            f["bytes"],
                            f["created_at"],
                            f["expires_at"],
                            content,
                        ),
                    )
                db.execute("COMMIT")
                return True
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def line_counts(self) -> list[tuple[str, str, int]]:
        """(model, state, lines) over the batches kept: /metrics."""
        return [tuple(r) for r in self._q("SELECT model, state, COUNT(*) FROM lines GROUP BY model, state")]

    # ---- one runner at a time ------------------------------------------------------------------
    def lead(self, holder: str, ttl: float) -> bool:
        """Become or stay the one runner for `ttl` seconds; False while another holds it."""
        now = time.time()
        with self._lock:
            assert self._db is not None
            self._db.execute(
                "INSERT INTO leader VALUES (1, ?, ?) ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, "
                "until = excluded.until WHERE leader.until < ? OR leader.holder = excluded.holder",
                (holder, now + ttl, now),
            )
            row = self._db.execute("SELECT holder FROM leader WHERE id = 1").fetchone()
            return bool(row and row[0] == holder)

    def resign(self, holder: str) -> None:
        self._q("DELETE FROM leader WHERE id = 1 AND holder = ?", (holder,))

    def sweep(self, now: float, retention: float) -> None:
        """Files past their time, and batches finished longer ago than `retention`, go."""
        self._q("DELETE FROM files WHERE expires_at < ?", (int(now),))
        old = self._q(
            f"SELECT id FROM batches WHERE status NOT IN ({','.join('?' * len(ACTIVE))}) AND created_at < ?",
            (*ACTIVE, int(now - retention)),
        )
        for (bid,) in old:
            self._q("DELETE FROM lines WHERE batch_id = ?", (bid,))
            self._q("DELETE FROM batches WHERE id = ?", (bid,))


def _owned(owner: str | None) -> tuple[str, list[Any]]:
    return ("1 = 1", []) if owner is None else ("owner = ?", [owner])


def _file(row: Sequence[Any]) -> dict[str, Any]:
    return {
        "id": row[0],
        "object": "file",
        "bytes": row[3],
        "created_at": row[4],
        "expires_at": row[5],
        "filename": row[1],
        "purpose": row[2],
        "status": "processed",
        "status_details": None,
    }


class SqliteAnswerStore(BatchStore):
    """The SQLite file's calls, each in a thread: a large file never stalls the event loop."""

    errors = (sqlite3.Error, OSError)

    def __init__(self, path: str) -> None:
        self.f = SqliteFile(path)

    async def open(self) -> None:
        return await asyncio.to_thread(self.f.open)

    async def close(self) -> None:
        return await asyncio.to_thread(self.f.close)

    async def put_file(self, obj: dict[str, Any], owner: str, content: bytes) -> None:
        return await asyncio.to_thread(self.f.put_file, obj, owner, content)

    async def get_file(self, file_id: str) -> tuple[dict[str, Any], str] | None:
        return await asyncio.to_thread(self.f.get_file, file_id)

    async def content(self, file_id: str) -> bytes | None:
        return await asyncio.to_thread(self.f.content, file_id)

    async def list_files(
        self, owner: str | None, purpose: str | None, after: str | None, limit: int, desc: bool
    ) -> list[Any]:
        return await asyncio.to_thread(self.f.list_files, owner, purpose, after, limit, desc)

    async def create_batch(self, obj: dict[str, Any], owner: str, lines: Iterable[NewLine]) -> None:
        return await asyncio.to_thread(self.f.create_batch, obj, owner, lines)

    async def save_batch(self, obj: dict[str, Any], only_if: Sequence[str] = ()) -> bool:
        return await asyncio.to_thread(self.f.save_batch, obj, only_if)

    async def delete_file(self, file_id: str) -> None:
        return await asyncio.to_thread(self.f.delete_file, file_id)

    async def get_batch(self, batch_id: str) -> tuple[dict[str, Any], str] | None:
        return await asyncio.to_thread(self.f.get_batch, batch_id)

    async def list_batches(self, owner: str | None, after: str | None, limit: int) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.f.list_batches, owner, after, limit)

    async def active(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.f.active)

    async def counts(self, batch_id: str) -> dict[str, int]:
        return await asyncio.to_thread(self.f.counts, batch_id)

    async def models(self, batch_id: str) -> list[str]:
        return await asyncio.to_thread(self.f.models, batch_id)

    async def queued(self, batch_id: str, model: str, skip: set[tuple[str, int]], limit: int) -> list[Line]:
        return await asyncio.to_thread(self.f.queued, batch_id, model, skip, limit)

    async def finish_line(self, batch_id: str, idx: int, ok: bool, result: str) -> bool:
        return await asyncio.to_thread(self.f.finish_line, batch_id, idx, ok, result)

    async def fail_queued(self, batch_id: str, result_of: Callable[[str], str]) -> None:
        return await asyncio.to_thread(self.f.fail_queued, batch_id, result_of)

    async def results(self, batch_id: str, state: str) -> bytes:
        return await asyncio.to_thread(self.f.results, batch_id, state)

    async def finalize(self, obj: dict[str, Any], files: Sequence[tuple[dict[str, Any], bytes]], owner: str) -> bool:
        return await asyncio.to_thread(self.f.finalize, obj, files, owner)

    async def line_counts(self) -> list[tuple[str, str, int]]:
        return await asyncio.to_thread(self.f.line_counts)

    async def lead(self, holder: str, ttl: float) -> bool:
        return await asyncio.to_thread(self.f.lead, holder, ttl)

    async def resign(self, holder: str) -> None:
        return await asyncio.to_thread(self.f.resign, holder)

    async def sweep(self, now: float, retention: float) -> None:
        return await asyncio.to_thread(self.f.sweep, now, retention)
