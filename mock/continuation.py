"""Continuing a partial answer, as real chat templates do with a trailing assistant message.

Every mock answer is the same token sequence (`text.output_tokens`), so a request whose last
message is an assistant message holding the first k tokens of that answer is continued from
token k: the continuation's text is exactly the rest of the uninterrupted answer. This is
what lets the router's mid-stream resumption be checked byte for byte at the seam.
"""

from __future__ import annotations

from typing import Any

from .text import WORDS, content_text


def answer_offset(messages: list[Any]) -> int:
    """How many answer tokens a trailing assistant message already holds (0: not a
    continuation, or not a whole-token prefix of the mock's answer)."""
    if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") != "assistant":
        return 0
    partial = content_text(messages[-1].get("content"))
    n, size = 0, 0
    while size < len(partial):
        tok = WORDS[n % len(WORDS)] + " "
        if not partial.startswith(tok, size):
            return 0
        size += len(tok)
        n += 1
    return n
