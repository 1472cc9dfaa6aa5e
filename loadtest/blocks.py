"""Prompt text from Mooncake-style block hashes (`hash_ids`).

Mooncake's public traces do not carry prompts; they say which requests share a prefix by
listing, per request, the hashes of its blocks of 512 tokens: two requests whose lists
start with the same ids share exactly those leading blocks. To replay that reuse, each id
is turned into one block of text fixed by the id alone (words picked by a hash of the id),
so equal ids give equal text and different ids differ from their first word on. A prompt
is its blocks' texts in order, cut to the request's `input_length` (the last block
partial), at the load tester's 4 characters per token; a backend's prefix cache and a
cache-aware router then see the trace's real reuse.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

CHARS_PER_TOKEN = 4

# 256 short English words: one per hash byte, about one token each for a real tokenizer.
_WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city community name president team minute idea kid body information back "
    "parent face others level office door health person art war history party result change "
    "morning reason research girl guy moment air teacher force education foot boy age policy "
    "process music market sense nation plan college interest death experience effect use class "
    "control care field development role effort rate heart drug show leader light voice wife "
    "police mind price report decision son view relationship town road arm difference value "
    "building action model season society tax director position player record paper space ground "
    "form event official matter center couple site project activity star table need court oil "
    "situation cost industry figure street image phone data picture practice piece land product "
    "doctor wall patient worker news test movie north love support technology step baby computer "
    "type attention film tree source organization hair window evidence population truth song "
    "energy blue green red river stone cloud rain snow wind fire garden bridge island forest "
    "mountain ocean valley desert meadow farm village harbor castle tower lake hill coast bay "
    "glass silver letter apple bread plate chair clock lamp shirt coat boat train plane horse bird "
    "fish cat dog tiger"
).split()
assert len(set(_WORDS)) == len(_WORDS) >= 256
_WORDS = _WORDS[:256]


@lru_cache(maxsize=16384)
def block_text(block_id: int | str, tokens: int) -> str:
    """`tokens` tokens (4 characters each) of words fixed by `block_id`: the same id gives
    the same text in every request, another id other text."""
    chars = tokens * CHARS_PER_TOKEN
    words: list[str] = []
    n = 0
    counter = 0
    seed = repr(block_id).encode()
    while n < chars:
        for b in hashlib.blake2b(seed + b":%d" % counter, digest_size=64).digest():
            w = _WORDS[b]
            words.append(w)
            n += len(w) + 1
            if n >= chars:
                break
        counter += 1
    return " ".join(words)[: chars - 1] + " " if chars else ""


def prompt_from_blocks(hash_ids: list[int], input_tokens: int, block_tokens: int, own: str) -> str:
    """The prompt of one request: its blocks' texts in order, exactly `input_tokens` tokens.
    Blocks the list lacks (a list shorter than `ceil(input_tokens / block_tokens)`) get text
    of their own, keyed by `own` (unique per request), so they are shared with no one."""
    chars = input_tokens * CHARS_PER_TOKEN
    need = -(-input_tokens // block_tokens) if block_tokens > 0 else 0
    parts = []
    for j in range(need):
        key: int | str = hash_ids[j] if j < len(hash_ids) else f"{own}#{j}"
        parts.append(block_text(key, block_tokens))
    return "".join(parts)[:chars]
