"""One record of a stream as a JSON object: an NDJSON line (Ollama) or an SSE `data:` line
(OpenAI). Used where the router must look inside a record it relays: resumption, the usage
event it strips, model-management progress."""

from __future__ import annotations

import json
from typing import Any


def parse(line: bytes, sse: bool = False) -> dict[str, Any] | None:
    """The record's JSON object; None for a blank line, an SSE comment or `[DONE]`, text that
    is not JSON, or JSON that is not an object."""
    line = line.strip()
    if sse:
        if not line.startswith(b"data:"):
            return None
        line = line[5:].strip()
    if not line or line == b"[DONE]":
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
