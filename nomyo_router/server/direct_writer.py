"""What the relays need of the server's direct writer (`body_writer.BodyWriter`, which the
router's own protocol puts in the request's scope): a Protocol, so the relays below the
server's layer name it without importing the server."""

from __future__ import annotations

import asyncio
from typing import Protocol


class DirectWriter(Protocol):
    """What the relays need of the server's direct writer (`body_writer.BodyWriter`)."""

    transport: asyncio.WriteTransport

    def ready(self) -> bool: ...

    def write(self, data: bytes) -> None: ...

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool: ...
