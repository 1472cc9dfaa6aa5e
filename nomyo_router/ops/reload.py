"""Re-read the config without a restart: SIGHUP, or `POST /admin/reload` with the admin key.

What changes at once, in every worker, without touching requests in flight:
- endpoints added (discovered before they are routable, so they take traffic at once),
  removed (out of routing and `/health` at once, with 0 slots: what they hold finishes,
  nothing new goes there), resized (`max_concurrent`; freed slots go to waiting requests), or
  changed (a new `url`, `type`, `api_key` or `models`: removed and added again); requests
  waiting in the queue move with it, in their order (`Scheduler.reindex`, `StateStore.rehome`):
  onto endpoints it added, off those it removed, answered at once if none serves their model;
- keys (`router_api_key`, `client_keys`, `admin_key`), `allowed_origins`, `allowed_hosts`,
  `access_log`, `log_format`, `max_body_bytes`, `retry_after`.
Any other key that changed is reported as needing a restart (it is not applied); an
invalid file is rejected with the reason, logged, and the running config kept. Reloads run
one at a time in the order asked for, and one still waiting when a later one is asked for
is dropped (`runtime/reconfigure.Reloads`): the last file read is the one in force. Here: what a
reload may change and its plan, reading the file, and the route; the new config is applied
to the running router's components by the wiring that built them (`runtime/reconfigure.py`),
which also handles SIGHUP.

Workers: `nomyo-router --workers N` runs a supervisor that validates the file on SIGHUP and
then sends SIGHUP to each worker (see cli.py), so every worker applies the same file; a
worker handling `POST /admin/reload` validates it too and asks the supervisor to do that.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TypedDict

import msgspec

from ..api.errors import ApiError
from ..config import CONFIG_ENV, SUPERVISOR_ENV, ConfigError, EndpointConfig, RouterConfig, load_config
from ..server.asgi import Receive, Scope, Send, send_response

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
        "allowed_hosts",
        "access_log",
        "log_format",
        "max_body_bytes",
        "retry_after",
        "max_concurrent_connections",
    )
)


def config_path() -> str:
    return os.environ.get(CONFIG_ENV, "config.yaml")


def backend(cfg: EndpointConfig) -> tuple[str, str | None, str | None, str | None, tuple[str, ...] | None]:
    """What makes an endpoint the same backend; a change means remove and add again."""
    return cfg.url, cfg.type, cfg.api_key, cfg.basic_auth, cfg.models


class Plan(TypedDict):
    """What a reload does: endpoints by name, and the keys it cannot change live."""

    added: list[str]
    removed: list[str]
    changed: list[str]
    resized: dict[str, list[int]]  # name: [before, after] max_concurrent
    restart_needed: list[str]


def plan(old: RouterConfig, new: RouterConfig) -> Plan:
    """What a reload from `old` to `new` would do."""
    before = {e.name: e for e in old.endpoints}
    after = {e.name: e for e in new.endpoints}
    changed = [n for n in after if n in before and backend(after[n]) != backend(before[n])]
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


def read() -> RouterConfig:
    """The file this process was started with, validated; a rejected one is logged (raises
    ConfigError): the running config stays."""
    try:
        return load_config(config_path())
    except ConfigError as e:
        log.error("config reload rejected, keeping the running config: %s", e.one_line)
        raise


class ReloadRoute:
    """`POST /admin/reload` (admin key): reload this process (`reload`: reads the file in its
    turn, after any reload asked for earlier) or, under a supervisor, validate the file and
    have the supervisor signal every worker."""

    def __init__(self, config: Callable[[], RouterConfig], reload: Callable[[], Awaitable[Plan | None]]) -> None:
        self.config = config  # (the running one: a reload replaces it)
        self.reload = reload

    async def admin_reload(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("nomyo.client")
        if self.config().admin_key is None:
            raise ApiError(403, "set admin_key in the config to allow POST /admin/reload (or send SIGHUP)")
        if client is None or client.name != "admin":
            raise ApiError(403, "POST /admin/reload needs the admin key")
        supervisor = os.environ.get(SUPERVISOR_ENV)
        try:
            if supervisor:  # every worker must apply it: the supervisor signals them all
                new = await asyncio.to_thread(read)
                os.kill(int(supervisor), signal.SIGHUP)
                body: dict[str, object] = {"status": "reloading", "workers": "all", **plan(self.config(), new)}
            else:
                done = await self.reload()
                # (None: a reload asked for after this one replaced it while it waited)
                body = {"status": "reloaded", **done} if done is not None else {"status": "superseded"}
        except ConfigError as e:
            raise ApiError(400, f"config rejected, the running one stays: {e.one_line}") from None
        await send_response(send, 200, json.dumps(body).encode())
