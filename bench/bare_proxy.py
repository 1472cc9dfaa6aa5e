"""The least a Python proxy on the router's stack can be: uvloop, httptools and msgspec, and
nothing else (no uvicorn, no logging, no metrics, no config, no routing, no state).

    UPSTREAM=http://127.0.0.1:11434 python bench/bare_proxy.py PORT

Each request is parsed, its JSON body decoded, and relayed whole over a fresh connection to
UPSTREAM; the upstream's answer goes back byte for byte. It exists to be measured
(`python bench/idle_rss.py --bare`): its idle memory is the floor under the router's, the
part no change to the router can take away. Not a server to deploy.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import cast
from urllib.parse import urlsplit

import httptools
import msgspec
import uvloop


class Upstream(asyncio.Protocol):
    """One request's connection to the upstream: collects the answer until its end."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.raw = bytearray()
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        self.raw += data
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.answer.set_result(bytes(self.raw))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc or ConnectionError("upstream closed"))


class Client(asyncio.Protocol):
    """One client connection: each complete request is relayed, its answer written back."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio's subclasses

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        asyncio.ensure_future(self.relay(self.url, self.body))
        self.url, self.body = b"", b""

    async def relay(self, url: bytes, body: bytes) -> None:
        if body:
            msgspec.json.decode(body)
        loop = asyncio.get_running_loop()
        transport, upstream = await loop.create_connection(Upstream, self.host, self.port)
        head = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        transport.write(head % (url, self.host.encode(), len(body)) + body)
        try:
            self.transport.write(await upstream.answer)
        finally:
            transport.close()


async def serve(port: int, upstream: str) -> None:
    target = urlsplit(upstream)
    host, upstream_port = target.hostname or "127.0.0.1", target.port or 80
    server = await asyncio.get_running_loop().create_server(lambda: Client(host, upstream_port), "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), os.environ["UPSTREAM"]))
