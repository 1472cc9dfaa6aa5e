"""One backend's keys: an entry of `endpoints`."""

import typing
from typing import Annotated, Literal

from msgspec import Meta

from .declare import ConfigStruct, Count, Name, Names, Slots, doc

__all__ = ["ENDPOINT_TYPES", "EndpointConfig", "EndpointType"]

EndpointType = Literal["ollama", "openai"]
ENDPOINT_TYPES: tuple[str, ...] = typing.get_args(EndpointType)


class EndpointConfig(ConfigStruct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One backend: an entry of `endpoints`, a URL or a mapping with these keys."""

    url: Annotated[
        str,
        doc(
            "the backend's base URL (a trailing /v1 is dropped); user:password@ in it is sent as "
            "Authorization: Basic, never in Host or a log line (percent-encode @ and : inside them)",
            expected="an http:// or https:// URL such as http://127.0.0.1:11434",
        ),
    ]
    name: Annotated[
        Name, doc("the endpoint's name in routing, /health, logs and metrics; unique", default="host:port of url")
    ]
    type: Annotated[
        EndpointType | None,
        doc(
            "its API; when omitted, detected at start (/api/version answers: ollama, else /v1/models: openai)",
            expected="one of 'ollama', 'openai' (or omit it to detect)",
            default="detected",
        ),
    ] = None
    max_concurrent: Annotated[
        Slots,
        doc("requests it serves at once (its slots); more wait in the queue", default="max_concurrent_connections"),
    ] = 2
    api_key: Annotated[
        str | None,
        doc(
            "the backend's API key, sent as a bearer token; ${ENV} expanded; not together with credentials in url",
            secret=True,
        ),
    ] = None
    models: Annotated[
        Names | None,
        doc(
            "the models it serves, given instead of discovered",
            expected="a non-empty list of model names",
            default="discovered",
        ),
    ] = None
    kv_cache_tokens: Annotated[
        Count, doc("its KV cache size in tokens: bounds what the router's prefix index believes it holds")
    ] = 131072
    kv_events: Annotated[
        Annotated[str, Meta(pattern=r"^(tcp|ipc)://")] | None,
        doc(
            "vLLM's KV-event publisher (vLLM --kv-events-config): precise cache-aware routing",
            expected="vLLM's KV-event publisher address such as tcp://127.0.0.1:5557",
        ),
    ] = None
    context_length: Annotated[
        Slots | None,
        doc(
            "its context window in tokens, for every model it serves; overrides the learned one (Ollama's "
            "/api/show and /api/ps, vLLM's max_model_len)",
            unit="tokens",
            default="learned",
        ),
    ] = None
    basic_auth: Annotated[str | None, doc("user:password taken out of url", secret=True, derived=True)] = None
