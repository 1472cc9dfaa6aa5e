"""Routing policies, one per module, behind `Policy`; `POLICIES` maps config names to them."""

from .base import Policy, RouteContext
from .least_busy import LeastBusy

POLICIES: dict[str, type[Policy]] = {"least_busy": LeastBusy}

__all__ = ["POLICIES", "LeastBusy", "Policy", "RouteContext"]
