"""The Batch API's objects in OpenAI's shapes: a file, a batch, a line of the output or error
file (as the `openai` SDK's `FileObject`, `Batch` and the batch guide's JSONL lines)."""

from __future__ import annotations

import json
import secrets
from typing import Any

WINDOW_S = 24 * 3600  # completion_window "24h", the one OpenAI offers


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def file_object(filename: str, purpose: str, size: int, now: float, keep_s: float) -> dict[str, Any]:
    return {
        "id": new_id("file-"),
        "object": "file",
        "bytes": size,
        "created_at": int(now),
        "expires_at": int(now + keep_s),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "status_details": None,
    }


def batch_object(
    input_file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None, now: float
) -> dict[str, Any]:
    return {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": input_file_id,
        "completion_window": window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": int(now),
        "in_progress_at": None,
        "expires_at": int(now) + WINDOW_S,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": metadata,
    }


def request_counts(counts: dict[str, int]) -> dict[str, int]:
    done, failed = counts.get("done", 0), counts.get("failed", 0)
    return {"total": done + failed + counts.get("queued", 0), "completed": done, "failed": failed}


def listing(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def result_line(custom_id: str, request_id: str, status: int, body: bytes) -> tuple[bool, str]:
    """(whether it succeeded, the line of the output or error file) for a backend's answer."""
    try:
        parsed: Any = json.loads(body) if body else None
    except ValueError:
        parsed = body.decode("utf-8", "replace")
    ok = 200 <= status < 300
    error = None
    if not ok:
        err = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(err, dict):
            error = {"code": err.get("code") or err.get("type") or "error", "message": str(err.get("message", ""))}
        else:
            error = {"code": "error", "message": str(err if err is not None else parsed)[:1000]}
    line = {
        "id": request_id,
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": parsed},
        "error": error,
    }
    return ok, json.dumps(line)
