"""The config checks that are not a key's declaration: reading the declaration back (its
expected-value text, its secrets), turning msgspec's errors into messages that name the key,
the value and the fix, unknown keys with the nearest valid name, `${ENV}` expansion, URLs
with credentials, and client keys.

Kept apart from the `config` package so that stays the one declaration of every key; this module
does not import it (the declaration is handed in), so the two cannot import each other.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import operator
import os
import re
import types
import typing
from collections.abc import Iterable, Iterator
from typing import Literal, Union
from urllib.parse import unquote, urlsplit, urlunsplit

import msgspec

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_AT_RE = re.compile(r"^(?P<what>.*) - at `\$(?P<path>[^`]*)`$", re.S)
_STEP_RE = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")
_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


class ConfigError(ValueError):
    """A bad configuration; the message names the key and the fix, one line per problem."""

    @property
    def problems(self) -> list[str]:
        return str(self).split("\n")

    @property
    def one_line(self) -> str:
        """Every problem on one line, for a log line or an answer."""
        return "; ".join(self.problems)


class Problems:
    """Every problem of a file, found in one run: `with problems.check():` around each check
    notes its ConfigError and goes on; `raise_any` raises them all as one."""

    def __init__(self) -> None:
        self.found: list[str] = []

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except ConfigError as e:
            self.found.extend(e.problems)

    def raise_any(self) -> None:
        if self.found:
            raise ConfigError("\n".join(dict.fromkeys(self.found)))  # (each once, in order)


class Spec:
    """One declared type, read back: its base type, its constraints and its documentation,
    merged over the `Meta` annotations it carries (msgspec accepts several)."""

    def __init__(self, tp: object) -> None:
        """`tp`: a type expression (a class, `Annotated[...]`, `X | None`, `Literal[...]`, ...)."""
        self.constraints: dict[str, object] = {}
        self.extra: dict[str, object] = {}
        self.description = ""
        while typing.get_origin(tp) is typing.Annotated:
            tp, *metas = typing.get_args(tp)
            for meta in metas:
                if isinstance(meta, msgspec.Meta):
                    self._merge(meta)
        args = typing.get_args(tp)
        self.optional = typing.get_origin(tp) in (Union, types.UnionType) and type(None) in args
        if self.optional:
            rest = [a for a in args if a is not type(None)]
            inner = Spec(functools.reduce(operator.or_, rest))
            self.constraints = {**inner.constraints, **self.constraints}
            self.extra = {**inner.extra, **self.extra}
            self.description = self.description or inner.description
            tp = inner.type
        self.type: object = tp

    def _merge(self, meta: msgspec.Meta) -> None:
        for name in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern"):
            if getattr(meta, name) is not None:
                self.constraints[name] = getattr(meta, name)
        self.extra.update(meta.extra or {})
        self.description = meta.description or self.description

    @property
    def secret(self) -> bool:
        return bool(self.extra.get("secret"))

    def note(self, name: str) -> str | None:
        """What the declaration's doc() says in words under `name` (expected, unit, default,
        type, group), or None."""
        value = self.extra.get(name)
        return value if isinstance(value, str) else None

    def item(self) -> Spec:
        """A list's element type (`tuple[X, ...]`)."""
        return Spec(typing.get_args(self.type)[0])

    def expected(self, article: bool = True, plain: bool = False) -> str:
        """What a valid value looks like, in words ("an integer >= 1 (bytes)"). `plain`: the
        type and bounds alone, without the key's own sentence (the reference's type column)."""
        expected = self.note("expected")
        if expected is not None and not plain:
            return expected
        tp, origin = self.type, typing.get_origin(self.type)
        if origin is Literal:
            text = "one of " + ", ".join(repr(v) for v in typing.get_args(tp))
        elif tp is bool:
            text = "true or false"
        elif tp in (int, float):
            text = ("an integer" if tp is int else "a number") if article else ("integer" if tp is int else "number")
            c = self.constraints
            if "ge" in c and "le" in c:
                text += f" between {c['ge']} and {c['le']}"
            else:
                text += " and".join(f" {sign} {c[k]}" for k, sign in _BOUNDS if k in c)
        elif tp is str:  # (a pattern is said by the key's own sentence, never as a regex)
            text = "non-empty string" if self.constraints.get("min_length") else "string"
            text = f"a {text}" if article else text
        elif origin is tuple:
            text = ("a list of " if article else "list of ") + self.item().expected(False, plain) + "s"
        elif isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            text = "a mapping" if article else "mapping"
        else:
            text = str(tp)
        unit = self.note("unit")
        return f"{text} ({unit})" if unit else text


@functools.cache
def specs(struct: type) -> dict[str, Spec]:
    """Every field of a config Struct, by name, read back once."""
    return {f.name: Spec(f.type) for f in msgspec.structs.fields(struct)}


def defaults(struct: type) -> dict[str, object]:
    """Every field of a config Struct's default, by name (msgspec.NODEFAULT where it has none)."""
    return {f.name: f.default for f in msgspec.structs.fields(struct)}


def accepted_keys(struct: type) -> list[str]:
    """The keys a file may give: every field but those the router derives itself."""
    return [name for name, spec in specs(struct).items() if not spec.extra.get("derived")]


def refuse_unknown(where: str, given: Iterable[object], allowed: Iterable[str], listed: bool = True) -> None:
    """`max_queu: unknown key; did you mean max_queue?` for every key not in `allowed`."""
    allowed = list(allowed)
    unknown = sorted((k for k in given if k not in allowed), key=str)
    if not unknown:
        return
    import difflib  # (only when a key is wrong: not held by every idle process)

    problems = []
    for key in unknown:
        near = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        fix = (
            f"did you mean {near[0]}?"
            if near
            else f"valid keys: {', '.join(allowed)}"
            if listed
            else "remove it (the valid keys are in docs/configuration.md)"
        )
        problems.append(f"{where}{key}: unknown key; {fix}")
    raise ConfigError("\n".join(problems))


def a_type(value: object) -> str:
    """ "a str", "an int": what a value is, for messages that must not show it."""
    if value is None:
        return "null"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _shown(spec: Spec, value: object) -> str:
    return a_type(value) if spec.secret else repr(value)  # (never a secret's value)


def explain(error: msgspec.ValidationError, root: type, data: object) -> ConfigError:
    """msgspec's error on converting `data` into `root`, as a message naming the key (its
    path in the file), the value given and what is expected."""
    m = _AT_RE.match(str(error))
    if m is None:
        return ConfigError(f"config: {error}")
    what, path = m.group("what"), m.group("path")
    spec, value = Spec(root), data
    for name, index in _STEP_RE.findall(path):
        if name:
            struct = spec.type
            assert isinstance(struct, type)  # (a named step is a field of a Struct)
            spec = specs(struct)[name]
            value = value.get(name) if isinstance(value, dict) else None
        else:
            spec = spec.item()
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
    key = path.lstrip(".") or "config"
    missing = re.match(r"Object missing required field `(.+)`", what)
    if missing:
        return ConfigError(f"{key}: '{missing.group(1)}' is required")
    unknown = re.match(r"Object contains unknown field `(.+)`", what)
    if unknown:
        return ConfigError(f"{key}.{unknown.group(1)}: unknown key; remove it")
    if not path:
        return ConfigError(f"config: {what}")
    return ConfigError(f"{key}: expected {spec.expected()}, got {_shown(spec, value)}")


def error_path(error: msgspec.ValidationError) -> list[str | int] | None:
    """Where in the data msgspec's error is: its steps (a key, a list index), or None when
    the message names no place."""
    m = _AT_RE.match(str(error))
    if m is None:
        return None
    return [name or int(index) for name, index in _STEP_RE.findall(m.group("path"))]


def expand_env(value: str, where: str) -> str:
    """`${NAME}` and `${NAME:-default}` from the environment, so a file need not hold keys.
    As in the shell, the default also stands in for a variable set but empty (what compose
    passes for an unset `${NAME:-}`)."""

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        value = os.environ.get(name)
        if value or (value is not None and default is None):
            return value
        if default is not None:
            return default
        raise ConfigError(
            f"{where}: environment variable ${{{name}}} is not set; export it or write ${{{name}:-default}}"
        )

    return _ENV_RE.sub(sub, value)


def check_url(key: str, url: object) -> str:
    """An http(s) URL with a host and a numeric port if any: the shape msgspec cannot check."""
    if not isinstance(url, str):
        raise ConfigError(f"{key}: expected a URL such as http://127.0.0.1:11434, got {a_type(url)}")
    shown = redact_url(url.strip())
    try:
        parts = urlsplit(url.strip())
    except ValueError as e:  # (an unbalanced [ of an IPv6 address)
        raise ConfigError(f"{key}: {shown!r} is not a URL: {e}") from None
    port = parts.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
    if port and not port.isdigit():
        raise ConfigError(f"{key}: the port in {shown!r} is not a number")
    if port and not 1 <= int(port) <= 65535:
        raise ConfigError(f"{key}: the port in {shown!r} is not in 1..65535")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {shown!r}")
    return url.strip().rstrip("/")


def redact_url(url: str) -> str:
    """The url as it may be printed: `user:pass@` becomes `***@`."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***@" + url.rpartition("@")[2] if "@" in url else url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{path}"


def split_userinfo(url: str) -> tuple[str, str | None]:
    """(the url without `user:pass@`, "user:pass" percent-decoded or None). Credentials in a
    url must never reach the Host header, a log line or an error message: they are sent as
    `Authorization: Basic` instead (what curl and browsers do with them)."""
    parts = urlsplit(url)
    if parts.username is None and "@" not in parts.netloc:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    return urlunsplit(parts._replace(netloc=host)), f"{user}:{password}"


def default_name(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def digest_of(key: str) -> bytes:
    """The stored form of a key from the config: `sha256:<hex>` as given, else hashed."""
    if key.startswith("sha256:"):
        return bytes.fromhex(key[7:])
    return hashlib.sha256(key.encode()).digest()


def check_key(where: str, value: object) -> str:
    """A client, admin or metrics key: long enough to resist guessing, or its sha256: form.
    Explicit rather than declared: the value is `${ENV}`-expanded first and never shown."""
    if not isinstance(value, str) or not value.strip():
        shown = "an empty string" if isinstance(value, str) else a_type(value)  # (never the value)
        raise ConfigError(f"{where}: expected a non-empty key (or sha256:<64 hex digits>), got {shown}")
    value = expand_env(value.strip(), where)
    if value.startswith("sha256:"):
        digest = value[7:]
        if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
            raise ConfigError(f"{where}: a hashed key is sha256: followed by 64 hex digits")
    elif len(value) < 8:
        raise ConfigError(
            f"{where}: a key of {len(value)} characters is too easy to guess; use at least 8 (16 or more recommended)"
        )
    return value


def one_holder_per_key(named: list[tuple[str, str]]) -> None:
    """One key, one holder. The router knows a caller by its key's digest, so a key given twice
    (as written, or once as sha256:<hex>) would quietly make one holder the other: a client
    key equal to admin_key is an admin, two clients on one key are one client in usage and
    limits. Refused at --check and start-up, naming both holders and never the key."""
    holders: dict[bytes, str] = {}
    for who, key in named:
        digest = digest_of(key)
        if digest in holders:
            raise ConfigError(
                f"{holders[digest]} and {who} have the same key (compared after hashing: a key "
                f"and its sha256: form are one key); give each its own key"
            )
        holders[digest] = who
