"""The configuration reference, generated from the keys' one declaration in `config/`.

    python -m nomyo_router.config_doc > docs/configuration.md

A key's type, default and meaning are read from its msgspec field, so the reference changes
only by regenerating it; test/test_config_doc.py fails while the committed file is stale.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterator
from typing import Literal

import msgspec

from .config import INPUT_ONLY, RouterConfig
from .config_checks import Spec, specs

COMMAND = "python -m nomyo_router.config_doc > docs/configuration.md"

INTRO = f"""\
# Configuration reference

<!-- Generated from nomyo_router/config/ by `{COMMAND}`; edit the declaration there, not this file. -->

The router reads one YAML file: `nomyo-router --config PATH` (default `config.yaml`; the
workers find it in `NOMYO_ROUTER_CONFIG`). It is checked whole at start-up, by
`nomyo-router --config PATH --check` and on every reload (SIGHUP or `POST /admin/reload`):
a bad value stops start-up (a rejected reload keeps the running config) with a message naming
the key, the value given (never a key's or a password's) and what is expected, one line per
problem and every problem of the file at once. A key given twice in one mapping is refused,
naming both lines (YAML would keep the last silently). An unknown key
is refused with the nearest valid name (`max_queu: unknown key; did you mean max_queue?`).
A key given as `null` takes its default, except `usage_db`, where `null` turns accounting off.

Only `endpoints` is required. Two forms are accepted: the documented one, where an endpoint
is a mapping,

```yaml
endpoints:
  - url: http://127.0.0.1:11434
    name: gpu1
    max_concurrent: 4
  - url: http://vllm.internal:8000/v1
    type: openai
    api_key: ${{VLLM_KEY}}
```

and NOMYO's original form, a plain list of URLs with their keys in `api_keys`:

```yaml
endpoints:
  - http://127.0.0.1:11434
  - http://vllm.internal:8000/v1
api_keys:
  http://vllm.internal:8000/v1: ${{VLLM_KEY}}
max_concurrent_connections: 4
```

`${{NAME}}` and `${{NAME:-default}}` are replaced by the environment variable in keys
(`router_api_key`, `admin_key`, `metrics_key`, `client_keys[].key`) and in an endpoint's
`api_key` (and `api_keys`), so the file need not hold them; an unset variable without a
default stops start-up. An endpoint's url may carry `user:password@` (percent-encode `@` and
`:` inside them): it is sent to that backend as `Authorization: Basic`, never in its `Host`
header, and shown as `***@` wherever the url is printed.

The last column says whether a reload applies a change at once (`live`) or the change waits
for a restart (`restart`; a reload reports it).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(spec: Spec, default: object) -> str:
    """The type column: the declared type and bounds in a few words."""
    tp = spec.type
    declared = spec.note("type")
    if declared is not None:
        return declared
    item = spec.item().type if typing.get_origin(tp) is tuple else None
    if typing.get_origin(tp) is Literal:
        text = " \\| ".join(f"`{v}`" for v in typing.get_args(tp))
    elif isinstance(item, type) and issubclass(item, msgspec.Struct):
        text = "list of mappings"
    else:
        text = spec.expected(article=False, plain=True)
    if spec.optional and default is not None:  # null is a value of its own, not the default
        text += " or null"
    if spec.secret:
        text += ", secret"
    return text


def _default(spec: Spec, value: object) -> str:
    declared = spec.note("default")
    if declared is not None:
        return declared
    if value is msgspec.NODEFAULT:
        return "required"
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and spec.extra.get("unit") == "bytes" and value >= 1024:
        for size, unit in ((1 << 20, "MiB"), (1 << 10, "KiB")):
            if value % size == 0:
                return f"{value} ({value // size} {unit})"
    return str(value)


def _rows(struct: type, live: frozenset[str] | None, group: str | None) -> Iterator[str]:
    defaults = {f.name: f.default for f in msgspec.structs.fields(struct)}
    for name, spec in specs(struct).items():
        if spec.extra.get("derived") or (group is not None and spec.extra.get("group") != group):
            continue
        row = [f"`{name}`", _type(spec, defaults[name]), _default(spec, defaults[name]), _cell(spec.description)]
        if live is not None:
            row.append("live" if name in live else "restart")
        yield "| " + " | ".join(row) + " |"
        if group is not None:
            for key, (in_group, typ, meaning) in INPUT_ONLY.items():
                if in_group == group and name == "endpoints":  # NOMYO's form, next to the list it completes
                    yield f"| `{key}` | {typ} | none | {_cell(meaning)} | live |"


def _table(struct: type, live: frozenset[str] | None = None, group: str | None = None) -> list[str]:
    head = ["key", "type", "default", "meaning"] + (["on reload"] if live is not None else [])
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *_rows(struct, live, group)]


def render() -> str:
    """The whole reference, as committed in docs/configuration.md."""
    from .ops.reload import LIVE_KEYS  # (which keys a reload applies is declared there)

    fields = specs(RouterConfig)
    missing = [name for name, spec in fields.items() if spec.note("group") is None]
    if missing:
        raise ValueError(f"every RouterConfig key needs a group in its doc(): {missing}")
    groups = list(dict.fromkeys(spec.note("group") for spec in fields.values()))
    out = [INTRO]
    for group in groups:
        out += [f"## {group}", "", *_table(RouterConfig, LIVE_KEYS, group), ""]
        for name, spec in fields.items():
            if spec.extra.get("group") != group:
                continue
            if isinstance(spec.type, type) and issubclass(spec.type, msgspec.Struct):  # a mapping of keys
                out += [f"### `{name}`", "", " ".join((spec.type.__doc__ or "").split()), "", *_table(spec.type), ""]
                continue
            if typing.get_origin(spec.type) is not tuple:
                continue
            struct = spec.item().type
            if isinstance(struct, type) and issubclass(struct, msgspec.Struct):
                out += [
                    f"### `{name}[]`",
                    "",
                    _cell(struct.__doc__ or "").strip() + " A reload applies a change to any of them.",
                    "",
                    *_table(struct),
                    "",
                ]
    return "\n".join(out)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
