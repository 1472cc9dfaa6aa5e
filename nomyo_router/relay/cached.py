"""The response cache's answer as one way out: bytes the cache rendered (cache/render.py), a
whole answer in one write or a stream in one piece, with no backend behind it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import ReadyAnswer

if TYPE_CHECKING:
    from .exchange import Exchange


class Cached:
    name = "cached"

    async def deliver(self, ex: Exchange, answer: ReadyAnswer) -> None:
        if not answer.stream:
            await ex.whole(answer.status, answer.body, answer.headers, answer.content_type)
            return
        headers = answer.headers
        if answer.content_type is not None:
            headers.append((b"content-type", answer.content_type))
        await ex.start(answer.status, headers)
        await ex.body(answer.body)
        await ex.end()


CACHED = Cached()
