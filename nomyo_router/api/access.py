"""Who may use the router: client keys and browser origins, checked once per request.

ClientKeys: `router_api_key` (one key, NOMYO's name) and/or `client_keys` (named keys, optionally
limited to some models). Sent as `Authorization: Bearer KEY` (openai and ollama clients,
Open WebUI) or `x-api-key: KEY` (Anthropic clients). ClientKeys are held as sha256 digests
(they may be written as `sha256:<hex>` in the file) and looked up by digest with a
constant-time comparison, so neither the file nor timing reveals them.

Origins: like Ollama's `OLLAMA_ORIGINS`, a request that carries an `Origin` header (i.e.
comes from a browser page) is accepted only from localhost origins, app://, file://,
tauri://, vscode-webview://, or an `allowed_origins` pattern; a page on any other site
cannot drive a router on localhost. CORS preflights are answered for allowed origins.

Hosts: with no client key configured (an open router), a request is answered only when its
`Host` names the router as a local client would — an IP address (the listen address, or any
other: DNS rebinding needs a name), `localhost` and `*.localhost`, `*.local`, `*.internal`,
this machine's name — or a name in `allowed_hosts`; else 421. Like Ollama's defence against
DNS rebinding: a web page whose name an attacker points at 127.0.0.1 sends its own name as
`Host`, so it cannot read an open router through the victim's browser. With client keys,
the key is the guard.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from ..config import digest_of
from ..server.asgi import Headers, Scope

if TYPE_CHECKING:
    from ..config import RouterConfig

LOCAL_HOSTS = frozenset(("localhost", "127.0.0.1", "0.0.0.0", "::1", "[::1]"))
APP_SCHEMES = ("app://", "file://", "tauri://", "vscode-webview://")
# The orchestrator's probes: answered without a key (a kubelet or a Docker HEALTHCHECK cannot
# send one) and revealing nothing but ok / not ok.
PROBE_PATHS = frozenset(("/livez", "/readyz"))
# health checks; the dashboard page (and the icon a browser asks for with it)
OPEN_PATHS = frozenset(("/health", "/", "/dashboard", "/favicon.ico")) | PROBE_PATHS
# What operators read: every client's traffic and usage. With any key configured these need
# `admin_key` or `metrics_key`; the metrics key opens nothing else.
OPERATOR_PATHS = frozenset(("/metrics", "/dashboard", "/dashboard/data"))
OPERATOR_ROLES = frozenset(("admin", "metrics"))
CORS_HEADERS = b"authorization, content-type, x-api-key, x-session-id, x-request-id, anthropic-version"
CORS_METHODS = b"GET, POST, DELETE, HEAD, OPTIONS"


@dataclass(frozen=True)
class Client:
    name: str
    models: frozenset[str] | None  # model keys (name:tag) it may use; None: all
    role: str = "client"  # client | default (router_api_key) | admin | metrics
    # Gets the routing headers that tell where a request went and why (X-Router-Endpoint,
    # -Affinity, -Cache): they describe state every key shares (the prefix index, which
    # endpoint holds what), so with `client_keys` only operators and keys with
    # `debug_headers: true` see them; one key must learn nothing of another's requests.
    routing_headers: bool = True

    def may_use(self, model_key: str) -> bool:
        return self.models is None or model_key in self.models

    @property
    def operator(self) -> bool:
        """May read every client's traffic: /metrics, the dashboard's data, /health's details."""
        return self.role in OPERATOR_ROLES


def keys_of(config: RouterConfig) -> ClientKeys | None:
    """Every key the config names, or None when the router is open."""
    from ..domain import model_key

    tenants = bool(config.client_keys)  # keys of several clients: each sees only its own
    entries: list[tuple[str, str, frozenset[str] | None, str, bool]] = []
    for role, key in (("default", config.router_api_key), ("admin", config.admin_key), ("metrics", config.metrics_key)):
        if key:
            entries.append((role, key, None, role, role in OPERATOR_ROLES or not tenants))
    entries += [
        (c.name, c.key, frozenset(model_key(m) for m in c.models) if c.models else None, "client", c.debug_headers)
        for c in config.client_keys
    ]
    # the admin and metrics keys alone do not close the router: they only unlock their routes
    return ClientKeys(entries, required=bool(config.router_api_key or config.client_keys)) if entries else None


def caps_of(config: RouterConfig) -> dict[str, int]:
    """Per-key concurrency caps (`client_keys[].max_concurrent`)."""
    return {c.name: c.max_concurrent for c in config.client_keys if c.max_concurrent}


class ClientKeys:
    def __init__(
        self, entries: Sequence[tuple[str, str, frozenset[str] | None, str, bool]], required: bool = True
    ) -> None:
        """`entries`: (name, key, models, role, sees the routing headers)."""
        self.required = required  # False: an open router that still knows the admin or metrics key
        self._by_digest = {
            digest_of(key): (digest_of(key), Client(name, models, role, shown))
            for name, key, models, role, shown in entries
        }

    def check(self, presented: bytes | None) -> Client | None:
        if not presented:
            return None
        d = hashlib.sha256(presented).digest()
        hit = self._by_digest.get(d)
        if hit is None or not hmac.compare_digest(hit[0], d):
            return None
        return hit[1]


def inspect(headers: Headers) -> tuple[bytes | None, bytes | None]:
    """(Origin, presented key) from the request headers, in one pass."""
    origin = key = None
    for name, value in headers:
        if name == b"origin":
            origin = value
        elif name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                key = token.strip()
        elif name == b"x-api-key" and key is None:
            key = value.strip()
    return origin, key


class Origins:
    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)

    def allowed(self, origin: str) -> bool:
        if origin.startswith(APP_SCHEMES):
            return True
        try:
            parts = urlsplit(origin)
            host = parts.hostname
        except ValueError:
            return False
        if parts.scheme in ("http", "https") and host in LOCAL_HOSTS:
            return True
        return any(fnmatch.fnmatchcase(origin, p) for p in self.patterns)


LOCAL_SUFFIXES = (".localhost", ".local", ".internal")  # names no public DNS answers for
_SEEN_HOSTS = 1024  # Host values remembered with their verdict (the rest are judged each time) ...
_SEEN_HOST_BYTES = 256  # ... if no longer than this: at most 256 KiB remembered


class Hosts:
    """The `Host` values an open router answers (see the module doc)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        names = {p.lower().rstrip(".") for p in patterns}
        self.names = frozenset(n for n in names if "*" not in n and "?" not in n and "[" not in n)
        self.patterns = tuple(n for n in names if n not in self.names)
        self.machine = socket.gethostname().lower()
        self._seen: dict[bytes, bool] = {}  # a request costs one lookup

    def allowed(self, host: bytes) -> bool:
        verdict = self._seen.get(host)
        if verdict is None:
            verdict = self._judge(host.decode("latin-1").lower())
            if len(self._seen) < _SEEN_HOSTS and len(host) <= _SEEN_HOST_BYTES:
                self._seen[host] = verdict
        return verdict

    def _judge(self, host: str) -> bool:
        if host.startswith("["):  # [v6]:port
            name = host[1 : host.find("]")] if "]" in host else host
        else:
            head, colon, port = host.rpartition(":")
            name = head if colon and port.isdigit() else host
        name = name.rstrip(".")
        if not name or name == "localhost" or name.endswith(LOCAL_SUFFIXES) or name == self.machine:
            return True
        if name in self.names or any(fnmatch.fnmatchcase(name, p) for p in self.patterns):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True


def cors_headers(origin: bytes) -> Headers:
    return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]


def preflight_headers(origin: bytes) -> Headers:
    return [
        *cors_headers(origin),
        (b"access-control-allow-methods", CORS_METHODS),
        (b"access-control-allow-headers", CORS_HEADERS),
        (b"access-control-max-age", b"600"),
    ]


class Operated(Protocol):
    """What `require_admin` reads of the router: its client keys and its config."""

    @property
    def keys(self) -> ClientKeys | None: ...
    @property
    def config(self) -> RouterConfig: ...


def require_admin(router: Operated, scope: Scope, what: str) -> None:
    """Operator routes that show or change what every client shares (the response cache, the
    live usage stream): open on an open router; with any key configured, the admin key only."""
    if router.keys is None:
        return
    client = scope.get("nomyo.client")
    if client is not None and client.role == "admin":
        return
    from .errors import ApiError

    if router.config.admin_key is None:
        raise ApiError(403, f"{what} needs the admin key: set admin_key in the config")
    if client is None:
        raise ApiError(401, f"{what} needs the admin key (Authorization: Bearer KEY)")
    raise ApiError(403, f"{what} needs the admin key, not a client key")
