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
from ..config import ConfigError, RouterConfig
from ..domain import Endpoint
from ..ops import logformat
from ..ops.accesslog import AccessLog
from ..ops.reload import LIVE_KEYS, Plan, backend, plan, read
from ..state.fair import specs_of

if TYPE_CHECKING:
    from .router import Router

log = logging.getLogger("nomyo_router.reload")


async def apply(router: Router, new: RouterConfig) -> Plan:
    """Apply `new` to the running `router` (one process). Returns the plan it carried out."""
    done = plan(router.config, new)
    old_cfg = {e.name: e for e in router.config.endpoints}
    current = {e.name: e for e in router.endpoints}
    endpoints: list[Endpoint] = []
    fresh: list[Endpoint] = []
    for cfg in new.endpoints:
        ep = current.get(cfg.name)
        if ep is not None and cfg.name in old_cfg and backend(cfg) == backend(old_cfg[cfg.name]):
            ep.slots = cfg.max_concurrent
            ep.context_length = cfg.context_length
        else:
            ep = Endpoint.from_config(cfg)
            fresh.append(ep)
        endpoints.append(ep)
    gone = [ep for ep in router.endpoints if ep not in endpoints]
    for ep in gone:
        ep.slots = 0  # finishes what it holds, gets nothing new
    index = getattr(router.scheduler.policy, "index", None)
    for cfg in new.endpoints:
        if index is not None and hasattr(index, "set_capacity"):
            index.set_capacity(cfg.name, cfg.kv_cache_tokens)
    if fresh and router.discovery is not None:  # models known before the endpoint is routable
        await asyncio.gather(*(router.discovery.refresh_endpoint(ep) for ep in fresh))
    router.endpoints = endpoints
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


_running: set[asyncio.Task[None]] = set()


def install(router: Router) -> None:
    """SIGHUP reloads (called in the lifespan; the main thread's loop only)."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _on_sighup, router)
    except (RuntimeError, ValueError, NotImplementedError):  # not the main thread (tests), not Unix
        log.debug("SIGHUP reload not available in this thread")


def uninstall() -> None:
    try:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
    except (RuntimeError, ValueError, NotImplementedError):
        pass


def _on_sighup(router: Router) -> None:
    async def run() -> None:
        try:
            await reload(router)
        except ConfigError:
            pass  # logged; the old config stays
        except Exception:
            log.exception("config reload failed; the running config stays")

    task = asyncio.get_running_loop().create_task(run())
    _running.add(task)
    task.add_done_callback(_running.discard)
