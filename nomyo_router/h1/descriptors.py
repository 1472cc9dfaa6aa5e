"""Running out of file descriptors: the router's own limit, never a backend's fault.

Every client connection and every connection to a backend is a descriptor. When a process
reaches its `RLIMIT_NOFILE`, `connect()` fails with EMFILE (ENFILE: the whole system's table
is full), which looks like an unreachable backend: counted against it, a healthy backend
would be ejected for the router's own shortage. So the upstream client raises
`OutOfDescriptors` instead (the request is answered 503, nothing is ejected), and a line names
the limit, at most once a minute with the count since the last one.

On the accepting side the event loop (libuv) never reports EMFILE: it accepts and closes the
waiting connections itself, so clients see a reset. `runtime/descriptor_watch.py` samples the
open descriptors against the limit and says so the same way.

`raise_soft_limit` lifts the soft limit to the hard one at start (the supervisor's, which the
workers inherit): a default soft limit of 1024 is a few hundred clients.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import time

log = logging.getLogger("nomyo_router.descriptors")

EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE})
WARN_EVERY_S = 60.0
_NR_OPEN = "/proc/sys/fs/nr_open"  # the kernel's ceiling for any process's limit


def limits() -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_soft_limit() -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one; (before, after). An unlimited hard
    limit is taken as the kernel's ceiling."""
    soft, hard = limits()
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open(_NR_OPEN) as f:
                target = int(f.read())
        except (OSError, ValueError):
            return soft, soft
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft, soft
        return soft, target
    return soft, soft


def open_count() -> int:
    """Descriptors this process has open now: all of them (the soft limit) when there is none
    left even to list them; -1 where /proc is not there."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # (the listing's own)
    except OSError as e:
        return limits()[0] if e.errno in EXHAUSTED else -1


class _Shortage:
    """One cause's line, at most once a minute, with how often it happened meanwhile."""

    __slots__ = ("last", "since")

    def __init__(self) -> None:
        self.last = -WARN_EVERY_S
        self.since = 0


_SHORTAGES: dict[str, _Shortage] = {}


def exhausted(where: str, detail: str) -> None:
    """The process ran out of descriptors at `where` ("connect", "accept"); `detail` says on
    what. Logged naming the limit, rate-limited per `where`."""
    shortage = _SHORTAGES.get(where)
    if shortage is None:
        shortage = _SHORTAGES[where] = _Shortage()
    shortage.since += 1
    now = time.monotonic()
    if now - shortage.last < WARN_EVERY_S:
        return
    soft, hard = limits()
    log.warning(
        "out of file descriptors on %s (%s): %d open, RLIMIT_NOFILE soft %d, hard %d; %d such failures since the "
        "last such line. The router's own limit, not counted against any backend: raise it (ulimit -n, systemd "
        "LimitNOFILE=, the container's nofile ulimit)",
        where,
        detail,
        open_count(),
        soft,
        hard,
        shortage.since,
    )
    shortage.last, shortage.since = now, 0
