"""Where the workers' shared state lives, kept private to the router's user.

The workers of one uvicorn master meet at a Unix socket and a lock file. Both live in a
directory that belongs to the router's user alone (mode 0700; every file in it 0600), so no other
local user can talk to the shared state, replace it, or point it at another file:

- `$XDG_RUNTIME_DIR/nomyo-router` when XDG_RUNTIME_DIR is set (per-user, on tmpfs), else
  `/dev/shm/nomyo-router-<uid>` where /dev/shm exists (tmpfs: the shared-memory tables
  mapped from there are never written back to a disk), else `$TMPDIR/nomyo-router-<uid>`;
  `NOMYO_ROUTER_STATE_PATH` overrides the whole base path;
- a directory that exists but is a symlink, is not owned by the router's user, or is group-
  or world-writable is refused with a clear message (no start);
- lock and socket files that are symlinks or someone else's are refused the same way;
- files left by earlier runs (their master process is gone) are removed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile


class UnsafeStatePath(RuntimeError):
    """The shared-state path could be read or replaced by someone else."""


def state_dir() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "nomyo-router")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"nomyo-router-{os.geteuid()}")


def ensure_private_dir(path: str) -> str:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeStatePath(
            f"{path} is a symlink or not a directory; remove it (the router creates "
            f"its own private directory there) or set NOMYO_ROUTER_STATE_PATH"
        )
    if st.st_uid != os.geteuid():
        raise UnsafeStatePath(
            f"{path} belongs to uid {st.st_uid}, not to the router's user "
            f"(uid {os.geteuid()}); remove it or set NOMYO_ROUTER_STATE_PATH"
        )
    if st.st_mode & 0o022:
        raise UnsafeStatePath(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); chmod 700 it or remove it"
        )
    if st.st_mode & 0o077:  # ours and nobody else can write it: readable by others is tightened
        os.chmod(path, 0o700)
    return path


def check_file(path: str) -> None:
    """A lock, socket or table path must be absent, or ours and not a symlink. New files are
    created 0600 by their owners (os.open's mode is never widened by the umask); one of ours
    left with a looser mode (an older version, a hand-made file) is made 0600 here, before use."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeStatePath(f"{path} is a symlink; refusing to use it (remove it)")
    if st.st_uid != os.geteuid():
        raise UnsafeStatePath(f"{path} belongs to uid {st.st_uid}; refusing to use it (remove it)")
    if st.st_mode & 0o077:
        os.chmod(path, 0o600)


def remove_stale(directory: str) -> None:
    """Files named `<master pid>-<tag>.(lock|sock|slots|pins)` whose master is gone."""
    for name in os.listdir(directory):
        pid, dash, _ = name.partition("-")
        if not dash or not pid.isdigit() or not name.endswith((".lock", ".sock", ".slots", ".pins")):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        except PermissionError:
            pass  # alive, someone else's


def shared_state_path(master_pid: int, config_path: str) -> str:
    """The base path (without .lock/.sock) for the workers of master `master_pid`."""
    explicit = os.environ.get("NOMYO_ROUTER_STATE_PATH")
    if explicit:
        return explicit
    directory = ensure_private_dir(state_dir())
    remove_stale(directory)
    tag = hashlib.blake2b(config_path.encode(), digest_size=4).hexdigest()
    return os.path.join(directory, f"{master_pid}-{tag}")
