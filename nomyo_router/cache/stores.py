"""Where kept answers live: this process's memory, or a SQLite file (Redis: redis_store.py).

Every store holds entries `key -> (namespace, value, vector)` for `ttl` seconds, at most
`max_entries` of them, and the hit and miss counters of every process using it. `vectors`
hands the semantic index (semantic.py) the embeddings added since its last look, so each
process keeps its own index of a shared store without reading it all on every lookup.

A store that fails (a locked or vanished file) fails the lookup, never the request: the
service (service.py) counts it a miss and logs it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, TypeVarTuple

from ..config import CacheConfig
from ..ops.sqlite_file import open_shared

ENTRY_OVERHEAD = 200  # bytes a memory entry costs besides its value and vector (dict slot, tuple, key)
Vectors = list[tuple[str, str, bytes]]  # (key, namespace, vector)
# Where a reader of `AnswerStore.vectors` got to, as the store marks it (a sequence number, a Redis
# stream id); None: from the start.
Cursor = int | str | None
T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class AnswerStore:
    """The interface; the memory store is the reference for what each call means."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    async def put(self, key: str, ns: str, value: bytes, vector: bytes | None = None) -> None:
        raise NotImplementedError

    async def vectors(self, cursor: Cursor) -> tuple[Vectors, Cursor]:
        """Embeddings added after `cursor` (None: from the start), and the next cursor."""
        raise NotImplementedError

    async def size(self) -> tuple[int, int]:
        """(entries, bytes) held now, expired ones left out."""
        raise NotImplementedError

    async def clear(self) -> int:
        """Drop every entry; returns how many there were."""
        raise NotImplementedError

    async def add_counts(self, hits: int, misses: int) -> None:
        raise NotImplementedError

    async def counts(self) -> tuple[int, int]:
        raise NotImplementedError


class MemoryAnswerStore(AnswerStore):
    """An LRU dict bounded by `max_entries` and `max_bytes`; expired entries go when met."""

    def __init__(self, cfg: CacheConfig) -> None:
        self.ttl, self.max_entries, self.max_bytes = cfg.ttl, cfg.max_entries, cfg.max_bytes
        self._entries: OrderedDict[str, tuple[float, int, bytes]] = OrderedDict()  # key: (expires, size, value)
        self._log: Vectors = []  # every embedding added, in order (the index reads it by position)
        self._dropped = 0  # embeddings taken off the front of _log
        self.bytes = 0
        self.hits = self.misses = 0

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= time.monotonic():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry[2]

    async def put(self, key: str, ns: str, value: bytes, vector: bytes | None = None) -> None:
        if key in self._entries:
            self._drop(key)
        size = len(value) + len(vector or b"") + ENTRY_OVERHEAD
        self._entries[key] = (time.monotonic() + self.ttl, size, value)
        self.bytes += size
        if vector is not None:
            self._log.append((key, ns, vector))
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        if len(self._log) > 2 * self.max_entries:  # embeddings of entries long gone
            cut = len(self._log) - self.max_entries
            del self._log[:cut]
            self._dropped += cut

    def _drop(self, key: str) -> None:
        _, size, _ = self._entries.pop(key)
        self.bytes -= size

    async def vectors(self, cursor: Cursor) -> tuple[Vectors, Cursor]:
        start = max(int(cursor or 0) - self._dropped, 0)
        return self._log[start:], self._dropped + len(self._log)

    async def size(self) -> tuple[int, int]:
        now = time.monotonic()
        for key in [k for k, e in self._entries.items() if e[0] <= now]:
            self._drop(key)
        return len(self._entries), self.bytes

    async def clear(self) -> int:
        n = len(self._entries)
        self._entries.clear()
        self._log.clear()
        self._dropped = 0
        self.bytes = 0
        return n

    async def add_counts(self, hits: int, misses: int) -> None:
        self.hits += hits
        self.misses += misses

    async def counts(self) -> tuple[int, int]:
        return self.hits, self.misses


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entries (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE,
       ns TEXT NOT NULL, value BLOB NOT NULL, vector BLOB, expires REAL NOT NULL, size INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS entries_expires ON entries (expires)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL)",
)


class SqliteAnswerStore(AnswerStore):
    """One table in a file every worker and every restart shares (WAL, one thread per process,
    as the usage store). Bounded by `max_entries`: the entries nearest their end go first."""

    def __init__(self, cfg: CacheConfig) -> None:
        self.path, self.ttl, self.max_entries = cfg.path, cfg.ttl, cfg.max_entries
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="nomyo-cache")

    async def _run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def start(self) -> None:
        await self._run(self._connect)

    def _connect(self) -> None:
        self._db = open_shared(self.path, _SCHEMA, "cache.path")  # 0600: it holds answers to people's prompts

    async def close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._thread.shutdown(wait=False)

    def _sql(self) -> sqlite3.Connection:
        assert self._db is not None
        return self._db

    async def get(self, key: str) -> bytes | None:
        return await self._run(self._get, key)

    def _get(self, key: str) -> bytes | None:
        row = (
            self._sql()
            .execute("SELECT value FROM entries WHERE key = ? AND expires > ?", (key, time.time()))
            .fetchone()
        )
        return row[0] if row else None

    async def put(self, key: str, ns: str, value: bytes, vector: bytes | None = None) -> None:
        await self._run(self._put, key, ns, value, vector)

    def _put(self, key: str, ns: str, value: bytes, vector: bytes | None) -> None:
        db, now = self._sql(), time.time()
        with db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM entries WHERE key = ? OR expires <= ?", (key, now))
            db.execute(
                "INSERT INTO entries (key, ns, value, vector, expires, size) VALUES (?, ?, ?, ?, ?, ?)",
                (key, ns, value, vector, now + self.ttl, len(value) + len(vector or b"")),
            )
            (n,) = db.execute("SELECT COUNT(*) FROM entries").fetchone()
            if n > self.max_entries:
                db.execute(
                    "DELETE FROM entries WHERE seq IN (SELECT seq FROM entries ORDER BY expires LIMIT ?)",
                    (n - self.max_entries,),
                )

    async def vectors(self, cursor: Cursor) -> tuple[Vectors, Cursor]:
        return await self._run(self._vectors, int(cursor or 0))

    def _vectors(self, cursor: int) -> tuple[Vectors, Cursor]:
        rows = (
            self._sql()
            .execute(
                "SELECT seq, key, ns, vector FROM entries WHERE seq > ? AND vector IS NOT NULL "
                "AND expires > ? ORDER BY seq",
                (cursor, time.time()),
            )
            .fetchall()
        )
        return [(r[1], r[2], r[3]) for r in rows], (rows[-1][0] if rows else cursor)

    async def size(self) -> tuple[int, int]:
        return await self._run(self._size)

    def _size(self) -> tuple[int, int]:
        n, size = (
            self._sql()
            .execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries WHERE expires > ?", (time.time(),))
            .fetchone()
        )
        return n, size

    async def clear(self) -> int:
        return await self._run(self._clear)

    def _clear(self) -> int:
        db = self._sql()
        with db:
            db.execute("BEGIN IMMEDIATE")
            row: tuple[int] = db.execute("SELECT COUNT(*) FROM entries WHERE expires > ?", (time.time(),)).fetchone()
            db.execute("DELETE FROM entries")
        return row[0]

    async def add_counts(self, hits: int, misses: int) -> None:
        await self._run(self._add_counts, hits, misses)

    def _add_counts(self, hits: int, misses: int) -> None:
        db = self._sql()
        with db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT INTO counters VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET n = n + excluded.n",
                (("hits", hits), ("misses", misses)),
            )

    async def counts(self) -> tuple[int, int]:
        return await self._run(self._counts)

    def _counts(self) -> tuple[int, int]:
        got = dict(self._sql().execute("SELECT name, n FROM counters").fetchall())
        return got.get("hits", 0), got.get("misses", 0)
