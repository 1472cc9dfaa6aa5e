"""Routing policies, one per module, behind `Policy`; `POLICIES` maps config names to them."""

from collections.abc import Callable, Sequence

from ...domain import Endpoint
from ...state.base import Picker
from .base import Policy, RouteContext
from .cache_aware import CacheAware
from .least_busy import LeastBusy
from .sglang import SGLangCacheAware

POLICIES: dict[str, type[Policy]] = {"cache_aware": CacheAware, "least_busy": LeastBusy, "sglang": SGLangCacheAware}


def picker(policy: Policy) -> Picker:
    """`policy` as the shared-state host asks for a choice: by model alone."""

    def pick(model: str, free: Sequence[Endpoint], in_flight: Callable[[Endpoint], int]) -> Endpoint:
        return policy.choose(RouteContext(model=model, api="", kind=""), free, in_flight)

    return pick


def make_policy(name: str, kv_cache_tokens: dict[str, int] | None = None) -> Policy:
    """The policy named in config (`routing`); prefix-aware ones get each endpoint's KV size."""
    if name == "cache_aware":
        from ..prefix_index import PrefixIndex

        return CacheAware(PrefixIndex(kv_cache_tokens))
    return POLICIES[name]()


__all__ = ["POLICIES", "CacheAware", "LeastBusy", "Policy", "RouteContext", "SGLangCacheAware", "make_policy", "picker"]
