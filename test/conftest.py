from __future__ import annotations

import itertools
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator

import pytest

import mock
import mock.runner
from mock import run_mock

FAST = dict(ttft_ms=0.0, tok_ms=0.0, tokens=8)


def _worker_ports(worker: str) -> Iterator[int]:
    """The ports free_port gives in pytest-xdist worker `worker` (gw0, gw1, ...): every 8th of
    a block of 1000 of its own, below the range the kernel picks port 0 and outgoing
    connections' ports from (32768-60999 on Linux), walked from a random place. (The 7 ports
    above one given are never given: `--mock-count N` puts its further mocks there.) The
    kernel's own choice of a free port is random over its range in every process: a port one
    worker was given and had not yet bound (a router or mock process starting on it) could be
    given to another, and its server then fail to start. Each worker's own block cannot be; the
    processes the tests start keep the kernel's choice, in the kernel's range."""
    low = 20_000 + int(worker.removeprefix("gw")) % 12 * 1000
    start = random.randrange(125)
    return (low + (start + i) % 125 * 8 for i in itertools.count())


def _free_port_of(ports: Iterator[int]) -> Callable[[str], int]:
    def free_port(host: str = "127.0.0.1") -> int:
        for port in ports:
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:  # (taken: by a test's server, or anything else on the machine)
                    continue
                return port
        raise AssertionError("unreachable")

    return free_port


if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):  # (before the tests import free_port)
    mock.free_port = mock.runner.free_port = _free_port_of(_worker_ports(os.environ["PYTEST_XDIST_WORKER"]))


def _compiled() -> bool:
    """Whether the router imported is the compiled build (its modules are extension modules)."""
    import nomyo_router.app

    return nomyo_router.app.__file__ is None or not nomyo_router.app.__file__.endswith(".py")


# Tests put a multi-worker router's private directory under tmp_path, and its Unix socket's
# path must fit in 107 bytes: pytest's own base (/tmp/pytest-of-USER/pytest-N, with pytest-xdist's
# popen-gwN below it) leaves too little room for it. A run names a short base of its own
# (/tmp/nrt-XXXXXXXX; each xdist worker gets its own below it), removed when the run passed
# (kept to look into when it failed, as pytest keeps its own).
_SHORT_BASETEMP: list[str | None] = [None]
_PASSED: list[bool] = [False]


def pytest_configure(config: pytest.Config) -> None:
    """`make test` runs the request path's tests a second time against the compiled build and
    says so with NOMYO_ROUTER_EXPECT_COMPILED=1: a run that would import the source tree's
    pure-Python router instead (a PYTHONPATH that puts the tree first) stops here."""
    if os.environ.get("NOMYO_ROUTER_EXPECT_COMPILED") == "1" and not _compiled():
        import nomyo_router.app

        raise pytest.UsageError(f"the compiled build was expected, but {nomyo_router.app.__file__} was imported")
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = _SHORT_BASETEMP[0] = tempfile.mkdtemp(prefix="nrt-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SHORT_BASETEMP[0] is not None and _PASSED[0]:
        shutil.rmtree(_SHORT_BASETEMP[0], ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under the compiled build (setup.py's HOT_PATH compiled by mypyc), a test that replaces
    one of the router's own functions cannot: it is skipped, the rest runs as it is."""
    if not _compiled():
        return
    skip = pytest.mark.skip(reason="replaces a function of a compiled module (the compiled build)")
    for item in items:
        if item.get_closest_marker("instruments"):
            item.add_marker(skip)


_PREBUILDS: list[threading.Thread] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """bench/slowgen's `go build` (tens of seconds on a cold Go cache, as on a clean clone)
    starts now, niced, beside the tests that run before test_slowgen.py; its fixture's build()
    then waits for this one instead of building again (or builds itself if this one failed)."""
    if not any(item.path.name == "test_slowgen.py" for item in session.items):
        return
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import goload

    if goload.go_tool() is None:
        return

    def prebuild() -> None:
        try:
            goload.build(nice=10)
        except Exception:  # (the fixture builds again and reports the error)
            pass

    _PREBUILDS.append(threading.Thread(target=prebuild, name="slowgen-prebuild", daemon=True))
    _PREBUILDS[-1].start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _PASSED[0] = exitstatus == 0
    for thread in _PREBUILDS:  # (a run that stopped early: no half-written binary left behind)
        thread.join()


@pytest.fixture
async def mock():
    async with run_mock(**FAST) as m:
        yield m


@pytest.fixture
async def mock2():
    async with run_mock(**FAST) as m:
        yield m


@pytest.fixture
def redis_url():
    """A real redis-server on a free port, stopped after the test."""
    with RedisServer() as r:
        yield r.url


class RedisServer:
    """`args`: more of redis-server's options (`--requirepass`, TLS); `tls`: the port given is
    its TLS port (then `args` names the certificate and key)."""

    def __init__(self, args: tuple[str, ...] = (), tls: bool = False) -> None:
        from mock import free_port

        self.port = free_port()
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}/0"
        self.proc = None
        self.extra, self.tls = args, tls

    def start(self) -> RedisServer:
        import shutil
        import subprocess
        import time

        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed; `make test` installs it from the distribution")
        ports = ["--port", "0", "--tls-port", str(self.port)] if self.tls else ["--port", str(self.port)]
        args = [exe, *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *self.extra]
        version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        if int(version.split("v=", 1)[1].split(".", 1)[0]) >= 7:  # before 7: always allowed
            args += ["--enable-debug-command", "local"]  # DEBUG SLEEP: how test_redis_stall stalls it
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import socket

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        # the test is over: SIGKILL, not stop()'s SIGTERM, which Redis acts on at its next
        # tick (up to 0.1 s); it saves nothing either way (--save "", no appendonly)
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Clients:
    """The official clients, closed at the end of the test (they own httpx pools)."""

    def __init__(self) -> None:
        self._open: list = []

    def openai(self, url: str):
        import openai

        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        self._open.append(c)
        return c

    def ollama(self, url: str):
        import ollama

        c = ollama.AsyncClient(host=url)
        self._open.append(c)
        return c

    async def close(self) -> None:
        for c in self._open:
            await c.close()


@pytest.fixture
async def clients():
    c = Clients()
    yield c
    await c.close()


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, driven by selenium through chromium-driver (`make test`
    installs both). One browser for the session; each test opens its own pages."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    exe, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not exe or not driver:
        pytest.fail(
            "browser tests need chromium and chromedriver: run `make test` (it installs them) "
            "or apt-get install chromium chromium-driver"
        )
    opts = webdriver.ChromeOptions()
    opts.binary_location = exe
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        opts.add_argument(arg)
    b = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        yield b
    finally:
        b.quit()
