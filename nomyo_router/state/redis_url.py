"""What a `state:` (or `cache.url`) Redis URL names, and a redis-py client for it.

Four forms, all read here and nowhere else:

- `redis://[[user]:password@]host:port/db`: one server, plain TCP;
- `rediss://…?ssl_ca_certs=/path/ca.pem`: the same over TLS (redis-py's own query options:
  `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`, `ssl_cert_reqs`);
- `unix:///path/redis.sock?db=0`: a local socket;
- `redis+sentinel://[[user]:password@]host:port[,host:port…]/service[/db]`: the master of
  `service` as the listed Sentinels name it, asked again on every new connection, so that
  after a failover the router follows the promoted replica. The user and password are the
  master's; `?sentinel_password=…` (and `sentinel_username`) authenticate to the Sentinels
  when they require it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel

SENTINEL = "redis+sentinel://"
SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL)


def is_redis(state: str) -> bool:
    """Whether `state` names Redis (rather than auto, memory or shared)."""
    return state.startswith(SCHEMES)


@dataclass
class SentinelUrl:
    hosts: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel: dict[str, str] = field(default_factory=dict)  # the Sentinels' own credentials


def parse_sentinel(url: str) -> SentinelUrl:
    """`redis+sentinel://[[user]:password@]h1:26379,h2:26379/service[/db][?sentinel_password=…]`;
    ValueError naming what is wrong."""
    rest = url[len(SENTINEL) :]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    creds, at, hosts = netloc.rpartition("@")
    if not at:
        creds, hosts = "", netloc
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise ValueError("a redis+sentinel:// URL names the service after the hosts: …:26379/mymaster")
    out = SentinelUrl([], unquote(parts[0]))
    if len(parts) > 1:
        if not parts[1].isdigit() or len(parts) > 2:
            raise ValueError(f"the database after the service must be a number, not {'/'.join(parts[1:])!r}")
        out.db = int(parts[1])
    for hp in hosts.split(","):
        host, _, port = hp.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"each Sentinel is host:port, not {hp!r}")
        out.hosts.append((host.strip("[]"), int(port)))
    if creds:
        user, colon, password = creds.partition(":")
        out.username = unquote(user) or None
        out.password = unquote(password) if colon else None
    for key, values in parse_qs(query).items():
        if key not in ("sentinel_password", "sentinel_username"):
            raise ValueError(f"unknown option {key!r} (sentinel_password, sentinel_username)")
        out.sentinel[key.removeprefix("sentinel_")] = values[-1]
    return out


def address(url: str) -> str:
    """Where `url` points, for messages: never its credentials."""
    if url.startswith(SENTINEL):
        try:
            s = parse_sentinel(url)
        except ValueError:
            return "redis+sentinel://?"
        return f"Sentinel service {s.service!r} at " + ",".join(f"{h}:{p}" for h, p in s.hosts)
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    return f"{parts.hostname or 'localhost'}:{port}"


def has_password(url: str) -> bool:
    if url.startswith(SENTINEL):
        return parse_sentinel(url).password is not None
    parts = urlsplit(url)
    return parts.password is not None or "password=" in parts.query


def client(url: str, **kwargs: Any) -> aioredis.Redis:
    """A redis-py asyncio client for `url`; `kwargs` are its connection options (timeouts,
    retry, decode_responses). Close it with `close`."""
    if not url.startswith(SENTINEL):
        return aioredis.from_url(url, **kwargs)
    s = parse_sentinel(url)
    sockets = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    sentinels = Sentinel(s.hosts, sentinel_kwargs={**sockets, **s.sentinel})  # type: ignore[no-untyped-call]
    master: aioredis.Redis = sentinels.master_for(
        s.service, db=s.db, username=s.username, password=s.password, **kwargs
    )
    return master


async def close(redis: aioredis.Redis) -> None:
    """Close `redis` (and, for a Sentinel URL, its connections to the Sentinels)."""
    await redis.aclose()
    manager = getattr(redis.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()
