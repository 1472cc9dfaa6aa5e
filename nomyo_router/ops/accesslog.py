"""One access line per request, written by the router from its `RequestRecord`.

uvicorn's own access line knows nothing of models, endpoints, queues or tokens; this one is
written by every worker on the `nomyo_router.access` logger at INFO, as text or, with
`log_format: json`, as fields of the line's JSON object (`logformat.py` writes it: `time`,
`level`, `logger`, `message` and these). It never contains prompt text.

Some values come from the client (the model name is from the request body) or from the
config (a client key's name), so a line must not be forgeable: a model named
`x status=200` or `x\\n...` would otherwise add a field or a whole line for log readers to
believe. So each request gives exactly one physical line of printable ASCII, and each key
appears at most once (a key whose value is unknown is left out of a text line; JSON has it
as null):

- text: `key=value` pairs separated by one space. A value that is not a plain token — empty,
  or holding a space, `=`, `"`, a backslash, or any character outside printable ASCII — is
  written double-quoted with JSON's escapes and every non-ASCII character as `\\uXXXX`
  (so no raw control character, U+0085 or U+2028 line separator survives). A reader
  parses a value as a JSON string when it starts with `"`, as it is otherwise.
- json: the fields handed to the log record as its `access` attribute, encoded with the
  record's other fields by `logformat.JsonFormatter` (`ensure_ascii`: the same escapes, one
  object); the message is the route and the status.

The request id is the client's `X-Request-ID` only when that is 1–128 printable ASCII
characters without spaces (app.py), else one the router made up.

`status` is the status of the response head the client was sent; 499 (nginx's "client
closed request") when the client left before any head was sent; see `events.py`.
"""

from __future__ import annotations

import logging
import re
from json.encoder import encode_basestring_ascii

from ..events import Events, RequestRecord

log = logging.getLogger("nomyo_router.access")

# Anything that keeps a text value from standing as it is — outside printable ASCII, a space,
# `"`, `=` or a backslash — as one character class (printable ASCII but \x22 `"`, \x3d `=`,
# \x5c `\`): a third of the cost of the alternation `[^\x21-\x7e]|[="\\]`. Searched first,
# so the common plain token (an id, a model name, an endpoint name) pays a scan, no quoting.
_UNSAFE = re.compile(r"[^\x21\x23-\x3c\x3e-\x5b\x5d-\x7e]").search


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def text_value(value: object) -> str:
    """`value` as it stands in a text line: a plain token as it is, anything else quoted (JSON
    escapes, ASCII only). Numbers and booleans are plain tokens; anything else is taken as its
    `str` (a token count the backend sent as a string or a list, on the translated path)."""
    text = value if value.__class__ is str else str(value)
    return encode_basestring_ascii(text) if not text or _UNSAFE(text) else text


class AccessLog:
    def __init__(self, events: Events, fmt: str) -> None:
        self.json = fmt == "json"
        events.on_request_done(self.write)

    def write(self, rec: RequestRecord) -> None:
        if not log.isEnabledFor(logging.INFO):  # (--log-level warning: nothing to build)
            return
        fields = {
            "request_id": rec.request_id,
            "client": rec.client,
            "api": rec.api,
            "route": rec.route,
            "model": rec.model,
            "stream": rec.stream,
            "endpoint": rec.endpoint,
            "status": rec.status,
            "queue_ms": _ms(rec.queue_s),
            "ttft_ms": _ms(rec.ttft_s),
            "total_ms": _ms(rec.total_s),
            "tokens_in": rec.prompt_tokens,
            "tokens_out": rec.completion_tokens,
            "affinity": rec.affinity,
            "retries": rec.retries,
            "resumed": rec.resumed,
            "relay": rec.relay,
            "error": rec.error,
        }
        if self.json:
            log.info("%s %s", rec.route, rec.status, extra={"access": fields})
            return
        # Every value the router does not compute as a number here, scanned at once: the common
        # line is plain tokens only (the backend's token counts are among them: see `text_value`).
        r = rec
        if "" in (
            r.request_id,
            r.client,
            r.api,
            r.route,
            r.model,
            r.endpoint,
            r.affinity,
            r.relay,
            r.error,
            r.prompt_tokens,
            r.completion_tokens,
        ) or _UNSAFE(
            f"{r.request_id}{r.client}{r.api}{r.route}{r.model}{r.endpoint}{r.affinity}{r.relay}{r.error}"
            f"{r.prompt_tokens}{r.completion_tokens}"
        ):
            log.info(" ".join([f"{k}={text_value(v)}" for k, v in fields.items() if v is not None]))
        else:
            log.info(" ".join([f"{k}={v}" for k, v in fields.items() if v is not None]))
