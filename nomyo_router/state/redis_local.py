"""What RedisStore serves from while Redis is away: this instance's one table.

An instance is one `nomyo-router` (one process, or a supervisor and its `--workers N`). While
Redis answers it alone grants slots; every grant is also counted here. When Redis goes away
(dead, stalled, partitioned), the instance's requests are admitted here instead, so that:

- its workers share one table, exactly as without Redis (`WorkerStore`: the slot table in
  shared memory and the elected host's queue), instead of each worker counting alone;
- it takes its share of each endpoint: the endpoint's slots divided by the instances Redis
  last knew of (each sweep reports how many instances swept within `lease_ttl`), at least
  one, so that the instances together stay within the endpoint's slots;
- the slots its workers already hold count against that share.

The price: while Redis is away an instance cannot lend its idle share to a busy one, and an
instance that starts during an outage has never heard of the others and takes every slot
(docs/deployment.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..domain import Endpoint
from .base import Ask, Choose, Lease, QueueTimeout, Rehome
from .memory import MemoryStore
from .queue_order import Fair
from .slots import share_of
from .worker_store import WorkerStore


class ProcessTable(MemoryStore):
    """The fallback of an instance of one process."""

    instances = 1

    def _free(self, ep: Endpoint) -> bool:
        return ep.name not in self._unhealthy and self._in_flight.get(ep.name, 0) < share_of(ep.slots, self.instances)

    def count(self, endpoint: Endpoint) -> None:
        """A slot Redis granted: counted here too (the limit while Redis is away)."""
        self._take(endpoint)

    def own(self, endpoint: Endpoint) -> int:
        """Slots this process holds on `endpoint`."""
        return self.in_flight(endpoint)

    def share_by(self, instances: int) -> None:
        self.instances = instances


class HostTable(WorkerStore):
    """The fallback of an instance of several workers: the table they share anyway."""

    def count(self, endpoint: Endpoint) -> None:
        """A slot Redis granted this worker, counted in its row of the shared table."""
        self._table.add(endpoint.name)

    def own(self, endpoint: Endpoint) -> int:
        """Slots this worker holds on `endpoint` (the other workers' are theirs)."""
        return self._table.own(endpoint.name)

    def share_by(self, instances: int) -> None:
        """Written in the shared table: every worker and the host's queue read it."""
        self._table.share_by(instances)


LocalTable = ProcessTable | HostTable


async def wait_locally(
    local: LocalTable,
    back: asyncio.Event,
    model: str,
    candidates: Sequence[Endpoint],
    choose: Choose,
    timeout: float,
    fair: Fair | None,
) -> Lease | None:
    """A slot from `local`, or None if Redis answers again first (`back` is set)."""
    task = asyncio.ensure_future(
        local.acquire(Ask(model=model, candidates=candidates, choose=choose, timeout=timeout, fair=fair))
    )
    came_back = asyncio.ensure_future(back.wait())
    try:
        await asyncio.wait((task, came_back), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the client went away
        came_back.cancel()
        task.cancel()
        await asyncio.wait((task,))
        if not task.cancelled() and task.exception() is None:
            task.result().release()  # the slot came just before
        raise
    came_back.cancel()
    if not task.done():
        task.cancel()  # the table passes on a slot handed over just as it gave up
        await asyncio.wait((task,))
    if task.cancelled():
        return None
    try:
        return task.result()
    except QueueTimeout:
        raise QueueTimeout(model) from None  # a local place means nothing in Redis
    except Rehome as e:
        raise Rehome(model, None, e.waited) from None
