"""nomyo-router --config config.yaml [--host H] [--port P] [--workers N]

A thin layer over uvicorn: validates the config first (so a bad one fails here, with
the key named), then serves `nomyo_router.app:app` with uvloop and httptools.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.config
import os
import signal
import sys

# Idle memory: uvicorn imports watchfiles (and with it anyio and a Rust library)
# only to offer --reload, which the router never uses; hiding it makes uvicorn fall back to
# its stat reloader and saves ~2 MB in the master and in every worker (workers import this
# module again as their __mp_main__).
sys.modules.setdefault("watchfiles", None)  # type: ignore[arg-type]

import uvicorn  # noqa: E402
from uvicorn.config import STARTUP_FAILURE  # noqa: E402
from uvicorn.supervisors import Multiprocess  # noqa: E402

# Not `.app`: the master only supervises, and importing the app (aiohttp, ...) cost it ~11 MB.
# What only the start-up checks and a supervisor of several workers use (the leftovers'
# sweep, the private state directory, SQLite, shutil with its compression modules, ctypes) is
# imported in main(): with one worker this process is the worker, and every worker of several
# imports this module again as its __mp_main__.
from .config import CONFIG_ENV, SUPERVISOR_ENV, ConfigError, RouterConfig, load_config  # noqa: E402
from .ops import logformat  # noqa: E402

DEFAULT_PORT = 12434


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="nomyo-router",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--config",
        default=os.environ.get(CONFIG_ENV, "config.yaml"),
        help=f"the YAML config (or ${CONFIG_ENV}); every key: docs/configuration.md",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for all interfaces")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes; they share slots, queue, pins and health (state: auto)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level of the router and uvicorn",
    )
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    p.add_argument(
        "--version",
        action=_PrintVersion,
        nargs=0,
        default=argparse.SUPPRESS,
        help="show program's version number and exit",
    )
    args = p.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as e:  # every problem of the file, a line each, naming the file
        for problem in e.problems:
            problem = problem.removeprefix(f"{args.config}: ")
            print(f"nomyo-router: bad config: {args.config}: {problem}", file=sys.stderr)
        return 2
    from .ops import preflight, private_dir_cleanup
    from .state import private

    # a path that cannot be opened, a section whose extra is not installed: say so now, once,
    # not in every worker
    problems = [
        *preflight.check_config_paths(config),
        *preflight.check_state_path(config, args.workers),
        *preflight.check_extras(config),
    ]
    for problem in problems:
        print(f"nomyo-router: {problem}", file=sys.stderr)
    for warning in preflight.extras_warnings(config):
        print(f"nomyo-router: warning: {warning}", file=sys.stderr)
    if problems:
        return 2
    if args.check:
        print(f"{args.config}: ok, {len(config.endpoints)} endpoint(s)")
        return 0
    if config.state.startswith(("redis://", "rediss://", "unix://", "redis+sentinel://")):
        from .state import redis_check  # (redis-py in this process only when the state is Redis)

        misconfigured = redis_check.check(config.state, config.redis_timeout)  # wrong password, TLS, ...
        if misconfigured is not None:
            print(f"nomyo-router: {misconfigured}", file=sys.stderr)
            return 2
    log_config = logformat.config(config.log_format, args.log_level)
    logging.config.dictConfig(log_config)  # (uvicorn applies it again, and in every worker)
    if args.workers > 1 and config.state == "memory":
        logging.getLogger("nomyo_router").warning(
            "state 'memory' with several workers keeps separate limits per worker; use 'auto' (the default) or 'shared'"
        )
    private_dir_cleanup.sweep_all(private.state_dir())  # what routers no longer running left (never a live one's)
    # (with Redis too: its workers share one table while Redis is away, state/redis_local.py)
    shared_files = config.state != "memory" and "NOMYO_ROUTER_STATE_PATH" not in os.environ
    own_metrics = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    if args.workers > 1 and (shared_files or own_metrics):
        try:  # fail here, once, rather than in every worker
            private.ensure_private_dir(private.state_dir())
        except private.UnsafeStatePath as e:
            print(f"nomyo-router: unsafe shared-state directory: {e}", file=sys.stderr)
            return 2
        except OSError as e:  # (its parent is missing or read-only: XDG_RUNTIME_DIR, TMPDIR)
            print(
                f"nomyo-router: {preflight.describe('shared-state directory', private.state_dir(), e)}", file=sys.stderr
            )
            return 2
        private_dir_cleanup.record_owner(private.state_dir())  # before any file named after this pid
    if args.workers > 1 and own_metrics:
        import shutil

        # every worker writes its metrics here, any worker's /metrics sums them (ops/metrics.py)
        metrics_dir = os.path.join(private.ensure_private_dir(private.state_dir()), f"metrics-{os.getpid()}")
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.makedirs(metrics_dir, mode=0o700)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        # prometheus_client creates its files with open()'s 0666 less the umask (0644 under the
        # usual 022), and they hold every client's traffic: the workers, which inherit the umask,
        # create every file for the router's user alone (0600), like the state files beside them.
        os.umask(os.umask(0) | 0o077)
    os.environ[CONFIG_ENV] = os.path.abspath(args.config)
    from .h1 import descriptors

    before, now = descriptors.raise_soft_limit()  # (the workers inherit it)
    logging.getLogger("nomyo_router").info(
        "file descriptors: soft limit %d%s, hard %d",
        now,
        f" (raised from {before})" if now != before else "",
        descriptors.limits()[1],
    )
    settings = dict(
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="nomyo_router.server.protocol:GuardedHttpToolsProtocol",
        lifespan="on",
        ws="none",  # no WebSocket routes (the app refuses upgrades); saves ~2 MB per worker
        limit_concurrency=config.max_connections or None,
        access_log=False,  # (the router writes its own: ops/accesslog.py)
        log_config=log_config,  # every process, every logger: ops/logformat.py
        log_level=args.log_level,
        timeout_keep_alive=75,
        backlog=2048,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=config.shutdown_grace,
    )
    if args.workers == 1:  # the worker itself handles SIGHUP (runtime/reconfigure.py)
        uvicorn.run("nomyo_router.app:app", **settings)
        return 0
    from .ops import lifecycle

    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    server_config = uvicorn.Config("nomyo_router.app:app", **settings)
    lifecycle.use_bound_workers()  # workers end with this process, even when it is SIGKILLed
    supervisor = Supervisor(server_config, sockets=[server_config.bind_socket()])
    supervisor.run()
    # every worker has exited (uvicorn joined them): what they and this process made goes too
    if shared_files or own_metrics:
        private_dir_cleanup.remove_own(private.state_dir())
    _fold_sqlite_files(config)
    return supervisor.exit_status


def _fold_sqlite_files(config: RouterConfig) -> None:
    """The SQLite files every worker wrote: their `-wal` and `-shm` go now that all have closed."""
    from .ops.sqlite_file import fold_wal

    if config.usage_db:
        fold_wal(config.usage_db)
    if config.cache.enabled and config.cache.backend == "sqlite":
        fold_wal(config.cache.path)


class _PrintVersion(argparse.Action):
    """argparse's `version` action, but the version is looked up only when asked for: reading
    the installed distribution's metadata imports importlib.metadata and ~15 modules with it
    (about 0.5 MB), and with one worker this process is the worker."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _version() -> str:
    """The installed distribution's version (pip/pipx install, or `pip install -e .`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nomyo-router")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class Supervisor(Multiprocess):
    """uvicorn's worker supervisor, but SIGHUP reloads the config inside the workers (keeping
    their connections, queues, pins and learned state) instead of replacing them; a file that
    does not validate is rejected here, logged, and nobody reloads. A worker that fails to
    start stops the router, as in uvicorn, but with the worker's exit status (uvicorn's
    supervisor exits 0, so systemd's `Restart=on-failure` would not restart it)."""

    exit_status = 0

    def keep_subprocess_alive(self) -> None:
        super().keep_subprocess_alive()
        if self.exit_status == 0 and self.should_exit.is_set():
            failed = [p.exitcode for p in self.processes if p.exitcode == STARTUP_FAILURE]
            if failed:  # (uvicorn stopped because a worker failed to start)
                self.exit_status = STARTUP_FAILURE

    def handle_hup(self) -> None:
        try:
            config = load_config(os.environ[CONFIG_ENV])
        except ConfigError as e:
            logging.getLogger("nomyo_router.reload").error(
                "config reload rejected, keeping the running config: %s", e.one_line
            )
            return
        logformat.use(config.log_format)  # (the workers switch on their own, runtime/reconfigure.py)
        for process in self.processes:
            pid = process.process.pid
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGHUP)


if __name__ == "__main__":
    sys.exit(main())
