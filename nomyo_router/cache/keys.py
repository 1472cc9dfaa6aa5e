"""Which requests use the response cache, and the key of the answer each one asks for.

A request opts in with NOMYO's body field `"nomyo": {"cache": true}` or the header
`X-Router-Response-Cache: use`. The `nomyo` field belongs to the router: it is taken out of
every body before the request is forwarded, opted in or not, cache on or off.

The key is the SHA-256 of canonical JSON (sorted keys, no whitespace, integral floats as
integers) of the route, the client key's name and the whole request body but the fields that
shape only the delivery (`stream`, `stream_options`, `keep_alive`, `nomyo`). So two requests
share an answer only when everything that can change the answer is the same: messages,
options, sampling parameters, tools, format, seed. A different client key never sees
another's answers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..api.requests import GenRequest

HEADER = b"x-router-response-cache"
FIELD = "nomyo"
MOE_PREFIX = "moe-"
# The routes whose answers are kept: text generation and embeddings of both APIs.
CACHEABLE = frozenset(
    (
        "/api/chat",
        "/api/generate",
        "/api/embed",
        "/api/embeddings",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
    )
)
# Fields that shape how an answer is delivered, not what it says.
DELIVERY = frozenset(("stream", "stream_options", "keep_alive", FIELD))
_MISSING = object()


def take_field(req: GenRequest) -> bool:
    """Take NOMYO's `nomyo` field out of the body (the backend never sees it); True when it
    asks for the cache (`{"cache": true}`)."""
    field = req.body.pop(FIELD, _MISSING)
    if field is _MISSING:
        return False
    req.raw = json.dumps(req.body).encode()
    return isinstance(field, dict) and field.get("cache") is True


def cacheable(req: GenRequest) -> bool:
    """May this request's answer be kept? Not an ensemble's (each is asked afresh), not one
    asking for log-probabilities (not kept), nor a route whose answers are not text or vectors."""
    return (
        req.path in CACHEABLE
        and not req.model.startswith(MOE_PREFIX)
        and not req.body.get("logprobs")
        and req.ctype is None
    )


def canonical(value: object) -> object:
    """`value` with every integral float as an int (`1.0` and `1` mean the same temperature)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def request_key(req: GenRequest, namespace: str, body: dict[str, Any] | None = None) -> str:
    """The key of `req`'s answer in `namespace` (the client key's name). `body`: what to key
    instead of the whole request body (semantic mode keys all but the question)."""
    if body is None:
        body = {k: v for k, v in req.body.items() if k not in DELIVERY}
    body = {**body, "model": req.key}  # (llama3 and llama3:latest are one model)
    text = json.dumps(
        [req.path, namespace, canonical(body)],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=True,
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
