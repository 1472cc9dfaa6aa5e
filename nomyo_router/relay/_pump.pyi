"""The compiled relay's interface (`_pump.c`, built by setup.py when a C compiler is there):
mypy reads this instead of the extension module."""

from collections.abc import Callable
from typing import Final

# run()'s events: how a stream ended or what it needs from Python
END: Final[int]
END_DIRTY: Final[int]
CUT: Final[int]
BAD: Final[int]
CLIENT: Final[int]
SENT: Final[int]
LONG: Final[int]
ERROR: Final[int]

class Pump:
    """Relays chunked streams from backend sockets to client sockets (pump.py)."""

    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    def add(
        self,
        backend_fd: int,
        client_fd: int,
        sep: bytes,
        pending: bytes,
        sent_limit: int,
        record_limit: int = 0,
        check: Callable[[bytes], int] | None = None,
        /,
    ) -> int: ...
    def run(self, most: int, /) -> list[tuple[int, int]]: ...
    def take(self, handle: int, /) -> bytes: ...
    def last(self, handle: int, /) -> float: ...
    def blocked(self, handle: int, /) -> bool: ...
    def remove(self, handle: int, /) -> tuple[bytes, bytes, bytes]: ...
    def close(self) -> None: ...

def marked(data: bytes, /) -> bool: ...
