"""A misconfigured Redis stops the router at start with one line naming the address and the
reason, and a non-zero exit (also under a supervisor of two workers); a Redis that is only
away keeps the degraded start; TLS with `ssl_ca_certs` and an ACL user, as the deployment
page documents them, work."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from mock import free_port
from nomyo_router.config import parse_config
from nomyo_router.domain import Endpoint
from nomyo_router.state import redis_check
from nomyo_router.state.redis import RedisStore
from nomyo_router.state.redis_check import RedisMisconfigured
from test.conftest import RedisServer
from test.helpers import endpoints, run_router

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}
# the ACL rule docs/deployment.md gives for the router's user
ROUTER_USER = ("router", "on", ">router-pw", "~nomyo:*", "&nomyo:*", "+@all", "-@dangerous")


def certificate(directory: Path, name: str) -> Path:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key: `name`.crt, `name`.key."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return crt


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """One redis-server with a password, two ACL users (one may only PING) and a TLS port
    beside the plain one: (server, TLS port, its certificate, a certificate of another CA)."""
    d = tmp_path_factory.mktemp("redis-tls")
    crt, other = certificate(d, "server"), certificate(d, "other")
    tls_port = free_port()
    args = ["--requirepass", "secret", "--user", "limited", "on", ">limited-pw", "+ping", "--user", *ROUTER_USER]
    args += ["--tls-port", str(tls_port), "--tls-cert-file", str(crt), "--tls-key-file", str(d / "server.key")]
    args += ["--tls-auth-clients", "no"]
    with RedisServer(tuple(args)) as server:
        yield server, tls_port, crt, other


async def test_each_misconfiguration_is_named_in_one_line(secured):
    server, tls_port, _, other = secured
    plain = f"127.0.0.1:{server.port}"
    tls = f"127.0.0.1:{tls_port}"
    cases = {  # state URL: (the address, the reason's words)
        f"redis://:nope@{plain}/0": (plain, "authentication failed"),
        f"redis://{plain}/0": (plain, "requires a password and the URL has none"),
        f"redis://limited:limited-pw@{plain}/0": (plain, "may not run the router's commands"),
        f"redis://{tls}/0": (tls, "use rediss://"),
        f"rediss://{tls}/0?ssl_cert_reqs=required&ssl_ca_certs={other}": (tls, "certificate does not verify"),
    }
    for url, (address, words) in cases.items():
        line = await redis_check.probe(url, 1.0)
        assert line is not None and line.startswith(f"state: Redis at {address}: "), (url, line)
        assert words in line and "\n" not in line, (url, line)
        assert "nope" not in line and "limited-pw" not in line  # never the password


@pytest.mark.parametrize("workers", [1, 2])
def test_a_misconfigured_redis_stops_the_router_with_exit_2(secured, tmp_path, workers):
    """The command line asks before any worker starts: one line, no traceback, exit 2, at 1
    and 2 workers (a supervisor that exited 0 would not be restarted by systemd)."""
    server, *_ = secured
    cfg = tmp_path / "config.yaml"
    url = f"redis://:nope@127.0.0.1:{server.port}/0"
    cfg.write_text(yaml.safe_dump({"endpoints": [{"url": "http://127.0.0.1:9", "name": "a"}], "state": url}))
    argv = [sys.executable, "-m", "nomyo_router", "--config", str(cfg), "--port", str(free_port())]
    proc = subprocess.run([*argv, "--workers", str(workers)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"nomyo-router: state: Redis at 127.0.0.1:{server.port}: authentication failed "
        "(invalid username-password pair or user is disabled.)"
    ]


async def test_refused_and_timeouts_are_outages_not_misconfigurations():
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
    silent_port = silent.sockets[0].getsockname()[1]
    async with silent:
        assert await redis_check.probe(f"redis://127.0.0.1:{free_port()}/0", 0.3) is None  # refused
        assert await redis_check.probe(f"redis://127.0.0.1:{silent_port}/0", 0.3) is None  # a stall
        assert await redis_check.probe("redis://no-such-host.invalid:6379/0", 0.3) is None  # not resolved (yet)


async def test_a_store_that_meets_a_misconfiguration_at_start_raises(secured):
    server, *_ = secured
    config = parse_config({"endpoints": [{"url": "http://127.0.0.1:9", "name": "a"}], "redis_timeout": 1.0})
    store = RedisStore(f"redis://:nope@127.0.0.1:{server.port}/0", [Endpoint(name="a", url="", slots=1)], config)
    with pytest.raises(RedisMisconfigured, match="authentication failed"):
        await store.start()


async def test_rediss_with_ssl_ca_certs_and_the_documented_acl_user_serve_shared(secured, mock):
    _, tls_port, crt, _ = secured
    url = f"rediss://router:router-pw@127.0.0.1:{tls_port}/0?ssl_ca_certs={crt}"
    assert await redis_check.probe(url, 1.0) is None
    cfg = {"endpoints": endpoints(mock), "state": url}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                assert resp.status == 200
        await asyncio.sleep(0.5)  # a sweep (scripts, keys and channels under the ACL rule)
        async with s.get(r.url + "/health") as h:
            health = await h.json()
        assert r.router.store.degraded_events == 0
    assert health["state"] == "redis" and not health.get("degraded"), health
