"""The policy interface: pick one endpoint among those with a free slot. Synchronous, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ...domain import Endpoint


@dataclass
class RouteContext:
    """Everything a policy may look at. New inputs are added here, not to signatures."""

    model: str  # model_key
    api: str  # "ollama" | "openai"
    kind: str  # "chat" | "generate" | "embed" | ...


class Policy(Protocol):
    name: str

    def choose(self, ctx: RouteContext, free: Sequence[Endpoint],
               in_flight: Callable[[Endpoint], int]) -> Endpoint: ...
