"""Errors, in the caller's API shape, as one way out: the router's own refusal or failure
(`Exchange.fail`: to the client's own `send`) and a backend's error answer passed on when no
endpoint answered (the proxy's last resort: through the exchange's `send`, which a wrapper
such as trim-and-retry reads). A stream that breaks after its head ends with a last record in
its own format instead, written by the stream's relay (`sinks.stream_error`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import ReadyAnswer

if TYPE_CHECKING:
    from .exchange import Exchange


class Failed:
    name = "error"

    async def deliver(self, ex: Exchange, answer: ReadyAnswer) -> None:
        await ex.whole(answer.status, answer.body, answer.headers, answer.content_type)


FAILED = Failed()
