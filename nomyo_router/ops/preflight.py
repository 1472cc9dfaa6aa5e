"""Start-up checks of the files the config names, before any worker starts.

A usage database or a response-cache file that cannot be opened used to surface as an
exception inside every worker's start-up (a traceback that did not name the file, and with
`--workers 2` an exit status of 0). `nomyo-router --check` and every start now open each
first and stop within a second with one line naming the key, the path exactly as configured
and the operating system's or SQLite's reason, and exit status 2, e.g.

    nomyo-router: usage_db: cannot open /nonexistent/dir/u.db: No such file or directory (the directory does not exist)
    nomyo-router: cache.path: cannot open ./nomyo-cache.db: file is not a database

A file that is not an SQLite database is never moved aside or replaced, not even the
response cache's (whose answers could be fetched again): a path that names the wrong file
(a typo, another program's database) must not cost that file.

The check creates nothing: a database that does not exist yet is created (0600) when the
router starts; here only its directory is shown writable, with a probe file that is removed
at once. SQLite keeps `-wal` and `-shm` files beside the database, so that directory must be
writable even when the database file is.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import stat
from urllib.parse import quote

from ..config import RouterConfig

_HINTS = {
    errno.ENOENT: "the directory does not exist",
    errno.ENOTDIR: "a part of the path is not a directory",
}
# (EISDIR: a file in it, e.g.)
_EXAMPLE = {"usage_db": "nomyo-usage.db", "cache.path": "nomyo-cache.db", "batch.path": "nomyo-batch.db"}
STATE_PATH_ENV = "NOMYO_ROUTER_STATE_PATH"
_DIR_HINT = "SQLite writes its -wal and -shm files in the database's directory"


class PathProblem(Exception):
    """A path the router must open cannot be; `str()` is the line to print."""


class _DirectoryNotWritable(OSError):
    """The database's directory refused the probe file (read-only, no permission, full)."""


def check_config_paths(config: RouterConfig) -> list[str]:
    """One line per unusable path the config names: the usage database (kept in Redis with
    `state: redis://`), the response cache's SQLite file, the Batch API's (Redis keeps its
    batches too)."""
    files = []
    redis = config.state.startswith(("redis://", "rediss://", "unix://", "redis+sentinel://"))
    if config.usage_db and not redis:  # (Redis keeps usage)
        files.append(("usage_db", config.usage_db))
    if config.cache.enabled and config.cache.backend == "sqlite":
        files.append(("cache.path", config.cache.path))
    if config.batch.enabled and not redis:
        files.append(("batch.path", config.batch.path))
    problems = []
    for key, path in files:
        try:
            check_sqlite_file(key, path)
        except PathProblem as e:
            problems.append(str(e))
    return problems


def check_state_path(config: RouterConfig, workers: int) -> list[str]:
    """The base path of the workers' shared state when the operator set it
    (`NOMYO_ROUTER_STATE_PATH`, used with `state: shared`, or `auto` with several workers):
    its directory must exist and be writable. (The default directory is made by the
    supervisor, which says so in one line when it cannot: cli.py.)"""
    explicit = os.environ.get(STATE_PATH_ENV)
    if not explicit or not (config.state == "shared" or (config.state == "auto" and workers > 1)):
        return []
    directory = os.path.dirname(explicit) or "."
    try:
        if not os.path.isdir(directory):
            os.stat(directory)  # (ENOENT: the directory does not exist; ENOTDIR: a file on the way)
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory)
        _probe_writable(directory)
    except OSError as e:
        return [describe(STATE_PATH_ENV, explicit, e)]
    return []


def _installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (only its parent
    packages, which are namespaces here): protobuf and the OTLP messages cost ~10 MB."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # (a parent package missing)
        return False


def check_extras(config: RouterConfig) -> list[str]:
    """One line per section whose optional dependencies are not installed and without which
    the router would not start: `tracing` needs the `tracing` extra."""
    if config.tracing is None or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    if _installed("opentelemetry.proto.trace") and _installed("google.protobuf"):
        return []
    return [
        "tracing: needs the opentelemetry-proto package, which is not installed; "
        "pip install 'nomyo-router[tracing]', or remove tracing"
    ]


def extras_warnings(config: RouterConfig) -> list[str]:
    """Sections that work without their extra, but less well: `kv_events` falls back to the
    approximate prefix index without pyzmq and msgpack."""
    users = [f"endpoints[{i}].kv_events" for i, e in enumerate(config.endpoints) if e.kv_events]
    if not users or (_installed("zmq") and _installed("msgpack")):
        return []
    return [
        f"{', '.join(users)}: needs pyzmq and msgpack, which are not installed "
        "(pip install 'nomyo-router[kv-events]'); the router uses its approximate prefix index instead"
    ]


def check_sqlite_file(key: str, path: str) -> None:
    """Raise PathProblem if SQLite could not open (or create) the database `path` that the
    config's `key` names."""
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        _check_sqlite_file(key, path)
    except _DirectoryNotWritable as e:
        raise PathProblem(describe(key, path, e, _DIR_HINT)) from None
    except IsADirectoryError as e:
        example = _EXAMPLE.get(key, "data.db")
        raise PathProblem(describe(key, path, e, f"{key} names the database file, e.g. DIR/{example}")) from None
    except OSError as e:
        raise PathProblem(describe(key, path, e)) from None


def describe(key: str, path: str, e: OSError, hint: str | None = None) -> str:
    """`<key>: cannot open <path>: <strerror> (<hint>)` — the path as configured, not resolved."""
    reason = e.strerror or (os.strerror(e.errno) if e.errno else str(e))
    hint = hint or _HINTS.get(e.errno or 0)
    return f"{key}: cannot open {path}: {reason}" + (f" ({hint})" if hint else "")


def _check_sqlite_file(key: str, path: str) -> None:
    directory = os.path.dirname(path) or "."
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
        os.stat(directory)  # (ENOENT: the directory does not exist; ENOTDIR: a file on the way)
        if not os.path.isdir(directory):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if st is not None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)  # (EACCES, EROFS: the file itself)
        os.close(fd)
    if not os.path.exists(path + "-wal"):  # SQLite must create it, and -shm, beside the database
        _probe_writable(directory)
    if st is not None and st.st_size:
        _read_header(key, path)


def _probe_writable(directory: str) -> None:
    probe = os.path.join(directory, f".nomyo-router-probe-{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(probe, flags, 0o600)
        except FileExistsError:  # (left by a check with our pid that was killed): ours to replace
            os.unlink(probe)
            fd = os.open(probe, flags, 0o600)
    except OSError as e:
        raise _DirectoryNotWritable(e.errno, e.strerror, directory) from None
    os.close(fd)
    os.unlink(probe)


def _read_header(key: str, path: str) -> None:
    """A file that is not an SQLite database (or is damaged) fails here, not in every worker.
    (SQLite is imported here, only for a database that has content already.)"""
    import sqlite3

    uri = f"file:{quote(os.path.abspath(path))}?mode=rw"
    try:
        db = sqlite3.connect(uri, uri=True, timeout=5)
        try:
            db.execute("PRAGMA schema_version").fetchone()
        finally:
            db.close()
    except sqlite3.Error as e:
        raise PathProblem(f"{key}: cannot open {path}: {e}") from None
