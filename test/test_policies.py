"""Routing policies, as pure functions of what they are shown."""

from __future__ import annotations

import random
from collections import Counter

from nomyo_router.domain import Endpoint
from nomyo_router.routing.policies import LeastBusy, RouteContext

CTX = RouteContext(model="llama3:latest", api="ollama", kind="chat")


def ep(name: str, slots: int = 4, loaded: bool = True) -> Endpoint:
    return Endpoint(
        name=name, url=f"http://{name}", slots=slots, loaded=frozenset({"llama3:latest"}) if loaded else frozenset()
    )


def test_lowest_in_flight_ratio_wins():
    a, b = ep("a", slots=4), ep("b", slots=8)
    load = {"a": 2, "b": 3}  # 0.5 against 0.375
    assert LeastBusy().choose(CTX, [a, b], lambda e: load[e.name]) is b


def test_an_endpoint_with_the_model_loaded_comes_first():
    cold, warm = ep("cold", loaded=False), ep("warm")
    load = {"cold": 0, "warm": 3}
    assert LeastBusy().choose(CTX, [cold, warm], lambda e: load[e.name]) is warm


def test_ties_are_spread_not_always_the_first():
    eps = [ep("a"), ep("b"), ep("c")]
    policy = LeastBusy(random.Random(1))
    picks = Counter(policy.choose(CTX, eps, lambda e: 0).name for _ in range(300))
    assert set(picks) == {"a", "b", "c"} and min(picks.values()) > 60
