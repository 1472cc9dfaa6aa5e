"""`SlotTable`: the workers' slot counts in one shared-memory file, guarded by `flock`.

The embedded shared store (worker_store.py, coordinator.py) keeps one FIFO wait queue in the
hosting worker, but a request that finds a free slot should not cross a socket for it.
So the counts live here, where every worker of one host can take and give back a slot
under a process-shared lock in a few microseconds; the socket is only for waiting and
wake-ups.

Layout (native int32 unless noted), one file `<base>.slots` mapped by every worker:

    header     magic 8 bytes, endpoints E, rows W, rows in use, share (see `limit`)
    names      E x 64 bytes: endpoint name (utf-8), index = the endpoint's column
    unhealthy  E bytes, written by the host (its verdict over every worker's reports)
    pids       W: the worker that owns each row (0: free)
    waiting    W: requests of that worker waiting at the host
    held       E x W: slots each worker holds on each endpoint (endpoint-major)
    pairs      P x 128 bytes: (endpoint column int32, model name) for the usage counts
    usage      P x W int64: requests each worker served per (endpoint, model); kept when
               a row changes hands, so the sums are the host's history

Exactness: a slot is taken only under the lock, when the endpoint's column sums below
its slots. Nothing is counted anywhere else, so nothing can drift: a worker that dies
(even `kill -9` in the middle of an update: every write is one aligned word) leaves its
row, and the host — or whoever claims the row next — zeroes it. The lock is `flock`,
which the kernel drops with the process that held it.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from fcntl import LOCK_EX, LOCK_UN, flock

from . import private
from .processes import alive

MAGIC = b"nomyoST1"
ENDPOINTS = 256
ROWS = 64
NAME = 64
_HEAD = struct.Struct("8siii")
_SHARE = _HEAD.size  # int32 after the header: the instances an endpoint's slots are shared by
_NAMES = _SHARE + 4
_UNHEALTHY = _NAMES + ENDPOINTS * NAME
_PIDS = _UNHEALTHY + ENDPOINTS
_WAITING = _PIDS + ROWS * 4
_HELD = _WAITING + ROWS * 4
PAIRS = 4096
PAIR = 128
_PAIRS = _HELD + ENDPOINTS * ROWS * 4
_USAGE = _PAIRS + PAIRS * PAIR
SIZE = _USAGE + PAIRS * ROWS * 8


def share_of(slots: int, instances: int) -> int:
    """An instance's part of an endpoint's `slots` when `instances` share it (at least one)."""
    return slots if instances <= 1 else max(1, slots // instances)


class SlotTable:
    """One process's handle on the table. `row` is this handle's own row (claimed at open)."""

    def __init__(self, path: str) -> None:
        private.check_file(path)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._lock()
        try:
            if os.fstat(self.fd).st_size < SIZE:
                os.ftruncate(self.fd, SIZE)
            self._map = mmap.mmap(self.fd, SIZE)
            magic, e, w, _ = _HEAD.unpack_from(self._map, 0)
            if magic != MAGIC:
                _HEAD.pack_into(self._map, 0, MAGIC, ENDPOINTS, ROWS, 0)
            elif (e, w) != (ENDPOINTS, ROWS):
                raise RuntimeError(f"{path}: a slot table of another layout")
            mv = self._mv = memoryview(self._map)
            self._meta = mv[8:20].cast("i")  # endpoints, rows, rows in use
            self._share = mv[_SHARE:_NAMES].cast("i")
            self._pids = mv[_PIDS:_WAITING].cast("i")
            self._waiting = mv[_WAITING:_HELD].cast("i")
            self._held = mv[_HELD:_PAIRS].cast("i")
            self._unhealthy = mv[_UNHEALTHY:_PIDS]
            self._usage = mv[_USAGE:SIZE].cast("q")
            self._columns: dict[str, int] = {}
            self._names: dict[int, str] = {}
            self._pairs: dict[tuple[str, str], int] = {}
            self.row = self._claim_row()
        finally:
            self._unlock()

    # -- the lock ---------------------------------------------------------------------
    def _lock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def _unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    # -- rows and columns (under the lock) --------------------------------------------
    @property
    def _rows(self) -> int:
        return self._meta[2]

    def _claim_row(self) -> int:
        pid = os.getpid()
        for r in range(ROWS):
            other = self._pids[r]
            if other == 0 or not alive(other):
                self._zero(r)
                self._pids[r] = pid
                if r >= self._meta[2]:
                    self._meta[2] = r + 1
                return r
        raise RuntimeError(f"more than {ROWS} processes share one slot table")

    def _zero(self, row: int) -> None:
        held = self._held
        for c in range(0, ENDPOINTS * ROWS, ROWS):
            held[c + row] = 0
        self._waiting[row] = 0
        self._pids[row] = 0

    def column(self, name: str) -> int:
        c = self._columns.get(name)
        if c is None:
            self._lock()
            try:
                c = self._find_column(name)
            finally:
                self._unlock()
        return c

    def _find_column(self, name: str) -> int:
        raw = name.encode()[: NAME - 1]
        m = self._map
        for i in range(ENDPOINTS):
            at = _NAMES + i * NAME
            if m[at] == 0:
                m[at : at + len(raw) + 1] = raw + b"\x00"
                break
            if m[at : at + NAME].split(b"\x00", 1)[0] == raw:
                break
        else:
            raise RuntimeError(f"more than {ENDPOINTS} endpoints in one slot table")
        self._columns[name] = i
        self._names[i] = name
        return i

    def name_of(self, column: int) -> str:
        name = self._names.get(column)
        if name is None:
            at = _NAMES + column * NAME
            name = self._names[column] = self._map[at : at + NAME].split(b"\x00", 1)[0].decode()
        return name

    # -- usage counts ------------------------------------------------------------------
    def record(self, endpoint: str, model: str) -> None:
        """One request served; our row's counter only, so no lock."""
        pair = self._pairs.get((endpoint, model))
        if pair is None:
            pair = self._pair(endpoint, model)
        self._usage[pair * ROWS + self.row] += 1

    def _pair(self, endpoint: str, model: str) -> int:
        col = self.column(endpoint)
        raw = struct.pack("i", col) + model.encode()[: PAIR - 5] + b"\x00"
        m = self._map
        self._lock()
        try:
            for i in range(PAIRS):
                at = _PAIRS + i * PAIR
                rec = m[at : at + PAIR]
                if rec[4] == 0 or rec[: len(raw)] == raw:
                    if rec[4] == 0:
                        m[at : at + len(raw)] = raw
                    break
            else:
                raise RuntimeError(f"more than {PAIRS} (endpoint, model) pairs in one slot table")
        finally:
            self._unlock()
        self._pairs[endpoint, model] = i
        return i

    def usage(self) -> dict[str, dict[str, int]]:
        """{endpoint: {model: requests}} over every worker, past and present."""
        out: dict[str, dict[str, int]] = {}
        m, usage = self._map, self._usage
        for i in range(PAIRS):
            at = _PAIRS + i * PAIR
            if m[at + 4] == 0:
                break
            col = struct.unpack_from("i", m, at)[0]
            model = m[at + 4 : at + PAIR].split(b"\x00", 1)[0].decode()
            n = sum(usage[i * ROWS : (i + 1) * ROWS])
            if n:
                out.setdefault(self.name_of(col), {})[model] = n
        return out

    # -- the share: Redis state degraded, this host takes its part of every endpoint ---
    def share_by(self, instances: int) -> None:
        """From now on each endpoint's limit here is its slots divided by `instances` (at
        least one); 0 or 1: all its slots. Every worker of the host reads the same word."""
        self._share[0] = max(instances, 0)

    def limit(self, slots: int) -> int:
        return share_of(slots, self._share[0])

    # -- reads (no lock: a word read is atomic; decisions that matter re-check under it) --
    def in_flight(self, name: str) -> int:
        c = self.column(name) * ROWS
        return sum(self._held[c : c + self._rows])

    def own(self, name: str) -> int:
        """Slots this handle's row holds on `name`."""
        return self._held[self.column(name) * ROWS + self.row]

    def waiting(self) -> int:
        return sum(self._waiting[: self._rows])

    def unhealthy(self, name: str) -> bool:
        return self._unhealthy[self.column(name)] != 0

    # -- writes ------------------------------------------------------------------------
    def try_take(self, name: str, slots: int, row: int | None = None, fast: bool = False) -> bool:
        """Take a slot on `name` for `row` (default: ours) if one is free. `fast`: only while
        nobody waits at the host (a new request must not pass a waiting one)."""
        c = self._columns.get(name)
        if c is None:
            c = self.column(name)
        at = c * ROWS
        held = self._held
        flock(self.fd, LOCK_EX)
        try:
            rows = self._meta[2]
            if fast and any(self._waiting[:rows]):
                return False
            share = self._share[0]  # (inline: `limit`, without a call on the hot path)
            if share > 1:
                slots = max(1, slots // share)
            if self._unhealthy[c] or sum(held[at : at + rows]) >= slots:
                return False
            held[at + (self.row if row is None else row)] += 1
            return True
        finally:
            flock(self.fd, LOCK_UN)

    def add(self, name: str) -> None:
        """Count a slot granted elsewhere (by Redis) in our row, whatever the limit here."""
        at = self.column(name) * ROWS + self.row
        flock(self.fd, LOCK_EX)
        try:
            self._held[at] += 1
        finally:
            flock(self.fd, LOCK_UN)

    def give_back(self, name: str, row: int | None = None) -> bool:
        """Give back one slot of `row` (default: ours). True when somebody waits at the host
        (the caller then tells the host to hand the slot on)."""
        c = self._columns.get(name)
        if c is None:
            c = self.column(name)
        at = c * ROWS + (self.row if row is None else row)
        flock(self.fd, LOCK_EX)
        try:
            if self._held[at] > 0:
                self._held[at] -= 1
            return any(self._waiting[: self._meta[2]])
        finally:
            flock(self.fd, LOCK_UN)

    def wait_begin(self) -> None:
        """Count one of our requests as waiting at the host: from now on no new request takes
        a slot past it, and whoever gives a slot back tells the host."""
        self._lock()
        try:
            self._waiting[self.row] += 1
        finally:
            self._unlock()

    def wait_end(self) -> None:
        self._lock()
        try:
            if self._waiting[self.row] > 0:
                self._waiting[self.row] -= 1
        finally:
            self._unlock()

    def set_unhealthy(self, name: str, unhealthy: bool) -> None:
        self._unhealthy[self.column(name)] = 1 if unhealthy else 0

    def reclaim(self, row: int | None = None, pid: int | None = None) -> None:
        """Zero `row` (a worker that left), or every row whose process is gone."""
        self._lock()
        try:
            if row is not None:
                if pid is None or self._pids[row] == pid:
                    self._zero(row)
                return
            for r in range(self._rows):
                p = self._pids[r]
                if p and not alive(p):
                    self._zero(r)
        finally:
            self._unlock()

    def close(self) -> None:
        """Give our row back (its counts with it: we hold nothing once we close)."""
        self.reclaim(self.row, os.getpid())
        views = (self._meta, self._share, self._pids, self._waiting, self._held, self._unhealthy, self._usage)
        for view in (*views, self._mv):
            view.release()
        self._map.close()
        os.close(self.fd)
