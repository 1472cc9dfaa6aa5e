"""What a group of the mock's routes is built on: its route table and the backend it serves from.

The route groups (knobs, metadata, model management, the newer routes) each take the backend
in their constructor and hand `MockBackend` a table of their routes. `Backend` declares what
they read of it, no more, so they depend on this small module and `mock.server` alone
depends on them; `MockBackend` is the one class that implements it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

from .config import MockConfig
from .http import Handler
from .kvcache import PrefixCache

# (method, path) -> the coroutine that answers it
Routes = dict[tuple[str, str], Handler]


class Backend(Protocol):
    """The simulated server as its route groups see it."""

    @property
    def config(self) -> MockConfig:
        """The knobs now in force (model management changes its model list in place)."""

    @property
    def kv(self) -> PrefixCache: ...

    @property
    def requests(self) -> Counter[str]:
        """Requests per route; each route group counts its own."""

    @property
    def errors_injected(self) -> Counter[str]:
        """Faults per kind; the stall and the slow lists count theirs."""

    @property
    def started(self) -> float:
        """When the backend came up (seconds since the epoch)."""

    @property
    def rid_prefix(self) -> str: ...

    @property
    def rid_counter(self) -> Iterator[int]:
        """With `rid_prefix`, makes each response id unique."""

    def check_model(self, model: str) -> None:
        """Raise a 404 unless the backend serves `model`."""

    def reset_stats(self) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def update(self, **changes: Any) -> MockConfig:
        """Change knobs while serving; a bad value raises ValueError or TypeError."""
