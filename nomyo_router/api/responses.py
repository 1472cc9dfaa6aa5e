"""The Responses API (`POST /v1/responses`): its body check, and where a stored answer lives.

A request is routed by model like chat (admission, queue, affinity, retries) and passed
through; Ollama v0.24 serves it as OpenAI-type backends do. A backend may store an answer
for a later request to continue with `previous_response_id`, so each answer's id is pinned
to the endpoint that produced it, as a conversation is (routing/affinity.py reads the pin).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeGuard

from .errors import ApiError

if TYPE_CHECKING:
    from ..state import StateStore

_ID = re.compile(rb'"id"\s*:\s*"([^"]{1,200})"')


def check(body: Mapping[str, object]) -> None:
    """Validate a Responses request's JSON body (400 in OpenAI's shape)."""
    value = body.get("input")
    if value is None:
        raise ApiError(400, "input is required", param="input")
    if not isinstance(value, (str, list)):
        raise ApiError(400, "input must be a string or a list of input items", param="input")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise ApiError(400, "instructions must be a string", param="instructions")
    if body.get("max_output_tokens") is not None and not _is_int(body["max_output_tokens"]):
        raise ApiError(400, "max_output_tokens must be an integer", param="max_output_tokens")


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def response_key(response_id: str) -> str:
    """The pin key of a stored answer's id."""
    return "resp:" + hashlib.blake2b(response_id.encode(), digest_size=16).hexdigest()


async def remember_response(store: StateStore, head: bytes, endpoint: str) -> None:
    """Pin a Responses answer's id to the endpoint that produced (and may have stored) it,
    so a request continuing it with `previous_response_id` goes there. The id is the first
    `"id"` of the answer (a whole response) or of its `response.created` event (a stream)."""
    m = _ID.search(head[:4096])
    if m is not None:
        await store.set_pin(response_key(m.group(1).decode("latin-1")), endpoint)
