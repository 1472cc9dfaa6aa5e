"""A new config applied to the running router, in this process: what `POST /admin/reload`
and SIGHUP do (what changes, and what needs a restart: `ops/reload.py`).

Applying reaches into most components (endpoints, keys, limits, the access log), so it lives
with the wiring that built them.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING

import msgspec

from ..api import access
from ..config import ConfigError, EndpointConfig, RouterConfig
from ..domain import Endpoint
from ..ops import logformat
from ..ops.accesslog import AccessLog
from ..ops.reload import LIVE_KEYS, Plan, backend, plan, read
from ..state.queue_order import specs_of

if TYPE_CHECKING:
    from .router import Router

log = logging.getLogger("nomyo_router.reload")


async def apply(router: Router, new: RouterConfig) -> Plan:
    """Apply `new` to the running `router` (one process). Returns the plan it carried out.

    What it waits for (the discovery of the endpoints it adds, and their context windows)
    comes first; nothing of the running router changes until then, so a reload cancelled
    while it waits (`Reloads`: a later one superseded it) leaves no trace. The rest runs
    without yielding to the event loop: a request sees the old config or the new, never a mix."""
    done = plan(router.config, new)
    old_cfg = {e.name: e for e in router.config.endpoints}
    current = {e.name: e for e in router.endpoints}
    kept: list[tuple[Endpoint, EndpointConfig]] = []
    fresh: list[Endpoint] = []
    endpoints: list[Endpoint] = []
    for cfg in new.endpoints:
        ep = current.get(cfg.name)
        if ep is not None and cfg.name in old_cfg and backend(cfg) == backend(old_cfg[cfg.name]):
            kept.append((ep, cfg))
        else:
            ep = Endpoint.from_config(cfg)
            fresh.append(ep)
        endpoints.append(ep)
    if fresh and router.discovery is not None:  # models known before the endpoint is routable
        await asyncio.gather(*(router.discovery.refresh_endpoint(ep) for ep in fresh))
    if fresh and router.windows is not None:  # and their context windows
        await router.windows.fetch(fresh)
    for ep, cfg in kept:
        ep.slots = cfg.max_concurrent
        ep.context_length = cfg.context_length
    gone = [ep for ep in router.endpoints if ep not in endpoints]
    for ep in gone:
        ep.slots = 0  # finishes what it holds, gets nothing new
    index = getattr(router.scheduler.policy, "index", None)
    for cfg in new.endpoints:
        if index is not None and hasattr(index, "set_capacity"):
            index.set_capacity(cfg.name, cfg.kv_cache_tokens)
    router.endpoints = endpoints
    if router.windows is not None:
        router.windows.compute(endpoints)
    router.store.update_endpoints([*endpoints, *gone])
    router.scheduler.set_endpoints(endpoints)
    router.health.endpoints = endpoints
    if router.discovery is not None:
        router.discovery.endpoints = list(endpoints)
    router.keys = access.keys_of(new)
    router.client_limits.caps = access.caps_of(new)
    router.rate_limits.apply(new)
    router.scheduler.fair = specs_of(new.client_keys)
    router.origins = access.Origins(new.allowed_origins)
    router.hosts = access.Hosts(new.allowed_hosts)
    if new.access_log != router.config.access_log or new.log_format != router.config.log_format:
        router.events.off_request_done(router.access_log.write if router.access_log else None)
        router.access_log = AccessLog(router.events, new.log_format) if new.access_log else None
        logformat.use(new.log_format)
    live = msgspec.structs.replace(router.config, **{k: getattr(new, k) for k in LIVE_KEYS})
    router.config = live
    if router.proxy is not None:
        router.proxy.config = live
    log.warning(
        "config reloaded: added %s, removed %s, changed %s, resized %s%s",
        done["added"] or "-",
        done["removed"] or "-",
        done["changed"] or "-",
        done["resized"] or "-",
        f"; needs a restart to change: {', '.join(done['restart_needed'])}" if done["restart_needed"] else "",
    )
    return done


async def reload(router: Router) -> Plan:
    """Re-read the file this process was started with and apply it; raises ConfigError."""
    return await apply(router, await asyncio.to_thread(read))


class Reloads:
    """One reload at a time, in the order they were asked for (SIGHUP, `POST /admin/reload`),
    each reading the file when its turn comes, so the last file read is the one in force.

    A reload asked for while an earlier one still waits (reading the file, or discovering an
    endpoint it adds, which may take a backend's timeout) cancels the earlier one: it was
    going to be replaced anyway, and applying it after the later one would leave the older
    file in force. The earlier one has changed nothing yet (`apply` changes the running
    router only after its waits) and answers `None`: superseded."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._lock = asyncio.Lock()  # (FIFO: waiters get it in the order they asked)
        self._asked = 0  # reloads asked for so far; the last one's number is in force
        self._waiting: asyncio.Task[Plan] | None = None  # the reload now waiting, if any

    def ask(self) -> int:
        """Note a reload asked for now (in the order of the signals or calls), superseding
        one that still waits; returns its turn for `run`."""
        self._asked += 1
        if self._waiting is not None:
            self._waiting.cancel()
        return self._asked

    async def run(self, turn: int) -> Plan | None:
        """Carry out the reload `ask` numbered `turn`: its plan, or None when a later one
        superseded it. Raises ConfigError (the file was rejected; logged, the config stays)."""
        async with self._lock:
            if turn != self._asked:
                return None  # a later one is queued behind this one and reads the file itself
            task = asyncio.get_running_loop().create_task(reload(self.router))
            self._waiting = task
            try:
                return await task
            except asyncio.CancelledError:
                if task.cancelled() and turn != self._asked:
                    log.warning("config reload superseded by a later one while it waited; nothing of it applied")
                    return None
                raise
            finally:
                self._waiting = None

    async def reload(self) -> Plan | None:
        return await self.run(self.ask())


_running: set[asyncio.Task[None]] = set()


def install(reloads: Reloads) -> None:
    """SIGHUP reloads (called in the lifespan; the main thread's loop only)."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _on_sighup, reloads)
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (tests), not Unix
        log.debug("SIGHUP reload not available in this thread")


def uninstall() -> None:
    try:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
    except (RuntimeError, ValueError, NotImplementedError):
        pass


def _on_sighup(reloads: Reloads) -> None:
    turn = reloads.ask()  # now, in the order the signals came

    async def run() -> None:
        try:
            await reloads.run(turn)
        except ConfigError:
            pass  # logged; the old config stays
        except Exception:
            log.exception("config reload failed; the running config stays")

    task = asyncio.get_running_loop().create_task(run())
    _running.add(task)
    task.add_done_callback(_running.discard)
