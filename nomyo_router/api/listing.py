"""Read-only routes answered from what discovery knows: merged model lists, version, health."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from .. import h1
from ..domain import Endpoint, model_key
from ..state import StateStore
from .access import Client
from .errors import ApiError
from .requests import load_json

DEFAULT_OLLAMA_VERSION = "0.12.6"
Visible = Callable[[str], bool] | None  # model key -> may this caller see it; None: everything


def visible_to(client: Client | None) -> Visible:
    """What a client key may see of the models: the models it may use (a key limited to some
    models learns nothing of the others, not even that they exist)."""
    if client is None or client.models is None:
        return None
    return client.may_use


def _entry_key(e: dict[str, Any]) -> str:
    return model_key(str(e.get("model") or e.get("name") or ""))


def _dedupe(entries: list[dict[str, Any]], visible: Visible = None) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for e in entries:
        key = _entry_key(e)
        if key not in seen and (visible is None or visible(key)):
            seen.add(key)
            out.append(e)
    return out


def tags(endpoints: Sequence[Endpoint], visible: Visible = None) -> bytes:
    entries: list[dict[str, Any]] = []
    for ep in endpoints:
        if ep.type == "ollama" and ep.static_models is None:
            entries += ep.tags
        else:
            created = {str(m.get("id")): m.get("created") for m in ep.openai_models}
            entries += [_named_only(ep, n, created.get(n)) for n in ep.models.values()]
    return json.dumps({"models": _dedupe(entries, visible)}).encode()


_NO_DETAILS = {
    "parent_model": "",
    "format": "",
    "family": "",
    "families": None,
    "parameter_size": "",
    "quantization_level": "",
}
_UNKNOWN_TIME = "0001-01-01T00:00:00Z"  # Go's zero time: what Ollama sends, and its CLI shows as "Never"


def _named_only(ep: Endpoint, name: str, created: object) -> dict[str, Any]:
    """An /api/tags entry for a model known only by its name (an OpenAI-type endpoint's, or a
    configured `models:` list), in the shape the ollama CLI and ollama-python read. Its digest
    is derived from the endpoint's URL and the model's name: the same on every listing and
    every router, different for another server's model of the same name (the CLI shows its
    first 12 characters as the model's ID, and fails on an empty one)."""
    modified = _UNKNOWN_TIME
    if isinstance(created, int) and not isinstance(created, bool) and 0 < created < 2**34:  # (seconds)
        modified = datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "name": name,
        "model": name,
        "modified_at": modified,
        "size": 0,
        "digest": hashlib.sha256(f"{ep.url}\n{name}".encode()).hexdigest(),
        "details": dict(_NO_DETAILS),
    }


def ps(endpoints: Sequence[Endpoint], visible: Visible = None) -> bytes:
    entries: list[dict[str, Any]] = []
    for ep in endpoints:
        entries += ep.ps
    return json.dumps({"models": _dedupe(entries, visible)}).encode()


def _model_objects(endpoints: Sequence[Endpoint], visible: Visible = None) -> list[dict[str, Any]]:
    """OpenAI model objects as the backends describe them: an OpenAI-type backend's own entry
    (its `created`, `owned_by`), an Ollama model as Ollama's `/v1/models` shows it (created
    from `modified_at`, owned by "library"); first endpoint wins for a name."""
    seen: set[str] = set()
    data = []
    for ep in endpoints:
        own = {model_key(str(m["id"])): m for m in ep.openai_models}
        modified = {model_key(str(t.get("model") or t.get("name") or "")): t.get("modified_at") for t in ep.tags}
        for key, name in ep.models.items():
            if key in seen or (visible is not None and not visible(key)):
                continue
            seen.add(key)
            entry = own.get(key)
            if entry is None:
                entry = {"id": name, "object": "model", "created": _epoch(modified.get(key)), "owned_by": "library"}
            data.append(entry)
    return data


def _epoch(iso: Any) -> int:
    if isinstance(iso, str):
        try:
            return int(datetime.fromisoformat(_trim_fraction(iso)).timestamp())
        except ValueError:
            pass
    return 0


def _trim_fraction(iso: str) -> str:
    """Python 3.11 parses at most 6 fractional digits; Ollama sends 9."""
    iso = iso.replace("Z", "+00:00")
    head, dot, rest = iso.partition(".")
    if not dot:
        return iso
    digits = "".join(c for c in rest if c.isdigit())
    return f"{head}.{digits[:6]}{rest[len(digits) :]}"


def openai_models(endpoints: Sequence[Endpoint], visible: Visible = None) -> bytes:
    return json.dumps({"object": "list", "data": _model_objects(endpoints, visible)}).encode()


def openai_model(endpoints: Sequence[Endpoint], model_id: str, visible: Visible = None) -> tuple[int, bytes]:
    """GET /v1/models/{id} (what the openai clients' models.retrieve calls); a model the
    caller may not see is answered exactly as an absent one."""
    key = model_key(model_id)
    for entry in _model_objects(endpoints, visible):
        if model_key(str(entry["id"])) == key:
            return 200, json.dumps({**entry, "id": model_id}).encode()  # the id as asked, like Ollama
    return 404, json.dumps(
        {
            "error": {
                "message": f"The model '{model_id}' does not exist",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
        }
    ).encode()


def version(endpoints: Sequence[Endpoint]) -> bytes:
    versions = [ep.version for ep in endpoints if ep.version]
    best = max(versions, key=_version_tuple) if versions else DEFAULT_OLLAMA_VERSION
    return json.dumps({"version": best}).encode()


class _Lag(Protocol):
    def recent_max(self) -> float: ...


class Verdicts(Protocol):
    """What /health shows of the process's health verdicts (upstream/health.Health)."""

    @property
    def lag(self) -> _Lag:
        """The event loop's lag."""

    def snapshot(self) -> Mapping[str, object]:
        """Each endpoint's health row, by name."""

    def failing(self, name: str) -> bool:
        """In rotation (the last endpoint of a model) but failing request after request."""


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("-")[0].split("."):
        parts.append(int(p) if p.isdigit() else 0)
    return tuple(parts)


def ready(endpoints: Sequence[Endpoint], store: StateStore) -> bool:
    """Whether this router can serve: at least one backend is healthy. The state store needs
    no check of its own: when Redis stalls or the workers' host dies, the store serves under
    each process's own limits until it is back (degraded by design), so it never stops a
    request on its own."""
    return any(store.is_healthy(ep) and ep.type is not None for ep in endpoints)


async def health(
    endpoints: Sequence[Endpoint], store: StateStore, verdicts: Verdicts | None = None, details: bool = True
) -> tuple[int, bytes]:
    """`verdicts`: the process's `Health` (ejection state per endpoint, event-loop lag).
    Without `details`, only whether the router is up: {"status": "ok" | "degraded" |
    "unavailable"}; "degraded" (200): the endpoints in rotation are all failing (each the last
    of a model, kept in rotation: backends/health.py)."""
    if not details:
        routed = [ep for ep in endpoints if store.is_healthy(ep) and ep.type is not None]
        if any(verdicts is None or not verdicts.failing(ep.name) for ep in routed):
            return 200, b'{"status":"ok"}'
        return (200, b'{"status":"degraded"}') if routed else (503, b'{"status":"unavailable"}')
    snap = await store.snapshot()
    in_flight = snap.get("in_flight", {})
    states = verdicts.snapshot() if verdicts is not None else {}
    rows = [
        {
            "name": ep.name,
            "type": ep.type,
            "healthy": store.is_healthy(ep) and ep.type is not None and not (verdicts and verdicts.failing(ep.name)),
            "in_flight": in_flight.get(ep.name, 0),
            "slots": ep.slots,
            "models": sorted(ep.models.values()),
            **({"health": states[ep.name]} if ep.name in states else {}),
        }
        for ep in endpoints
    ]
    ok = any(r["healthy"] for r in rows)
    in_rotation = ok or any(store.is_healthy(ep) and ep.type is not None for ep in endpoints)
    body = {
        "status": "ok" if ok else "degraded" if in_rotation else "unavailable",
        "state": snap.get("mode"),
        "queue_length": snap.get("queue_length", 0),
        "pins": snap.get("pins"),
        "endpoints": rows,
    }
    body["usage"] = snap.get("usage", {})
    if verdicts is not None:
        body["loop_lag_ms"] = round(verdicts.lag.recent_max() * 1000, 1)
    if "degraded" in snap:
        body["degraded"], body["degraded_events"] = snap["degraded"], snap["degraded_events"]
        body["instances"] = snap.get("instances", 0)  # (what a degraded instance's share is by)
    return (200 if in_rotation else 503), json.dumps(body).encode()


async def show(
    raw: bytes,
    endpoints: Sequence[Endpoint],
    store: StateStore,
    upstream: h1.Upstream,
    visible: Visible = None,
    counted: Callable[[], Awaitable[None]] | None = None,
) -> tuple[int, bytes]:
    """/api/show from an Ollama endpoint that has the model (no slot: it is metadata).
    `counted`: awaited once the request is known to be valid (a limited key's rpm)."""
    body = load_json(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("model") not in (None, "") and body.get("name") not in (None, ""):
        # one name per request (Ollama's CLI sends both fields, one of them empty)
        raise ApiError(400, "give the model as `model` or as `name`, not both", param="name")
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required")
    key = model_key(model)
    serving = [ep for ep in endpoints if ep.serves(key)] if visible is None or visible(key) else []
    if not serving:
        raise ApiError(404, f"model '{model}' not found")
    if counted is not None:
        await counted()
    for ep in sorted(serving, key=lambda e: not store.is_healthy(e)):
        if ep.type != "ollama":
            continue
        try:
            status, _, data = await upstream.fetch(ep, "/api/show", raw, total=10)
            return status, data
        except (h1.ClientError, TimeoutError):
            continue
    # Only OpenAI-type backends serve it: describe what we know.
    return 200, json.dumps(
        {
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": {"format": "", "family": "", "families": None},
            "model_info": {},
            "capabilities": ["completion"],
        }
    ).encode()
