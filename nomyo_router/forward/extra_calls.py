"""The backend calls a request makes beyond its own, counted on its client key's limits.

A request is admitted once at the door (`api/key_admission.py`: one request of the key's rpm).
Trim-and-retry's re-asks (`overflow.py`) and an ensemble's samples and review (`ensemble.py`) are
further calls to the backends on its behalf: each counts one more request against the key's
rpm, and is refused like any request past the key's rpm, tpm or daily budget (429 in the
caller's API shape), so no body buys more backend calls than its key was allowed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..api.key_admission import RateLimits, headers_of, refusal

Charge = Callable[[str | None], Awaitable[None]]


def charger(limits: RateLimits) -> Charge:
    """`charge(client)`: count one more call of `client` (nothing for a key without limits);
    raises the key's 429 `ApiError` when a limit refuses it."""

    async def charge(client: str | None) -> None:
        got = limits.by_client.get(client) if client is not None else None
        if client is None or got is None:
            return
        v = await limits.store.admit(client, got)
        limits.last[client] = v
        if v.refused is not None:
            raise refusal(got, v, headers_of(got, v))

    return charge
