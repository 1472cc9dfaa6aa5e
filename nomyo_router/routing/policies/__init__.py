"""Routing policies, one per module, behind `Policy`; `POLICIES` maps config names to them."""

from .base import Policy, RouteContext
from .cache_aware import CacheAware
from .least_busy import LeastBusy
from .sglang import SGLangCacheAware

POLICIES: dict[str, type] = {"cache_aware": CacheAware, "least_busy": LeastBusy,
                             "sglang": SGLangCacheAware}



def make_policy(name: str, kv_cache_tokens: dict[str, int] | None = None) -> Policy:
    """The policy named in config (`routing`); prefix-aware ones get each endpoint's KV size."""
    if name == "cache_aware":
        from ..prefix_index import PrefixIndex
        return CacheAware(PrefixIndex(kv_cache_tokens))
    return POLICIES[name]()


__all__ = ["POLICIES", "CacheAware", "LeastBusy", "Policy", "RouteContext", "SGLangCacheAware", "make_policy"]
