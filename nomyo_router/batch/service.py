"""The Batch API's one object per process: its store, its runner, its /metrics lines; built by
the wiring (`runtime/router.py`) when `batch.enabled`, started after discovery."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily

from ..config import RouterConfig
from ..domain import Endpoint, model_key
from ..events import Events
from ..relay.exchange import Handle
from ..state import StateStore
from ..state.key_limits import Limits
from ..state.redis_url import is_redis
from . import objects
from .base import BatchStore
from .runner import Runner


class Batches:
    def __init__(
        self,
        config: RouterConfig,
        forward: Handle,
        state: StateStore,
        endpoints: Callable[[], list[Endpoint]],
        events: Events,
        limits: Callable[[str], Limits | None],
        models: Callable[[str], Sequence[str] | None],
    ) -> None:
        """`limits(client)`: the key's rate limits (its tokens_per_day is what batch lines count
        against), None for a key without; `models(client)`: the models the key may use as the
        config says now (None: any)."""
        self.settings = config.batch
        self.store = make_store(config)
        self._models = models
        self._limits = limits
        self._state = state
        self.runner = Runner(
            self.store, forward, state, endpoints, events, config.batch, self.may_use, self.budget_spent
        )

    def may_use(self, owner: str, key: str) -> bool:
        models = self._models(owner)
        return not models or key in {model_key(m) for m in models}

    async def budget_spent(self, owner: str) -> bool:
        limits = self._limits(owner)
        if limits is None or limits.tokens_per_day is None:
            return False
        v = await self._state.admit(owner, limits, count=False)
        return v.day_tokens >= limits.tokens_per_day

    async def start(self) -> None:
        await self.store.open()
        self.runner.start()

    async def close(self) -> None:
        await self.runner.stop()
        await self.store.close()

    async def running(self) -> list[dict[str, object]]:
        """The batches running now, for the dashboard: id, client, endpoint, status, counts."""
        out: list[dict[str, object]] = []
        for b in await self.store.active():
            counts = objects.request_counts(await self.store.counts(b["id"]))
            out.append(
                {"id": b["id"], "client": b["_owner"], "endpoint": b["endpoint"], "status": b["status"], **counts}
            )
        return out

    def gauges(self) -> Iterable[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "nomyo_router_batch_lines",
            "Batch lines kept, by model and state (queued, running, done, failed); running: on this process",
            labels=["model", "state"],
        )
        running = self.runner.running
        for model, state, n in self.runner.counts:
            if state == "queued":
                n -= running.get(model, 0)
            g.add_metric([model, state], max(n, 0))
        for model, n in running.items():
            g.add_metric([model, "running"], n)
        yield g


def make_store(config: RouterConfig) -> BatchStore:
    """In Redis with `state: redis://` (every instance shares it), else the SQLite file."""
    if is_redis(config.state):
        from .redis_store import RedisBatches

        return RedisBatches(config.state, config.redis_timeout)
    from .sqlite_store import SqliteAnswerStore

    return SqliteAnswerStore(config.batch.path)
