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
        # Bodies are relayed as they come; each endpoint's headers ask for no compression
        # (Endpoint.headers). Not `skip_auto_headers`: it costs ~7% of a request's CPU.
        auto_decompress=False,
        raise_for_status=False,
    )
