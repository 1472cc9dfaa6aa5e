"""Which backend types serve a route that not every type serves.

A route in `ONLY_ON` is served by one backend type only: the endpoints of other types are
never chosen for it, and a model served only by them gets a 501 in the caller's shape.
Ollama v0.24 serves `/v1/messages` (OpenAI-type backends do not); rerank is served by
OpenAI-type backends (vLLM, llama.cpp), not by Ollama.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..domain import Endpoint
from .errors import ApiError

# route -> the only backend type that serves it
ONLY_ON: dict[str, str] = {"/v1/messages": "ollama", "/v1/rerank": "openai", "/rerank": "openai"}


def others(endpoints: Iterable[Endpoint], only: str, key: str, path: str, model: str) -> list[str]:
    """The endpoints serving `key` that do not serve `path` (never chosen for it); 501 when
    no endpoint of the right type serves the model."""
    serving = [ep for ep in endpoints if ep.serves(key)]
    if not any(ep.type == only for ep in serving):
        names = ", ".join(ep.name for ep in serving)
        raise ApiError(
            501,
            f"{path} is served by {'Ollama' if only == 'ollama' else 'OpenAI-type'} backends "
            f"only; model '{model}' is only on {names}, which cannot serve it",
            code="not_implemented",
        )
    return [ep.name for ep in serving if ep.type != only]
