"""Start-up and shutdown of one router process (the ASGI lifespan's two halves)."""

from __future__ import annotations

import logging
import os
import sys

from ..config import CONFIG_ENV, ConfigError, RouterConfig, load_config
from ..ops import logformat
from ..ops.preflight import PathProblem
from . import reconfigure
from .handlers import Handlers
from .router import Router

log = logging.getLogger("nomyo_router")


class Running:
    """A started router with what serves it from outside: its reloads, one at a time (SIGHUP
    and `POST /admin/reload`), and the operator routes' handlers, each built when first asked."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.reloads = reconfigure.Reloads(router)
        self.handlers = Handlers(router, self.reloads.reload)


async def startup(config: RouterConfig | None) -> Running | str:
    """The started router (`config`, else the file NOMYO_ROUTER_CONFIG names), or why it could
    not start: start-up fails loudly, never half-started."""
    try:
        config = config or load_config(os.environ.get(CONFIG_ENV, "config.yaml"))
        logformat.fallback(config.log_format)
        router = Router(config)
        await router.start()
        running = Running(router)
        reconfigure.install(running.reloads)  # SIGHUP reloads the config
    except ConfigError as e:
        print(f"nomyo-router: bad config: {e.one_line}", file=sys.stderr, flush=True)
        return e.one_line
    except PathProblem as e:  # a file the config names: one line (uvicorn logs it), no traceback
        return str(e)
    except Exception as e:
        log.exception("start-up failed")
        return f"{type(e).__name__}: {e}"
    return running


async def shutdown(running: Running | None) -> None:
    if running is not None:
        reconfigure.uninstall()
        await running.router.close()
