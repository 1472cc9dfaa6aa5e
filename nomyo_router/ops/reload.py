"""Re-read the config without a restart: SIGHUP, or `POST /admin/reload` with the admin key.

What changes at once, in every worker, without touching requests in flight:
- endpoints added (discovered before they are routable, so they take traffic at once),
  removed (out of routing and `/health` at once, with 0 slots: what they hold finishes,
  nothing new goes there), resized (`max_concurrent`; freed slots go to waiting requests), or
  changed (a new `url`, `type`, `api_key` or `models`: removed and added again); requests
  waiting in the queue move with it, in their order (`Scheduler.reindex`, `StateStore.rehome`):
  onto endpoints it added, off those it removed, answered at once if none serves their model;
- keys (`router_api_key`, `client_keys`, `admin_key`), `allowed_origins`, `access_log`,
  `log_format`, `max_body_bytes`, `retry_after`.
Any other key that changed is reported as needing a restart (it is not applied); an
invalid file is rejected with the reason, logged, and the running config kept.

Workers: `nomyo-router --workers N` runs a supervisor that validates the file on SIGHUP and
then sends SIGHUP to each worker (see cli.py), so every worker applies the same file; a
worker handling `POST /admin/reload` validates it too and asks the supervisor to do that.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

import msgspec

from ..api import access
from ..config import CONFIG_ENV, SUPERVISOR_ENV, ConfigError, EndpointConfig, RouterConfig, load_config
from ..domain import Endpoint
from ..state.fair import specs_of
from .accesslog import AccessLog

log = logging.getLogger("nomyo_router.reload")

# (max_concurrent_connections is every endpoint's default slot count: a change resizes them)
LIVE_KEYS = frozenset(
    (
        "endpoints",
        "router_api_key",
        "client_keys",
        "admin_key",
        "metrics_key",
        "allowed_origins",
        "access_log",
        "log_format",
        "max_body_bytes",
        "retry_after",
        "max_concurrent_connections",
    )
)


def config_path() -> str:
    return os.environ.get(CONFIG_ENV, "config.yaml")


def _backend(cfg: EndpointConfig) -> tuple[str, str | None, str | None, str | None, tuple[str, ...] | None]:
    """What makes an endpoint the same backend; a change means remove and add again."""
    return cfg.url, cfg.type, cfg.api_key, cfg.basic_auth, cfg.models


def plan(old: RouterConfig, new: RouterConfig) -> dict[str, Any]:
    """What a reload from `old` to `new` would do."""
    before = {e.name: e for e in old.endpoints}
    after = {e.name: e for e in new.endpoints}
    changed = [n for n in after if n in before and _backend(after[n]) != _backend(before[n])]
    return {
        "added": sorted(set(after) - set(before)),
        "removed": sorted(set(before) - set(after)),
        "changed": sorted(changed),
        "resized": {
            n: [before[n].max_concurrent, after[n].max_concurrent]
            for n in sorted(after)
            if n in before and n not in changed and before[n].max_concurrent != after[n].max_concurrent
        },
        "restart_needed": sorted(
            f.name
            for f in msgspec.structs.fields(RouterConfig)
            if f.name not in LIVE_KEYS and getattr(old, f.name) != getattr(new, f.name)
        ),
    }


async def apply(router: Any, new: RouterConfig) -> dict[str, Any]:
    """Apply `new` to the running `router` (one process). Returns the plan it carried out."""
    done = plan(router.config, new)
    old_cfg = {e.name: e for e in router.config.endpoints}
    current = {e.name: e for e in router.endpoints}
    endpoints: list[Endpoint] = []
    fresh: list[Endpoint] = []
    for cfg in new.endpoints:
        ep = current.get(cfg.name)
        if ep is not None and cfg.name in old_cfg and _backend(cfg) == _backend(old_cfg[cfg.name]):
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


async def reload(router: Any) -> dict[str, Any]:
    """Re-read the file this process was started with and apply it; raises ConfigError."""
    try:
        new = await asyncio.to_thread(load_config, config_path())
    except ConfigError as e:
        log.error("config reload rejected, keeping the running config: %s", e)
        raise
    return await apply(router, new)


_running: set[asyncio.Task[None]] = set()


def install(router: Any) -> None:
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


def _on_sighup(router: Any) -> None:
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


async def admin_reload(app: Any, scope: Any, receive: Any, send: Any, t0: float) -> None:
    """POST /admin/reload (admin key): validate, then reload this process or every worker."""
    import json

    from ..api.asgi import send_response
    from ..api.errors import ApiError

    router = app.current()
    client = scope.get("nomyo.client")
    if router.config.admin_key is None:
        raise ApiError(403, "set admin_key in the config to allow POST /admin/reload (or send SIGHUP)")
    if client is None or client.name != "admin":
        raise ApiError(403, "POST /admin/reload needs the admin key")
    try:
        new = await asyncio.to_thread(load_config, config_path())
    except ConfigError as e:
        log.error("config reload rejected, keeping the running config: %s", e)
        raise ApiError(400, f"config rejected, the running one stays: {e}") from None
    supervisor = os.environ.get(SUPERVISOR_ENV)
    if supervisor:  # every worker must apply it: the supervisor signals them all
        os.kill(int(supervisor), signal.SIGHUP)
        body = {"status": "reloading", "workers": "all", **plan(router.config, new)}
    else:
        body = {"status": "reloaded", **await apply(router, new)}
    await send_response(send, 200, json.dumps(body).encode())


ROUTES = {("POST", "/admin/reload"): admin_reload}
