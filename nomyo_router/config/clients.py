"""One client's keys: an entry of `client_keys`."""

from typing import Annotated

from msgspec import Meta

from .declare import ConfigStruct, Key, Name, Slots, doc

__all__ = ["ClientKey"]


class ClientKey(ConfigStruct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One client: an entry of `client_keys`."""

    name: Annotated[Name, doc("the client, in usage, logs and metrics; unique; not default, admin or metrics")]
    key: Annotated[
        Key,
        doc(
            "its key: sent as Authorization: Bearer KEY or x-api-key: KEY; ${ENV} "
            "expanded; sha256:<hex> stores only its hash"
        ),
    ]
    models: Annotated[
        tuple[Name, ...] | None,
        doc("the models it may use (403 for others)", expected="a list of model names", default="all"),
    ] = None
    max_concurrent: Annotated[
        Slots | None,
        doc(
            "its requests holding or waiting for a slot; more wait aside, so others are not queued behind it",
            default="no cap",
        ),
    ] = None
    priority: Annotated[
        Annotated[int, Meta(ge=-100, le=100)],
        doc("its waiting requests are served before those of keys with a lower priority (strict)"),
    ] = 0
    weight: Annotated[
        Annotated[float, Meta(gt=0, le=1000)],
        doc("its share of the slots among waiting keys of its priority (weighted fair queuing; FIFO within the key)"),
    ] = 1.0
    rpm: Annotated[
        Slots | None,
        doc(
            "requests it may start in any rolling 60 s, across workers and instances; beyond: 429 "
            "rate_limit_exceeded with Retry-After",
            default="no limit",
        ),
    ] = None
    tpm: Annotated[
        Slots | None,
        doc(
            "tokens (prompt + completion) per rolling 60 s; a request is admitted while the last minute's "
            "tokens plus those its requests in progress reserved are below it, and reserves what it may spend "
            "(its prompt and max_tokens, else 1024 for the answer), settled to what it used when it ends",
            unit="tokens",
            default="no limit",
        ),
    ] = None
    tokens_per_day: Annotated[
        Slots | None,
        doc(
            "tokens per calendar day (UTC), counted like tpm and kept across restarts (the usage database, or "
            "Redis); once spent: 429 insufficient_quota until midnight UTC",
            unit="tokens",
            default="no limit",
        ),
    ] = None
    debug_headers: Annotated[
        bool,
        doc(
            "its answers carry the routing headers (X-Router-Endpoint, X-Router-Affinity, X-Router-Cache), "
            "which tell where other keys' conversations and prompts went; only for a trusted key"
        ),
    ] = False
