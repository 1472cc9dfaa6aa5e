"""Client-facing errors, rendered in the shape of the API that was called.

Ollama: {"error": "..."}; OpenAI: {"error": {"message", "type", "param", "code"}};
Anthropic (`/v1/messages`): {"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import json


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
        kind: str | None = None,
    ) -> None:
        """`headers`: more response headers (a rate-limited key's x-ratelimit-*); `kind`: the
        OpenAI error type when the status alone does not say it (insufficient_quota)."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.headers = headers
        self.kind = kind


def _openai_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def _anthropic_type(status: int) -> str:
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(
    api: str, status: int, message: str, param: str | None = None, code: str | None = None, kind: str | None = None
) -> bytes:
    if api == "anthropic":
        return json.dumps({"type": "error", "error": {"type": _anthropic_type(status), "message": message}}).encode()
    if api == "openai":
        return json.dumps(
            {"error": {"message": message, "type": kind or _openai_type(status), "param": param, "code": code}}
        ).encode()
    return json.dumps({"error": message}).encode()


def render(api: str, err: ApiError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    headers = []
    if err.retry_after is not None:
        headers.append((b"retry-after", str(err.retry_after).encode()))
    if err.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="nomyo-router"'))
    if err.headers:
        headers += err.headers
    return err.status, error_body(api, err.status, err.message, err.param, err.code, err.kind), headers
