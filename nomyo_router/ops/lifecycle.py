"""Workers live and die with their supervisor (`nomyo-router --workers N`).

A worker whose supervisor is gone is an orphan: nobody restarts it, nobody stops it, and it
keeps the listening port, so the next router fails with "address already in use". Every
worker therefore binds its life to the supervisor as it starts, in its main thread:

- the kernel sends it SIGTERM when the supervisor dies (Linux `prctl(PR_SET_PDEATHSIG)`);
  the supervisor forks every worker from its main thread, which is the thread that signal
  follows;
- a supervisor that died before the signal was armed is seen at once (the parent pid is no
  longer the supervisor's) and the worker does not start;
- a watcher thread compares the parent pid with the supervisor's twice a second: where
  prctl is missing it sends the SIGTERM itself, everywhere it ends the process if the
  graceful shutdown has not finished in time.

A SIGTERM that arrives while the supervisor is gone shortens the graceful shutdown to
`ORPHAN_GRACE_S` (streams in flight are cut after that; nobody would serve the clients'
next requests on this port anyway), so the whole tree is gone within about 2.5 seconds. A
SIGTERM from a living supervisor keeps the configured `shutdown_grace`.

The multiprocessing resource tracker the supervisor starts needs none of this: it ends when
the last process holding its pipe (the supervisor and the workers) is gone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from socket import socket
from types import FrameType
from typing import Any, Protocol

from uvicorn.config import Config
from uvicorn.supervisors import multiprocess

log = logging.getLogger("nomyo_router.lifecycle")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_S = 0.5  # how often the watcher looks at the parent pid
ORPHAN_GRACE_S = 1.0  # graceful shutdown of an orphaned worker (instead of shutdown_grace)
ORPHAN_DEADLINE_S = 2.0  # after the watcher saw the supervisor gone, the process ends regardless


class _Graceful(Protocol):
    timeout_graceful_shutdown: int | None


class Exiting(Protocol):
    """What this module uses of a uvicorn `Server`: its exit handler and its config's grace."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None: ...

    @property
    def config(self) -> _Graceful: ...


def arm_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` when the parent (thread) dies; False where there is no
    prctl (not Linux, no libc) — the watcher then does the same, up to WATCH_S later."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc: int = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        return rc == 0
    except (OSError, AttributeError):
        return False


def bind_to_parent(parent: int, server: Exiting) -> None:
    """Call first thing in a worker's main thread. `server` is its uvicorn Server: its exit
    handler learns to shorten the graceful shutdown of an orphan."""
    armed = arm_parent_death_signal()
    if os.getppid() != parent:  # it died before the signal was armed: serve nothing
        raise SystemExit(f"nomyo-router: worker {os.getpid()}: supervisor {parent} is gone; not starting")
    orphan_aware_exit(parent, server)
    threading.Thread(target=_watch, args=(parent, armed), name="nomyo-parent-watch", daemon=True).start()


def orphan_aware_exit(parent: int, server: Exiting) -> None:
    """uvicorn installs `server.handle_exit` for SIGTERM and SIGINT when it starts serving;
    this wraps it. When the signal comes and the supervisor is gone (the kernel reparents
    the worker before it sends the death signal), the shutdown waits ORPHAN_GRACE_S at most."""
    original = server.handle_exit

    def handle_exit(sig: int, frame: FrameType | None) -> None:
        if os.getppid() != parent:
            config = server.config
            grace = config.timeout_graceful_shutdown  # (None: uvicorn would wait for ever)
            short = ORPHAN_GRACE_S if grace is None else min(grace, ORPHAN_GRACE_S)
            setattr(config, "timeout_graceful_shutdown", short)  # noqa: B010  (declared int; any seconds work)
        original(sig, frame)

    setattr(server, "handle_exit", handle_exit)  # noqa: B010  (a method, replaced: what uvicorn's signal handler calls)


def _watch(parent: int, armed: bool) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    _say(logging.WARNING, "worker %d: the supervisor (pid %d) is gone; shutting down", os.getpid(), parent)
    if not armed:
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_DEADLINE_S)
    # Still here: the graceful shutdown hangs (a flush waiting on a lock, a stuck task).
    # What it did not remove, the next router's start-up removes (ops/private_dir_cleanup.py).
    _say(
        logging.ERROR,
        "worker %d: shutdown did not finish within %.1fs of the supervisor's death; exiting",
        os.getpid(),
        ORPHAN_DEADLINE_S,
    )
    time.sleep(0.05)
    os._exit(1)


def _say(level: int, msg: str, *args: Any) -> None:
    """Log from a thread of its own: a log handler blocked (a full stderr pipe, a lock held by
    the stuck main thread) must not keep the watcher from ending the process."""
    threading.Thread(target=log.log, args=(level, msg, *args), daemon=True).start()


class WorkerProcess(multiprocess.Process):
    """uvicorn's worker, bound to the supervisor that made it (see the module docstring)."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        self.parent_pid = os.getpid()  # pickled into the child with the rest of this object
        super().__init__(config, sockets)

    def target(self, sockets: list[socket] | None = None) -> None:  # pragma: no cover (child)
        bind_to_parent(self.parent_pid, self.server)
        super().target(sockets)


def use_bound_workers() -> None:
    """uvicorn's supervisor builds its workers from its module's `Process` in four places
    (start, replace a dead one, restart, add one); pointing that name at `WorkerProcess` is
    the one hook that reaches all of them. Called in the supervisor only."""
    multiprocess.Process = WorkerProcess  # type: ignore[misc]
