"""What the upstream client (`h1`) raises, and the small types it takes and returns besides
a `Response`; all of them are also reachable as `h1.<name>`."""

from __future__ import annotations

from typing import NamedTuple, TypeVar, overload

_T = TypeVar("_T")


class ClientError(Exception):
    """Any failure of an upstream call other than a timeout."""


class Unreachable(ClientError):
    """Could not connect: the backend is not there."""


class OutOfDescriptors(ClientError):
    """Could not connect because this process (or the system) is out of file descriptors:
    the router's own shortage, never counted against the backend (`descriptors.py`)."""


class Disconnected(ClientError):
    """The connection closed before the answer's status line."""


class Cut(ClientError):
    """The connection closed in the middle of the answer's body."""


class TooLarge(ClientError):
    """The backend sent more than the router holds: a stream record longer than
    `max_record_bytes`, or a whole answer it must hold (translation) beyond
    `max_response_bytes`. Not a cut: a stream is not resumed elsewhere (another backend would
    likely send the same), it ends with an error record. `code`: the access log's error."""

    def __init__(self, message: str, code: str = "record_too_large") -> None:
        super().__init__(message)
        self.code = code


class ErrorRecord(ClientError):
    """An error record inside a 200 stream (`{"error": ...}`: Ollama's crashed model runner,
    `data: {"error": {...}}` from an OpenAI-compatible server): the backend failed mid-answer
    after its 200 head went out (error_record.py). Treated as the stream cut at that record.
    Raised by the relays (relay/pump.py), not by `h1` itself.
    `record`: its bytes as the backend sent them, relayed to the client when the stream is not
    resumed elsewhere. `code`: the access log's error."""

    code = "backend_error_record"

    def __init__(self, record: bytes) -> None:
        super().__init__(record.strip()[:200].decode("utf-8", "replace"))
        self.record = record


def record_too_large(limit: int) -> TooLarge:
    return TooLarge(f"a stream record longer than max_record_bytes ({limit} bytes)")


class Timeout(NamedTuple):
    """Connect and per-read limits in seconds (None: none); the names of aiohttp's `ClientTimeout`."""

    sock_connect: float | None = None
    sock_read: float | None = None


class Headers(dict[str, str]):
    """Response headers, names lower-cased; `get` is case-insensitive like aiohttp's for the
    callers that are interpreted. The router's own code asks with lower-case names: compiled
    (the compiled build), a call to a `dict` subclass's `get` is `dict.get` itself."""

    @overload
    def get(self, name: str, default: None = None, /) -> str | None: ...
    @overload
    def get(self, name: str, default: str, /) -> str: ...
    @overload
    def get(self, name: str, default: _T, /) -> str | _T: ...

    def get(self, name: str, default: object = None, /) -> object:
        return dict.get(self, name.lower(), default)
