"""What one instance holds and waits for in Redis, and how its sweep reconciles Redis with it.

Redis can be wrong about an instance in two ways after a stall or a restart:
- it lacks a lease the instance holds: Redis lost it (restart), it expired while the instance
  could not extend it, or the instance granted it from its local limits while Redis was away;
- it has an entry the instance does not know of (a ghost): an acquire whose reply a stalled
  connection lost ran after all and left a lease or a queue entry; a waiter that moved to the
  local queue left its shared entry; a release or a cancel was lost.

Every sweep (min(1 s, lease_ttl / 3), and at once when Redis answers again) therefore sends
everything the instance knows of — its leases, to extend or add back, and the ids it waits
on — and the SWEEP script drops the rest of the instance's entries (`P:own:<owner>`). Ids
carry a running number, and the sweep only drops ids up to the highest it had handed out when
it was built: an acquire sent a moment later may reach Redis first, and is not a ghost.

One race is closed here rather than in Redis: a lease released while a sweep that lists it is
on its way would be added back by that sweep. Such releases wait for the sweep's reply.

The sweep's reply also brings every endpoint's count over all instances and the shared
queue's length, which the gauges read without a round trip of their own, and how many
instances swept within `lease_ttl` (each takes its share of the slots by it while Redis is
away: redis_local.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .redis_link import Arg


class Ledger:
    def __init__(self, owner: str, instance: str) -> None:
        self.owner = owner  # this process
        self.instance = instance  # its instance: it and the other workers of its supervisor
        self.instances = 0  # live instances, as of the last sweep (0: no sweep answered yet)
        self.seq = 0  # the highest id number handed out
        self.held: dict[str, str] = {}  # lease id -> endpoint: every lease of this instance
        self.waiting: dict[str, asyncio.Future[str | None]] = {}  # queued in Redis, or acquiring
        self.queued = 0  # of `waiting`, those Redis answered "queued"
        self.shared: dict[str, int] = {}  # in flight per endpoint over all instances
        self.shared_queue = 0  # requests in the shared queue, all instances
        self.ghosts = 0  # entries the sweeps removed, since start
        self._sweeping: set[str] | None = None  # lease ids in the sweep on its way
        self._swept: set[str] = set()  # lease ids in the last sweep
        self._deferred: list[tuple[str, str]] = []  # (endpoint, lease id) released meanwhile

    def new_id(self) -> str:
        self.seq += 1
        return f"{self.owner}:{self.seq}"

    # ---- the shared counts, kept current between sweeps by what this instance does ------
    def granted(self, name: str, loads: Sequence[int | bytes] | None = None) -> None:
        """Redis granted a slot on `name`; `loads`: endpoint, count pairs as of the grant."""
        loads = loads or ()
        for i in range(0, len(loads) - 1, 2):
            self.shared[as_str(loads[i])] = int(loads[i + 1])
        self.shared[name] = self.shared.get(name, 0) + 1

    def released(self, name: str) -> None:
        self.shared[name] = max(self.shared.get(name, 0) - 1, 0)

    def enqueued(self) -> None:
        self.queued += 1
        self.shared_queue += 1

    def dequeued(self) -> None:
        self.queued -= 1
        self.shared_queue = max(self.shared_queue - 1, 0)

    # ---- the sweep -------------------------------------------------------------------
    def sweep_args(self) -> list[Arg]:
        """SWEEP's arguments after the prefix and lease time; marks the sweep as on its way."""
        args: list[Arg] = [self.owner, self.seq, self.instance]
        for lid, name in self.held.items():
            args += [name, lid]
        for lid in self.waiting:
            args += ["", lid]
        self._sweeping = self._swept = set(self.held)
        return args

    def all_swept(self) -> bool:
        """Every lease held now was in the last sweep (so Redis counts it)."""
        return self._swept.issuperset(self.held)

    def defer(self, name: str, lid: str) -> bool:
        """True if the release of `lid` must wait for the sweep on its way (which lists it)."""
        if self._sweeping is not None and lid in self._sweeping:
            self._deferred.append((name, lid))
            return True
        return False

    def swept(self, res: Sequence[int | bytes] | None) -> list[tuple[str, str]]:
        """The sweep returned (`res`) or failed (None). The releases it held back: to send now,
        or, if it failed, to leave to the next reconciliation."""
        self._sweeping = None
        deferred, self._deferred = self._deferred, []
        if res is None:
            return []
        self.ghosts += int(res[0])
        self.shared_queue = int(res[1])
        self.instances = int(res[2])
        self.shared = {as_str(res[i]): int(res[i + 1]) for i in range(3, len(res) - 1, 2)}
        for name, _ in deferred:  # still counted in Redis when it answered
            self.released(name)
        return deferred


def as_str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
