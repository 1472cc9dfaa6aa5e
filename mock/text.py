"""Deterministic token estimates, generated text and embeddings."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

WORDS = (
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "et",
)
CHARS_PER_TOKEN = 4


def count_tokens(text: str) -> int:
    """About four characters per token, like most BPE vocabularies on English."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def output_tokens(n: int) -> list[str]:
    """The answer as `n` token strings; the same for every request, so stream == non-stream."""
    return [WORDS[i % len(WORDS)] + " " for i in range(n)]


def content_text(content: Any) -> str:
    """Message content may be a string or a list of OpenAI content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def chat_prompt(messages: list[dict]) -> str:
    """A canonical text of the conversation; a later turn's text starts with an earlier one's."""
    return "".join(f"<{m.get('role', '')}>{content_text(m.get('content'))}\n" for m in messages if isinstance(m, dict))


def embedding(text: str, dim: int) -> list[float]:
    digest = b""
    counter = 0
    while len(digest) < dim * 4:
        digest += hashlib.blake2b(f"{counter}:{text}".encode(), digest_size=64).digest()
        counter += 1
    ints = struct.unpack(f"<{dim}I", digest[: dim * 4])
    return [round(i / 2**31 - 1.0, 6) for i in ints]
