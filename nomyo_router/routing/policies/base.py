"""The policy interface: pick one endpoint among those with a free slot. Synchronous, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ...domain import Endpoint

if TYPE_CHECKING:
    from ..affinity import Keys


@dataclass
class RouteContext:
    """Everything a policy may look at. New inputs are added here, not to signatures."""

    model: str  # model_key
    api: str  # "ollama" | "openai"
    kind: str  # "chat" | "generate" | "embed" | ...
    keys: "Keys | None" = None  # conversation affinity keys, when affinity applies


class Policy(Protocol):
    name: str

    def choose(self, ctx: RouteContext, free: Sequence[Endpoint],
               in_flight: Callable[[Endpoint], int]) -> Endpoint: ...
