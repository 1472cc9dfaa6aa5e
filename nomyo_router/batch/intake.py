"""What comes in: an uploaded file (`POST /v1/files`, multipart/form-data) and a batch's input
file read into lines.

A line the router cannot name (not a JSON object, no `custom_id`, a `custom_id` twice) makes
the whole file malformed: the batch fails with `errors` naming those lines, since the output
could not say which request such a line was. A line that names itself but asks for something
the router will not run (another method, an unknown or another `url`, no model, a stream)
gets its error in the error file and the rest of the batch runs. A body the route itself
refuses is found when the line runs, by the same parsing as an interactive request.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..api.errors import ApiError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_ERRORS = 100  # the errors a failed batch lists (the count of the rest is said in the last)
_BOUNDARY = re.compile(rb'boundary="?([^";,]{1,200})"?', re.I)
_NAME = re.compile(rb'\bname="([^"]*)"', re.I)
_FILENAME = re.compile(rb'\bfilename="([^"]*)"', re.I)


def upload(content_type: bytes | None, raw: bytes) -> tuple[dict[str, str], bytes, str]:
    """(the text fields, the file's bytes, its filename) of a multipart/form-data upload."""
    m = _BOUNDARY.search(content_type or b"")
    if m is None or not (content_type or b"").lower().startswith(b"multipart/form-data"):
        raise ApiError(400, "upload a file as multipart/form-data with `file` and `purpose` fields")
    delimiter = b"--" + m.group(1)
    fields: dict[str, str] = {}
    data: bytes | None = None
    filename = "file"
    pos = raw.find(delimiter)
    while pos >= 0:
        pos += len(delimiter)
        if raw[pos : pos + 2] == b"--":
            break
        head_end = raw.find(b"\r\n\r\n", pos, pos + 8192)
        end = raw.find(b"\r\n" + delimiter, head_end + 4) if head_end >= 0 else -1
        if head_end < 0 or end < 0:
            raise ApiError(400, "the multipart body is cut or a part has no header block")
        head = raw[pos:head_end]
        name = _NAME.search(head)
        if name is not None:
            if name.group(1) == b"file":
                data = raw[head_end + 4 : end]
                fn = _FILENAME.search(head)
                filename = fn.group(1).decode("utf-8", "replace")[:256] if fn else filename
            elif end - head_end - 4 <= 4096:
                fields[name.group(1).decode("latin-1")] = raw[head_end + 4 : end].decode("utf-8", "replace")
        pos = end + 2
    if data is None:
        raise ApiError(400, "the upload has no `file` part", param="file")
    return fields, data, filename


def read_lines(
    content: bytes, endpoint: str, max_lines: int
) -> tuple[list[tuple[int, str, str, str, str | None]], list[dict[str, Any]]]:
    """(the lines: (idx, custom_id, model, request JSON, the error result of a line refused
    before it runs, else None), the whole file's errors: empty when it is well formed)."""
    lines: list[tuple[int, str, str, str, str | None]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, text in enumerate(content.split(b"\n"), 1):
        if not text.strip():
            continue
        if len(lines) >= max_lines:
            errors.append(
                _error("too_many_lines", f"the file has more than batch.max_lines ({max_lines}) lines", number)
            )
            break
        try:
            line = json.loads(text)
        except (ValueError, RecursionError):
            errors.append(_error("invalid_json_line", "the line is not valid JSON", number))
            continue
        cid = line.get("custom_id") if isinstance(line, dict) else None
        if not isinstance(cid, str) or not cid:
            errors.append(_error("missing_custom_id", "the line is not a JSON object with a string custom_id", number))
            continue
        if cid in seen:
            errors.append(_error("duplicate_custom_id", f"custom_id {cid[:64]!r} appears more than once", number))
            continue
        seen.add(cid)
        body = line.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        problem = _refused(line, body, model, endpoint)
        request = json.dumps({"url": line.get("url"), "body": body})
        refused = None if problem is None else json.dumps(error_line(cid, 400, problem[0], problem[1]))
        lines.append((len(lines), cid, model if isinstance(model, str) else "", request, refused))
    if not lines and not errors:
        errors.append(_error("empty_file", "the input file has no lines", None))
    if len(errors) > MAX_ERRORS:
        rest = len(errors) - MAX_ERRORS + 1
        errors = [*errors[: MAX_ERRORS - 1], _error("more_errors", f"and {rest} more malformed lines", None)]
    return lines, errors


def _refused(line: dict[str, Any], body: object, model: object, endpoint: str) -> tuple[str, str] | None:
    url = line.get("url")
    if line.get("method") != "POST":
        return "invalid_method", "method must be POST"
    if url not in ENDPOINTS:
        return "invalid_url", f"url must be one of {', '.join(ENDPOINTS)}"
    if url != endpoint:
        return "mismatched_url", f"url {url} is not the batch's endpoint {endpoint}"
    if not isinstance(body, dict):
        return "invalid_body", "body must be a JSON object"
    if not isinstance(model, str) or not model:
        return "missing_model", "body.model must be a string"
    if body.get("stream"):
        return "invalid_body", "stream is not supported in a batch"
    return None


def _error(code: str, message: str, line: int | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": line}


def error_line(custom_id: str, status: int, code: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    """A line of the error file for a request that never reached a backend."""
    return {
        "id": "batch_req_" + (request_id or custom_id)[:64],
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": request_id,
            "body": {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}},
        },
        "error": {"code": code, "message": message},
    }
