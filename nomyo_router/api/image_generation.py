"""Image generation (`POST /v1/images/generations`): its body check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

from .errors import ApiError


def check(body: Mapping[str, object]) -> None:
    """Validate an image generation request's JSON body (400 in OpenAI's shape)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt is required and must be a string", param="prompt")
    n = body.get("n")
    if n is not None and not (_is_int(n) and n >= 1):
        raise ApiError(400, "n must be an integer >= 1", param="n")


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)
