"""Rerank (`POST /v1/rerank` and `/rerank`, as vLLM and llama.cpp serve it): its body check.

Only OpenAI-type backends serve it (route_types.py); `/rerank`, outside `/v1`, answers
errors in Ollama's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

from .errors import ApiError


def check(body: Mapping[str, object]) -> None:
    """Validate a rerank request's JSON body (400 in OpenAI's shape)."""
    if not isinstance(body.get("query"), str):
        raise ApiError(400, "query is required and must be a string", param="query")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise ApiError(400, "documents must be a non-empty list", param="documents")
    if body.get("top_n") is not None and not _is_int(body["top_n"]):
        raise ApiError(400, "top_n must be an integer", param="top_n")


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)
