"""Spawn mocks and a router wired to them, and tear everything down whatever happens.

Each child runs in its own session (process group), so killing the group also takes
uvicorn's worker processes. Teardown runs on normal exit, on errors, on Ctrl-C and on
SIGTERM; nothing is left running and no port stays bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any

from mock import MockConfig, MockProcess, free_port
from mock.runner import stop_group, wait_http

from .router_process import router_argv, write_config


@dataclass
class Fleet:
    mock_config: MockConfig
    mock_count: int = 1
    mock_port: int | None = None  # the first mock's port; others follow
    router_port: int | None = None
    router_workers: int = 1
    router_max_conc: int = 32
    router_extra: dict[str, Any] = field(default_factory=dict)
    keep_config: bool = False
    mocks: list[MockProcess] = field(default_factory=list)
    router: subprocess.Popen | None = None
    router_log: IO[bytes] | None = None  # what the router writes to stderr (a file: a pipe nobody reads fills)
    config_path: str | None = None
    router_url: str = ""

    def start(self) -> Fleet:
        try:
            for i in range(self.mock_count):
                port = self.mock_port + i if self.mock_port else None
                self.mocks.append(MockProcess(self.mock_config, port=port).start())
            self._start_router()
        except BaseException:
            self.stop()
            raise
        return self

    def router_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            # the router's prefix index is told each mock's real KV cache size
            "endpoints": [
                {
                    "url": m.url,
                    "name": f"mock{i}",
                    "max_concurrent": self.router_max_conc,
                    "kv_cache_tokens": self.mock_config.kv_cache_tokens,
                }
                for i, m in enumerate(self.mocks)
            ],
            "max_queue": 100_000,
            "health_interval": 1,
        }
        cfg.update(self.router_extra)
        return cfg

    def _start_router(self) -> None:
        self.config_path = write_config(self.router_config(), prefix="nomyo-loadtest-")
        port = self.router_port or free_port()
        self.router_url = f"http://127.0.0.1:{port}"
        # (access lines are logged at INFO: a run that asks for them gets them in the router's log)
        level = "info" if self.router_extra.get("access_log") else "warning"
        cmd = router_argv(self.config_path, port, self.router_workers, log_level=level)
        # A file, not a pipe: a router that logs more than a pipe holds during a run (ejections,
        # failures under fault injection) would block on its next line, and the run with it.
        self.router_log = log = tempfile.TemporaryFile(prefix="nomyo-loadtest-router-")
        self.router = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            wait_http(self.router_url + "/health", 30, self.router)
        except (RuntimeError, TimeoutError) as e:
            log.seek(0)
            said = log.read()[-4000:].decode(errors="replace")
            raise RuntimeError(f"{e}\nthe router's stderr:\n{said}") from None

    @property
    def direct_url(self) -> str:
        return self.mocks[0].url

    def stop(self) -> None:
        if self.router is not None and self.router.poll() is None:
            stop_group(self.router)
        if self.router_log is not None:
            self.router_log.close()
            self.router_log = None
        for m in self.mocks:
            m.stop()
        if self.config_path and not self.keep_config and os.path.exists(self.config_path):
            os.unlink(self.config_path)

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def install_sigterm_as_interrupt() -> None:
    """SIGTERM tears down like Ctrl-C does."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
