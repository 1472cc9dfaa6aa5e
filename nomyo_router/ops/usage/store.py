"""Token accounting that survives restarts: per day, model, endpoint and client key.

Every finished request adds to an in-memory batch (a dict update on the event loop, nothing
else); a flusher hands the batch to storage once per `FLUSH_S`:

- `SqliteUsage` (the default, `usage_db: ./nomyo-usage.db`): one UPSERT per row, in one
  transaction, on a dedicated thread, so the event loop never waits on the disk. WAL mode and
  a busy timeout let every `--workers N` process add to the same file; each adds its own
  increments, so the sums are exact whatever the worker count.
- `RedisUsage` (with `state: redis://…`): HINCRBY into one hash per day, so every instance
  adds to the same counters.

Each row also says how much of its tokens the router counted itself as it relayed them
(`relayed_prompt_tokens`, `relayed_completion_tokens`: requests whose record says
`tokens_from: relayed`, a backend that sent no counts or a stream cut before its last
record); the rest are the backends' own counts. With SQLite, each flush also writes each
client key's tokens with the flush's time, kept two minutes (table `recent`): with today's
rows, what the token budgets read back when they start (budgets.py).

A request is never blocked or failed by the store: a failed flush is logged and its batch
kept for the next one. What a worker held in memory when killed with SIGKILL (at most
`FLUSH_S` of usage) is lost; a normal shutdown flushes.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

from ...events import Events, RequestRecord
from ...task_stop import end
from ..log_limit import LimitedLog

if TYPE_CHECKING:
    import sqlite3

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

log = logging.getLogger("nomyo_router.usage")

FLUSH_S = 1.0
FIELDS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "relayed_prompt_tokens",
    "relayed_completion_tokens",
)
RELAYED = FIELDS[4:]  # (added to databases of earlier versions when opened)
Row = tuple[str, str, str, str]  # day, model, endpoint, client
Counts = list[int]  # in FIELDS order
CACHE_ROW = "(cache)"  # the endpoint column of requests the response cache answered
RECENT_S = 120  # seconds of `recent` kept (the budgets read the last 60)


_day: tuple[float, str] = (0.0, "")  # (when the cached UTC day ends, its name)


def today() -> str:
    """The UTC day, formatted once per day (formatting per request cost 2 µs)."""
    global _day
    now = time.time()
    if now >= _day[0]:
        d = datetime.datetime.fromtimestamp(now, datetime.UTC)
        midnight = d.replace(hour=0, minute=0, second=0, microsecond=0) + datetime.timedelta(days=1)
        _day = (midnight.timestamp(), d.strftime("%Y-%m-%d"))
    return _day[1]


class Usage:
    """The batching half, shared by both stores; subclasses write and read."""

    def __init__(self, events: Events) -> None:
        self._batch: dict[Row, Counts] = {}
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._log = LimitedLog(log)
        events.on_request_done(self.add)

    def add(self, rec: RequestRecord) -> None:
        endpoint = rec.endpoint
        if endpoint is None:
            if rec.cache != "hit":  # never reached a backend: nothing was used
                return
            endpoint = CACHE_ROW  # answered by the response cache: counted apart, no tokens used
        row = (today(), rec.model, endpoint, rec.client or "")
        c = self._batch.get(row)
        if c is None:
            c = self._batch[row] = [0, 0, 0, 0, 0, 0]
        if 200 <= rec.status < 400:
            c[0] += 1
        else:
            c[1] += 1
        p, q = rec.prompt_tokens or 0, rec.completion_tokens or 0
        c[2] += p
        c[3] += q
        if rec.tokens_from == "relayed":
            c[4] += p
            c[5] += q

    async def start(self) -> None:
        await self._open()
        self._task = asyncio.get_running_loop().create_task(self._flusher())

    async def close(self) -> None:
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            await end(task)  # (one cancel is not always enough: task_stop.py)
        await self.flush()
        await self._close()

    async def _flusher(self) -> None:
        while not self._closing:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def flush(self) -> None:
        batch, self._batch = self._batch, {}
        if not batch:
            return
        try:
            await self._write(batch)
        except Exception as e:  # keep the counts for the next try; never fail a request
            self._log.failed(
                "write",
                logging.WARNING,
                "usage: could not write %d rows (%s); keeping them for the next flush",
                len(batch),
                e,
            )  # (once per outage or minute: a flush comes every second, in every worker)
            for row, c in batch.items():
                mine = self._batch.setdefault(row, [0] * len(FIELDS))
                for i, n in enumerate(c):
                    mine[i] += n
            return
        if self._log.failing("write"):
            self._log.recovered("write", logging.WARNING, "usage: written again, the rows kept meanwhile included")

    async def rows(self) -> list[tuple[Row, Counts]]:
        """Every stored row, after handing on this worker's pending batch."""
        await self.flush()
        return await self._read()

    async def _open(self) -> None: ...

    async def _close(self) -> None: ...

    async def _write(self, batch: dict[Row, Counts]) -> None:
        raise NotImplementedError

    async def _read(self) -> list[tuple[Row, Counts]]:
        raise NotImplementedError


SCHEMA = [
    """CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL, model TEXT NOT NULL, endpoint TEXT NOT NULL, client TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    relayed_prompt_tokens INTEGER NOT NULL DEFAULT 0, relayed_completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, model, endpoint, client))""",
    "CREATE TABLE IF NOT EXISTS recent (client TEXT NOT NULL, t INTEGER NOT NULL, tokens INTEGER NOT NULL)",
]
_COLUMNS = "day, model, endpoint, client, " + ", ".join(FIELDS)
_UPSERT = f"""INSERT INTO usage ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (day, model, endpoint, client) DO UPDATE SET
    {", ".join(f"{f} = {f} + excluded.{f}" for f in FIELDS)}"""


def open_usage_db(path: str) -> sqlite3.Connection:
    """The usage database, its tables made or brought up to date."""
    import sqlite3

    from ..sqlite_file import open_shared  # (here: a router that keeps usage in Redis, or none, never loads SQLite)

    db = open_shared(path, SCHEMA, "usage_db")
    have = {r[1] for r in db.execute("PRAGMA table_info(usage)")}
    for name in RELAYED:
        if name not in have:
            try:
                db.execute(f"ALTER TABLE usage ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0")
            except sqlite3.OperationalError as e:  # (another worker added it a moment ago)
                if "duplicate column" not in str(e):
                    db.close()
                    raise
    return db


class SqliteUsage(Usage):
    def __init__(self, events: Events, path: str) -> None:
        super().__init__(events)
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="nomyo-usage")  # one connection, one thread

    async def _run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def _open(self) -> None:
        await self._run(self._connect)

    def _connect(self) -> None:
        self._db = open_usage_db(self.path)

    async def _close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._thread.shutdown(wait=False)

    async def _write(self, batch: dict[Row, Counts]) -> None:
        rows: list[tuple[str | int, ...]] = [(*row, *c) for row, c in batch.items()]
        now, spent = int(time.time()), dict[str, int]()
        for (_, _, _, client), c in batch.items():  # each key's tokens of this flush, at its time
            if client and c[2] + c[3]:
                spent[client] = spent.get(client, 0) + c[2] + c[3]
        await self._run(self._write_sync, rows, [(client, now, n) for client, n in spent.items()])

    def _write_sync(self, rows: list[tuple[str | int, ...]], recent: list[tuple[str, int, int]]) -> None:
        assert self._db is not None
        with self._db:  # one transaction
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(_UPSERT, rows)
            if recent:
                self._db.executemany("INSERT INTO recent VALUES (?, ?, ?)", recent)
                self._db.execute("DELETE FROM recent WHERE t < ?", (int(time.time()) - RECENT_S,))

    async def _read(self) -> list[tuple[Row, Counts]]:
        return await self._run(self._read_sync)

    def _read_sync(self) -> list[tuple[Row, Counts]]:
        assert self._db is not None
        cur = self._db.execute(f"SELECT {_COLUMNS} FROM usage ORDER BY day, model, endpoint, client")
        return [((r[0], r[1], r[2], r[3]), list(r[4:])) for r in cur]


class RedisUsage(Usage):
    """Hash `<prefix>:usage:<day>`, field `model\\x1fendpoint\\x1fclient\\x1f<field>`."""

    SEP = "\x1f"

    def __init__(self, events: Events, url: str, prefix: str = "nomyo", timeout: float = 1.0) -> None:
        super().__init__(events)
        self.url, self.prefix, self.timeout = url, prefix, timeout
        self._redis: Any = None

    async def _open(self) -> None:
        from ...state import redis_url

        self._redis = redis_url.client(
            self.url, decode_responses=True, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
        )  # (a stalled Redis: a failed batch)

    async def _close(self) -> None:
        if self._redis is not None:
            from ...state import redis_url

            await redis_url.close(self._redis)

    async def _write(self, batch: dict[Row, Counts]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for (day, model, endpoint, client), c in batch.items():
            for name, n in zip(FIELDS, c, strict=True):
                if n:
                    pipe.hincrby(f"{self.prefix}:usage:{day}", self.SEP.join((model, endpoint, client, name)), n)
        await pipe.execute()

    async def _read(self) -> list[tuple[Row, Counts]]:
        out: dict[Row, Counts] = {}
        async for key in self._redis.scan_iter(f"{self.prefix}:usage:*"):
            day = key.rsplit(":", 1)[1]
            for field, n in (await self._redis.hgetall(key)).items():
                model, endpoint, client, name = field.split(self.SEP)
                out.setdefault((day, model, endpoint, client), [0] * len(FIELDS))[FIELDS.index(name)] += int(n)
        return sorted(out.items())


def make_usage(events: Events, usage_db: str | None, state: str, redis_timeout: float = 1.0) -> Usage | None:
    """Where usage is kept: nowhere when `usage_db` is null (whatever the state), else in
    Redis with Redis state (every instance adds to the same counters), else in the file."""
    if not usage_db:
        return None
    if state.startswith(("redis://", "rediss://", "unix://", "redis+sentinel://")):
        return RedisUsage(events, state, timeout=redis_timeout)
    return SqliteUsage(events, usage_db)
