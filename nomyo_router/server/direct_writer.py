"""What the relays need of the server's direct writer (`body_writer.BodyWriter`, which the
router's own protocol puts in the request's scope): a Protocol, so the relays below the
server's layer name it without importing the server. The request's `Exchange` owns it (its
`writer`); the sinks write through it, and the compiled pump writes to the socket it gives."""

from __future__ import annotations

import socket
from typing import Protocol


class DirectWriter(Protocol):
    """What the relays need of the server's direct writer (`body_writer.BodyWriter`)."""

    def ready(self) -> bool: ...

    def write(self, data: bytes) -> None: ...

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool: ...

    def client_socket(self) -> socket.socket | None: ...

    def write_framed(self, data: bytes) -> None: ...

    def abort(self) -> None: ...
