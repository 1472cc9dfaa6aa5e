"""Client-facing errors, rendered in the shape of the API that was called.

Ollama: {"error": "..."}; OpenAI: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import json


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after


def _openai_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(api: str, status: int, message: str, param: str | None = None,
               code: str | None = None) -> bytes:
    if api == "openai":
        return json.dumps({"error": {"message": message, "type": _openai_type(status),
                                     "param": param, "code": code}}).encode()
    return json.dumps({"error": message}).encode()


def render(api: str, err: ApiError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    headers = []
    if err.retry_after is not None:
        headers.append((b"retry-after", str(err.retry_after).encode()))
    return err.status, error_body(api, err.status, err.message, err.param, err.code), headers
