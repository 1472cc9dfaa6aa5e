"""Scheduler state behind one interface: in-flight counts, the wait queue, health."""

from .base import Ask, Lease, NoEndpoint, QueueFull, QueueTimeout, Rehome, StateStore
from .memory import MemoryStore
from .shared import SharedStore

__all__ = [
    "Ask",
    "Lease",
    "MemoryStore",
    "NoEndpoint",
    "QueueFull",
    "QueueTimeout",
    "Rehome",
    "SharedStore",
    "StateStore",
]
