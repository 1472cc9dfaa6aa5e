"""A Redis that is misconfigured is not an outage: told apart here, at start.

A Redis that refuses connections, stalls or cannot be resolved yet may be back in a second,
and the router starts degraded and recovers when it is (redis.py). A wrong password, a
missing one, a user the ACL does not let run the router's commands, a certificate that does
not verify, or a plain `redis://` URL pointed at a TLS port never heal by themselves: the
router would serve with per-instance limits for ever while `/health` says `degraded`. So
`nomyo-router` asks Redis once before any worker starts, and a misconfiguration stops it with
one line naming the address and the reason, e.g.

    nomyo-router: state: Redis at 10.0.0.5:6379: authentication failed (invalid username-password pair …)

The same test runs when a store starts (a Redis that was down at the check and answers
wrongly later), which then raises `RedisMisconfigured` instead of degrading.
"""

from __future__ import annotations

import asyncio
import ssl

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    InvalidResponse,
    NoPermissionError,
    RedisError,
)

from . import redis_url

# Exercises what the router needs of its user: Lua scripts, keys and channels under `nomyo:`.
_PROBE = "return redis.call('EXISTS', KEYS[1])"
PROBE_KEY = "nomyo:check"


class RedisMisconfigured(Exception):
    """`str()` is the line to print: the address and why it will not work until fixed."""


def misconfiguration(error: BaseException, url: str) -> str | None:
    """Why `error` (raised talking to `url`) means the config is wrong, or None when it may
    be an outage that passes (refused, timed out, reset while running, loading, …)."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and len(chain) < 8:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"TLS: the server's certificate does not verify ({e.verify_message}; check ssl_ca_certs)"
        if isinstance(e, ssl.SSLError):
            return f"TLS failed ({e.reason or e})"
    if isinstance(error, (AuthenticationError, AuthenticationWrongNumberOfArgsError)) or _says(error, "NOAUTH"):
        if not redis_url.has_password(url):
            return "the server requires a password and the URL has none (redis://[user]:password@host…)"
        return f"authentication failed ({error})"
    if isinstance(error, NoPermissionError) or _says(error, "NOPERM", "WRONGPASS"):
        return f"the user may not run the router's commands ({error}); see Redis ACL users in docs/deployment.md"
    if isinstance(error, InvalidResponse) or _says(error, "Protocol Error", "protocol error"):
        return f"the server does not speak the Redis protocol ({error})"
    if any(isinstance(e, ConnectionResetError) for e in chain) or _says(error, "Connection closed by server"):
        if url.startswith("redis://"):
            return "the server closed the connection without answering (a TLS port? then use rediss://)"
    return None


def _says(error: BaseException, *words: str) -> bool:
    text = str(error)
    return isinstance(error, (RedisError, OSError)) and any(w in text for w in words)


async def probe(url: str, timeout: float) -> str | None:
    """Ask the Redis of `url` once: the line to stop with, or None (it works, or it is away,
    which the store handles as an outage)."""
    client = redis_url.client(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        async with asyncio.timeout(timeout * 3):
            await client.ping()
            await client.eval(_PROBE, 1, PROBE_KEY)
            await client.publish(PROBE_KEY, "")
    except (RedisError, OSError, TimeoutError) as e:
        reason = misconfiguration(e, url)
        if reason is not None:
            return f"state: Redis at {redis_url.address(url)}: {reason}"
    finally:
        try:
            await redis_url.close(client)
        except (RedisError, OSError):
            pass
    return None


def check(url: str, timeout: float) -> str | None:
    """`probe`, from outside an event loop (the command line, before any worker starts)."""
    return asyncio.run(probe(url, timeout))
