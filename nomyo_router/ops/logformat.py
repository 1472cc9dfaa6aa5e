"""How every log line of the router looks: `key: message` text, or one JSON object per line
(`log_format: json`), for the supervisor and every worker, uvicorn's loggers and the router's
alike.

uvicorn configures logging in each process it starts (the supervisor, and every worker again:
workers are spawned, so nothing set up in the supervisor reaches them) from the `log_config`
it is given; `config` is that: one handler on the root logger, writing to stderr, and
uvicorn's loggers passing their records up to it instead of holding handlers of their own.
Before this, a worker's root logger had no handler at all, so Python's last-resort handler
showed WARNING and above only, and the access lines were logged at WARNING to be seen.

A JSON line has `time` (UTC, ISO 8601 with milliseconds), `level`, `logger` and `message`,
`exception` when a traceback goes with it, and an access line's fields (`accesslog.py`
hands them over as the record's `access` attribute). A reload that changes `log_format`
swaps the formatter of that handler (`use`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# (`default=str`: a value of an odd type is written as its text, never a logging error)
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, default=str).encode


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, printable ASCII on one physical line (every newline of a
    message or a traceback escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        created = record.created
        out: dict[str, Any] = {
            "time": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(created))}.{int(created % 1 * 1000):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if access is not None:
            out.update(access)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return _JSON(out)


FORMATTERS: dict[str, type[logging.Formatter]] = {"text": TextFormatter, "json": JsonFormatter}


def config(fmt: str, level: str) -> dict[str, Any]:
    """uvicorn's `log_config` (a `logging.config.dictConfig` mapping) for `log_format: fmt`
    at `level` ("info", ...): picklable, so every spawned worker applies it too."""
    name = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        # (uvicorn sets `use_colors` on these two when told to; never here, but keep the names)
        "formatters": {
            "default": {"()": f"{__name__}.{FORMATTERS[fmt].__name__}"},
            "access": {"()": f"{__name__}.{FORMATTERS[fmt].__name__}"},
        },
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "default"}
        },
        "root": {"level": name, "handlers": ["stderr"]},
        "loggers": {
            "uvicorn": {"level": name, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": name, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": name, "handlers": [], "propagate": True},
        },
    }


def fallback(fmt: str) -> None:
    """Served by something else than `nomyo-router` (plain uvicorn, which configures its own
    loggers only): the router's lines, the access lines at INFO among them, still go to stderr
    as `fmt`, through a handler on the root logger when nothing else set one up. uvicorn's
    own lines keep the look uvicorn gives them."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(FORMATTERS[fmt]())
    root.addHandler(handler)
    ours = logging.getLogger("nomyo_router")
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)


def use(fmt: str) -> None:
    """Write this process's lines as `fmt` from now on (a reload changed `log_format`): the
    formatter of each handler `config` installed is replaced; others (a test's capture) are
    left alone."""
    for handler in logging.getLogger().handlers:
        current = handler.formatter
        if isinstance(current, (TextFormatter, JsonFormatter)) and not isinstance(current, FORMATTERS[fmt]):
            handler.setFormatter(FORMATTERS[fmt]())
