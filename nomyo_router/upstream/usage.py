"""Token counts from the backend's own answer, without parsing it.

Ollama puts `prompt_eval_count`/`eval_count` in its final object, OpenAI-compatible servers
`prompt_tokens`/`completion_tokens` in `usage`, Anthropic's API `input_tokens`/
`output_tokens`: always near the end. The router looks only at the last few KiB it relayed
(one regular-expression search per request, never a JSON parse of every chunk).
OpenAI-API streams carry counts only when the client asked for `stream_options.include_usage`.
"""

from __future__ import annotations

import re

_PROMPT = re.compile(rb'"(?:prompt_eval_count|prompt_tokens|input_tokens)"\s*:\s*(\d+)')
_OUTPUT = re.compile(rb'"(?:eval_count|completion_tokens|output_tokens)"\s*:\s*(\d+)')
TAIL = 4096


def counts(tail: bytes) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens): the last of each found in `tail`."""
    prompt = output = None
    for m in _PROMPT.finditer(tail):
        prompt = int(m.group(1))
    for m in _OUTPUT.finditer(tail):
        output = int(m.group(1))
    return prompt, output
