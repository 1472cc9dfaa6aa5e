"""The policy interface: pick one endpoint among those with a free slot. Synchronous, no I/O.

A policy may also implement, all optional:
- `pick(ctx, candidates, load) -> (endpoints, wait_s) | None`: asked *before* the store, so
  it can decide to wait up to `wait_s` for a slot on any of `endpoints` when they are full
  (their cache is worth it) instead of taking any free slot. None: let the store pick
  among free slots.
- `routed(ctx, endpoint)`: the request got a slot there (learn where prefixes live).
- `observe(ctx, endpoint, first_s, held_s)`: the backend's time to first byte (streams,
  else None) and how long the request held its slot.
- `wants_prompt = True`: the proxy fills `ctx.prompt` (block keys of the rendered prompt).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ...domain import Endpoint

if TYPE_CHECKING:
    from ..affinity import AffinityKeys
    from ..prefix_index import Prompt


@dataclass
class RouteContext:
    """Everything a policy may look at. New inputs are added here, not to signatures."""

    model: str  # model_key
    api: str  # "ollama" | "openai"
    kind: str  # "chat" | "generate" | "embed" | ...
    keys: AffinityKeys | None = None  # conversation affinity keys, when affinity applies
    prompt: Prompt | None = None  # block keys of the prompt, for prefix-aware policies
    cached_tokens: int | None = None  # prefix the chosen endpoint is believed to hold
    too_small: frozenset[str] | None = None  # endpoints whose context window the request exceeds
    client: str | None = None  # the client key's name: its priority and share of the queue


class Policy(Protocol):
    name: str

    def choose(self, ctx: RouteContext, free: Sequence[Endpoint], in_flight: Callable[[Endpoint], int]) -> Endpoint: ...
