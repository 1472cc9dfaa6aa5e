"""How a config key is declared: `doc()` (its one line of documentation and what the
reference and the error messages need besides), the value shapes many keys share, and the
base every config struct derives from."""

from typing import Annotated

import msgspec
from msgspec import Meta

from ..config_checks import specs

__all__ = [
    "Bytes",
    "ConfigStruct",
    "Count",
    "Key",
    "Millis",
    "Name",
    "Names",
    "Secret",
    "Seconds",
    "SecondsOrOff",
    "Slots",
    "doc",
]


def doc(text: str, group: str = "", **extra: object) -> Meta:
    """One key's documentation, read by the error messages and by config_doc. `extra` may say
    `expected` (valid values in words, when the type alone does not), `unit`, `default` and
    `type` (in words, for the reference, when the declaration's own would mislead), `secret`
    (never printed) or `derived` (set by the router from other keys, not a key of the file)."""
    if group:
        extra["group"] = group
    return Meta(description=text, extra=extra or None)


# value shapes shared by many keys; their bounds are part of each key's declaration
Slots = Annotated[int, Meta(ge=1)]
Count = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0, extra={"unit": "seconds"})]
# redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?options] (state/redis_url.py)
SENTINEL_URL = r"^redis\+sentinel://([^@/]*@)?[^/,@]+:[0-9]+(,[^/,@]+:[0-9]+)*/[^/?]+(/[0-9]+)?(\?|\Z)"
SecondsOrOff = Annotated[float, Meta(ge=0, extra={"unit": "seconds"})]
Millis = Annotated[float, Meta(ge=0, extra={"unit": "ms"})]
Bytes = Annotated[int, Meta(ge=1024, extra={"unit": "bytes"})]
Name = Annotated[str, Meta(min_length=1)]
Names = Annotated[tuple[Name, ...], Meta(min_length=1)]
Key = Annotated[
    str, Meta(extra={"secret": True, "expected": "a key of 8 or more characters, or sha256:<64 hex digits>"})
]
Secret = Key | None


class ConfigStruct(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The config structs' base: printed with every field but its secrets, which show only
    whether they are set ('***'), so a config in a log line or a traceback leaks no key."""

    def __rich_repr__(self) -> list[tuple[str, object]]:
        shown: list[tuple[str, object]] = []
        for name, spec in specs(type(self)).items():
            value = getattr(self, name)
            shown.append((name, ("***" if value is not None else None) if spec.secret else value))
        return shown

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__rich_repr__())})"
