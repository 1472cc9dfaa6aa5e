"""Scheduler state behind one interface: in-flight counts, the wait queue, health."""

from .base import Ask, Lease, NoEndpoint, QueueFull, QueueTimeout, Rehome, StateStore
from .memory import MemoryStore
from .worker_store import WorkerStore

__all__ = [
    "Ask",
    "Lease",
    "MemoryStore",
    "NoEndpoint",
    "QueueFull",
    "QueueTimeout",
    "Rehome",
    "WorkerStore",
    "StateStore",
]
