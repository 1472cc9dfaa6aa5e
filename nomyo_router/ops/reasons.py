"""Why a request was not served: the `reason` label of nomyo_router_requests_total.

A small fixed set, so that a request refused at the door (a wrong key, a limit, a bad body)
is counted like a proxied one, by cause, and nothing a client sends makes a label of its
own: the reason comes from the status and the router's own error code, never from text.
"""

from __future__ import annotations

REASONS_BY_CODE = {
    "forbidden_model": "forbidden_model",
    "rate_limit_exceeded": "rate_limited",
    "insufficient_quota": "budget",
    "queue_full": "queue_full",
    "queue_timeout": "queue_timeout",
    "overloaded": "overloaded",
    "router_overloaded": "overloaded",
    "no_healthy_endpoint": "no_endpoint",
    "out_of_descriptors": "descriptors",
    "request_too_large": "too_large",
    "client_gone": "client_gone",
}
REASONS_BY_STATUS = {
    400: "bad_request",
    401: "auth",
    403: "forbidden",
    404: "not_found",
    405: "not_found",
    408: "timeout",
    413: "too_large",
    421: "host",
    429: "rate_limited",
    499: "client_gone",
    500: "internal",
}


def reason_of(status: int, error: str | None) -> str:
    """The `reason` label of a request that ended with `status` and error code `error`."""
    if error is None and status < 400:
        return ""
    reason = REASONS_BY_CODE.get(error or "") or REASONS_BY_STATUS.get(status)
    if reason is not None:
        return reason
    if status < 400:
        return "cut"  # (its head went out, then the answer broke)
    return "upstream" if status >= 500 else "bad_request"
