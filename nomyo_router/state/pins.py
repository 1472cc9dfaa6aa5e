"""`PinTable`: conversation pins shared by the workers of one host, in shared memory.

A pin (affinity key -> endpoint) is written by whichever worker served a turn and read by
whichever worker gets the next one, so it must be visible to every worker at once; with
it in a mapped file (`<base>.pins`, `flock`-guarded like the slot table) neither the write
nor the lookup crosses a socket.

Layout: a header (magic, entries, pins in use) and `entries` records of 32 bytes:
16-byte key digest, expiry (float64, monotonic clock: the same for every process of one
host), endpoint column (int32, the slot table's). A key lives in the 8 records from its
hash on; a new key takes a free one there, else the one idle longest (expired or not) — so the
table is an LRU per neighbourhood, bounded by `affinity_max_pins` (entries = the next
power of two at least 1.25× that). Pages are touched only as pins arrive.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import time
from collections.abc import Callable, Sequence

from . import private

MAGIC = b"nomyoPT1"
PROBE = 8
_HEAD = struct.Struct("8sqq")  # magic, entries, in use
_REC = struct.Struct("16sdi4x")
_EMPTY = bytes(16)
_EXPIRY = struct.Struct("d")
_WINDOW = PROBE * _REC.size


def _find(window: bytes, digest: bytes) -> int:
    """The offset in `window` (a neighbourhood's records) of the record whose key is
    `digest`, or -1. (16 bytes matching across two records: never for random digests, but a
    free record's zeros can: only offsets at a record's start count.)"""
    i = window.find(digest)
    while i > 0 and i % _REC.size:
        i = window.find(digest, i + 1)
    return i


class PinTable:
    def __init__(
        self, path: str, max_pins: int, ttl: float, column: Callable[[str], int], name_of: Callable[[int], str]
    ) -> None:
        self.ttl = ttl
        self._column, self._name_of = column, name_of
        n = 1
        while n < max_pins * 1.25 or n < PROBE:
            n *= 2
        private.check_file(path)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            magic, entries, _ = _HEAD.unpack(os.pread(self.fd, _HEAD.size, 0).ljust(_HEAD.size, b"\0"))
            if magic != MAGIC:
                entries = n
                os.ftruncate(self.fd, _HEAD.size + n * _REC.size)
                os.pwrite(self.fd, _HEAD.pack(MAGIC, n, 0), 0)
            self.entries = entries
            self._map = mmap.mmap(self.fd, _HEAD.size + entries * _REC.size)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _slots(self, key: str) -> tuple[bytes, int]:
        """(digest, offset of the first of its records). The last neighbourhood would wrap
        around the end, so it starts PROBE records earlier instead."""
        try:  # the router's keys end in a 128-bit hex digest already (routing/affinity.py)
            digest = bytes.fromhex(key[-32:]) if len(key) >= 32 else b""
        except ValueError:
            digest = b""
        if len(digest) != 16:
            digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        first = int.from_bytes(digest[:8], "little") & (self.entries - 1)
        if first > self.entries - PROBE:
            first = self.entries - PROBE
        return digest, _HEAD.size + first * _REC.size

    def _locate(self, digest: bytes, at0: int) -> int:
        """The offset of `digest`'s record in the neighbourhood at `at0`, or -1 (locked)."""
        i = _find(self._map[at0 : at0 + _WINDOW], digest)
        return -1 if i < 0 else at0 + i

    def _used(self, delta: int) -> None:
        _, entries, used = _HEAD.unpack_from(self._map, 0)
        _HEAD.pack_into(self._map, 0, MAGIC, entries, used + delta)

    def find(self, keys: Sequence[str]) -> tuple[str, str] | None:
        """The first of `keys` with a live pin, as (key, endpoint name); refreshes its timer."""
        now = time.monotonic()
        m = self._map
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            for key in keys:
                digest, at0 = self._slots(key)
                at = self._locate(digest, at0)
                if at < 0:
                    continue
                _, expiry, col = _REC.unpack_from(m, at)
                if expiry < now:
                    _REC.pack_into(m, at, _EMPTY, 0.0, 0)
                    self._used(-1)
                    continue
                _REC.pack_into(m, at, digest, now + self.ttl, col)
                return key, self._name_of(col)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        return None

    def set(self, key: str, endpoint: str) -> None:
        self.set_many([(key, endpoint)])

    def set_many(self, pins: Sequence[tuple[str, str]]) -> None:
        """Write pins (key, endpoint) under one lock."""
        now = time.monotonic()
        expiry = now + self.ttl
        todo = [(self._slots(key), self._column(endpoint)) for key, endpoint in pins]
        m = self._map
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            for (digest, at0), col in todo:
                window = m[at0 : at0 + _WINDOW]
                i = _find(window, digest)
                if i < 0:  # a free record, else the one idle longest (expired or not)
                    i = _find(window, _EMPTY)
                    if i >= 0:
                        self._used(1)
                    else:  # (an expired one is counted)
                        i = min(range(0, _WINDOW, _REC.size), key=lambda j: _EXPIRY.unpack_from(window, j + 16)[0])
                _REC.pack_into(m, at0 + i, digest, expiry, col)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def drop(self, key: str) -> None:
        digest, at0 = self._slots(key)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            at = self._locate(digest, at0)
            if at >= 0:
                _REC.pack_into(self._map, at, _EMPTY, 0.0, 0)
                self._used(-1)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def count(self) -> int:
        """Pins held (expired ones count until a lookup or a new pin clears them)."""
        held: int = _HEAD.unpack_from(self._map, 0)[2]
        return held

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)
