"""One access line per request, written by the router from its `RequestRecord`.

uvicorn's own access line knows nothing of models, endpoints, queues or tokens, and its INFO
lines vanish under `--workers`; this one is written by every worker on the
`nomyo_router.access` logger (at WARNING, so it shows at the default level) as text or as
one JSON object per line (`log_format: json`). It never contains prompt text.
"""

from __future__ import annotations

import json
import logging

from ..events import Events, RequestRecord

log = logging.getLogger("nomyo_router.access")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


class AccessLog:
    def __init__(self, events: Events, fmt: str) -> None:
        self.json = fmt == "json"
        events.on_request_done(self.write)

    def write(self, rec: RequestRecord) -> None:
        fields = {"request_id": rec.request_id, "client": rec.client, "api": rec.api, "route": rec.route,
                  "model": rec.model, "stream": rec.stream, "endpoint": rec.endpoint, "status": rec.status,
                  "queue_ms": _ms(rec.queue_s), "ttft_ms": _ms(rec.ttft_s), "total_ms": _ms(rec.total_s),
                  "tokens_in": rec.prompt_tokens, "tokens_out": rec.completion_tokens,
                  "affinity": rec.affinity, "retries": rec.retries, "resumed": rec.resumed, "error": rec.error}
        if self.json:
            log.warning(json.dumps(fields, separators=(",", ":")))
        else:
            log.warning(" ".join(f"{k}={v}" for k, v in fields.items() if v is not None))
