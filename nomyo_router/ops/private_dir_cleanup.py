"""What a multi-worker router leaves in its private directory, and who removes it.

`nomyo-router --workers N` (its supervisor, pid P) creates in the private directory of
`state/private.py` (on tmpfs: `$XDG_RUNTIME_DIR/nomyo-router` or `/dev/shm/nomyo-router-<uid>`):

- `supervisor-P`: who P is (its start time in clock ticks since boot, from /proc), so a pid
  the kernel has given to another process since is not mistaken for P;
- `metrics-P/`: the workers' prometheus files (cli.py);
- `P-<tag>.lock`, `.sock`, `.slots`, `.pins`: the workers' shared state (state/worker_store.py).

A supervisor that exits normally (SIGTERM, SIGINT) removes all of them once its workers are
gone (`remove_own`). One killed with SIGKILL cannot: the next router to start removes what
routers no longer running left (`sweep`), in every private directory of this user it finds
(a run with another XDG_RUNTIME_DIR leaves its files under /dev/shm). An entry is removed
only when all of this holds:

- its name is one of the forms above, and it is a plain file, socket or directory (never a
  symlink) owned by this user;
- its owner P is dead: no process has pid P, or one has but it started at another time than
  the one `supervisor-P` recorded. A living P of another user, or a living P without a record
  (an older version), keeps its files. A zombie P counts as living, and so does a dead P one
  of whose workers still holds the shared-state lock (orphans finishing their shutdown).

An explicit `NOMYO_ROUTER_STATE_PATH` is the operator's: nothing there is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import tempfile

log = logging.getLogger("nomyo_router.leftovers")

OWNER_PREFIX = "supervisor-"
METRICS_PREFIX = "metrics-"
STATE_SUFFIXES = (".lock", ".sock", ".slots", ".pins")


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat); None when
    it cannot be read (no such process, no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # (the command name may hold spaces and parentheses)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def record_owner(directory: str, pid: int | None = None) -> str:
    """Write `supervisor-<pid>` (default: this process), 0600, replacing a dead namesake's."""
    pid = os.getpid() if pid is None else pid
    path = os.path.join(directory, f"{OWNER_PREFIX}{pid}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # (a dead process with the same pid left it)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, str(start_ticks(pid) or "").encode())
    finally:
        os.close(fd)
    return path


def owner_pid(name: str) -> int | None:
    """The supervisor pid an entry of ours is named after, or None for anything else."""
    if name.startswith((OWNER_PREFIX, METRICS_PREFIX)):
        pid = name.partition("-")[2]
    elif name.endswith(STATE_SUFFIXES):
        pid, dash, tag = name.partition("-")
        if not dash or not tag:
            return None
    else:
        return None
    return int(pid) if pid.isdigit() and int(pid) > 0 else None


def _is_ours(path: str, name: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if st.st_uid != os.geteuid():
        return False
    if name.startswith(METRICS_PREFIX):
        return stat.S_ISDIR(st.st_mode)
    return stat.S_ISREG(st.st_mode) or stat.S_ISSOCK(st.st_mode)


def _remove(path: str, name: str) -> None:
    if name.startswith(METRICS_PREFIX):
        import shutil  # (rarely needed: with one worker this process serves, and shutil costs it modules)

        shutil.rmtree(path)
    else:
        os.unlink(path)


def owner_gone(directory: str, pid: int) -> bool:
    """Whether supervisor `pid` of `directory`'s entries is certainly dead (see the module
    docstring); when in doubt, it is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return not _host_lock_held(directory, pid)
    except PermissionError:
        return False  # alive: another user's process
    try:
        with open(os.path.join(directory, f"{OWNER_PREFIX}{pid}"), "rb") as f:
            recorded = int(f.read(32))
    except (OSError, ValueError):
        return False  # no record to compare with: the living pid may be the owner
    now = start_ticks(pid)
    return now is not None and now != recorded and not _host_lock_held(directory, pid)


def _host_lock_held(directory: str, pid: int) -> bool:
    """Whether a worker of supervisor `pid` still hosts its shared state (holds the lock): the
    workers of a supervisor killed a moment ago may still be finishing their shutdown."""
    for name in os.listdir(directory):
        if not (name.startswith(f"{pid}-") and name.endswith(".lock")):
            continue
        try:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            continue
        finally:
            os.close(fd)  # (closing releases a lock taken here)
    return False


def sweep(directory: str) -> list[str]:
    """Remove the entries of dead supervisors from `directory`; returns their names."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    gone: dict[int, bool] = {}
    removed = []
    # records last: they are what tells a reused pid from its owner
    for name in sorted(names, key=lambda n: n.startswith(OWNER_PREFIX)):
        pid = owner_pid(name)
        if pid is None or pid == os.getpid():
            continue
        if pid not in gone:
            gone[pid] = owner_gone(directory, pid)
        path = os.path.join(directory, name)
        if not gone[pid] or not _is_ours(path, name):
            continue
        try:
            _remove(path, name)
        except FileNotFoundError:
            continue  # (another router starting at the same time removed it)
        except OSError as e:
            log.warning("could not remove %s, left by a router no longer running: %s", path, e)
            continue
        removed.append(name)
    if removed:
        log.info("removed %d file(s) left in %s by routers no longer running", len(removed), directory)
    return removed


def private_dirs(state_dir: str) -> list[str]:
    """`state_dir` and the other places a router of this user may have used (another
    XDG_RUNTIME_DIR, /dev/shm, the temporary directory) that exist and are private to it."""
    uid = os.geteuid()
    out: list[str] = []
    for path in (state_dir, f"/dev/shm/nomyo-router-{uid}", os.path.join(tempfile.gettempdir(), f"nomyo-router-{uid}")):
        if path in out:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022:
            out.append(path)
    return out


def sweep_all(state_dir: str) -> list[str]:
    """At start-up: what dead routers left in every private directory of this user."""
    removed = []
    for directory in private_dirs(state_dir):
        removed += [os.path.join(directory, name) for name in sweep(directory)]
    return removed


def remove_own(directory: str, pid: int | None = None) -> list[str]:
    """At the supervisor's exit, once its workers are gone: everything named after it."""
    pid = os.getpid() if pid is None else pid
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if owner_pid(name) != pid or not _is_ours(path, name):
                continue
            try:
                _remove(path, name)
            except OSError as e:
                log.warning("could not remove %s: %s", path, e)
                continue
            removed.append(name)
    return removed
