"""The one aiohttp session per process for all upstream calls."""

from __future__ import annotations

import aiohttp

from ..config import RouterConfig


def create_session(config: RouterConfig) -> aiohttp.ClientSession:
    # limit=0: admission is ours; aiohttp's default of 100 would silently cap concurrent streams.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300,
                                     keepalive_timeout=75)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout),
        # Backends are asked not to compress, and bodies are relayed as they come.
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
        raise_for_status=False,
    )
