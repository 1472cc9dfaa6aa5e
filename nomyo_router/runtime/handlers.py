"""The handlers of the routes off the request path, each an object given what it needs in its
constructor, built (and its module imported) when its route is first asked: a router that
only serves generations never loads model management, the dashboard, usage reports, the
cache's routes, reload or `/api/status`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..api.blobs import Blobs
    from ..api.manage import Manager
    from ..api.status import Status
    from ..batch.routes import BatchRoutes
    from ..cache.routes import CacheRoutes
    from ..ops.dashboard import Dashboard
    from ..ops.reload import Plan, ReloadRoute
    from ..ops.usage.routes import UsageRoutes
    from ..ops.usage.stream import UsageStream
    from ..server.asgi import Receive, Scope, Send
    from .router import Router

# An operator route's handler: a method of one of the objects below.
Route = Callable[["Scope", "Receive", "Send"], Awaitable[None]]


class Handlers:
    """`reload`: the running router's reload, one at a time (reconfigure.Reloads.reload)."""

    def __init__(self, router: Router, reload: Callable[[], Awaitable[Plan | None]]) -> None:
        self._router = router
        self._reload = reload

    @cached_property
    def manager(self) -> Manager:
        from ..api.manage import Manager

        r = self._router
        return Manager(lambda: r.endpoints, lambda: r.config, r.discovery, r.manage_session)

    @cached_property
    def blobs(self) -> Blobs:
        from ..api.blobs import Blobs

        return Blobs(self.manager)

    @cached_property
    def dashboard(self) -> Dashboard:
        from ..ops.dashboard import Dashboard

        r = self._router
        return Dashboard(
            lambda: r.endpoints,
            r.store,
            r.health,
            r.metrics,
            r.history,
            r.usage,
            r.rate_limits,
            r.batches.running if r.batches is not None else None,
        )

    @property
    def usage_stream(self) -> UsageStream:
        return self._router.usage_stream  # (one hub per process: the router holds it)

    @cached_property
    def usage(self) -> UsageRoutes:
        from ..ops.usage.routes import UsageRoutes

        return UsageRoutes(self._router.usage)

    @cached_property
    def cache(self) -> CacheRoutes:
        from ..cache.routes import CacheRoutes

        return CacheRoutes(self._router.cache, self._router.require_admin)

    @cached_property
    def reload(self) -> ReloadRoute:
        from ..ops.reload import ReloadRoute

        r = self._router
        return ReloadRoute(lambda: r.config, self._reload)

    @cached_property
    def status(self) -> Status:
        from ..api.status import Status

        r = self._router
        return Status(lambda: r.endpoints, r.store, r.upstream, r.config.health_timeout)

    @cached_property
    def batch(self) -> BatchRoutes:
        from ..batch.routes import BatchRoutes

        return BatchRoutes(self._router.batches)
