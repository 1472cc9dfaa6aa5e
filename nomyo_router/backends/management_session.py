"""The aiohttp session of model management (api/manage.py), made when first needed.

Every other upstream call goes through the process's one `h1.Upstream`. Model management
streams request bodies of any size (blob uploads) and sends HEAD requests, which that client
does not do; it is rare, so aiohttp (~10 MB of a worker's memory once imported) is imported
only by a worker that is asked to manage models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import RouterConfig

if TYPE_CHECKING:
    import aiohttp


class ManageSession:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = create_session(self.config)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def create_session(config: RouterConfig) -> aiohttp.ClientSession:
    import aiohttp

    # limit=0: admission is ours; aiohttp's default of 100 would silently cap concurrent streams.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=75)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout),
        # Bodies are relayed as they come; each endpoint's headers ask for no compression
        # (Endpoint.headers). Not `skip_auto_headers`: it costs ~7% of a request's CPU.
        auto_decompress=False,
        raise_for_status=False,
    )
