"""Least busy: the lowest in-flight/slots ratio, preferring endpoints that have the model
loaded; ties are broken at random so no replica is always first."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from ...domain import Endpoint
from .base import RouteContext


class LeastBusy:
    name = "least_busy"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._random = (rng or random.Random()).random

    def choose(self, ctx: RouteContext, free: Sequence[Endpoint], in_flight: Callable[[Endpoint], int]) -> Endpoint:
        model, rand = ctx.model, self._random
        return min(free, key=lambda e: (model not in e.loaded, in_flight(e) / e.slots, rand()))
