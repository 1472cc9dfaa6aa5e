"""One meaning per body: refuse a request body that the router and a backend could read differently.

Why. The router reads a request's body to decide what it is (the model, and whether a client key
limited to some models may use it; `stream`, `messages`, `keep_alive`...), then forwards the body
as it came. The backend parses the same bytes again, with another parser, and parsers disagree
about bodies that say one thing twice:

- a JSON key given twice: Python's json keeps the last; other parsers keep the first, or refuse;
- a JSON key spelt in another case: Ollama is written in Go, and Go's encoding/json fills a
  struct field from any key equal to its name under Unicode case folding, the last such key
  winning. `"Model"`, `"MODEL"`, `"\\u004dodel"` all set Ollama's `model`, and so do keys with
  the long s (`ſ`, which folds to `s`) or the Kelvin sign (`K`, which folds to `k`). Python
  sees a different key and ignores it.

So `{"model": "allowed", ..., "Model": "secret"}` passes the router's check as "allowed" and
Ollama serves "secret". A multipart body (audio transcriptions) has the same flaw in its own
way: Go's mime/multipart reads `name=model` and `NAME="model"` as the field `model`, decodes
RFC 2231 names, and Ollama takes the *first* `model` field where a naive reader takes another.

The rule: the top-level object of a JSON body has each key once (after unescaping), no two keys
equal under case folding, and no key that folds to a field name of the APIs the router serves
unless spelt exactly as that field; a multipart body names each text field once, as
`name="..."`, and no two alike under case folding. Anything else is a 400 naming the key. It is
refused even when Go would happen to pick the allowed value: a body has one meaning or none.
The multipart half of the rule is in form_names.py.
Nested objects are left alone (the router decides nothing on a nested key's spelling).

Cost. Every request is parsed here, so the check must not parse twice. The top level of the
object is walked in Python, key by key, with the json module's C string scanner for each key
and its C value scanner for each value: the values (nearly all of a body's bytes) are parsed in
C exactly once, as `json.loads` would, and a key given twice is seen as it is stored. The
spelling check is one C-level subset test against the field names when every key is a known
field (the common case), a casefold per key otherwise. Measured with `bench/body_keys.py`
(`requests.parse()`, µs per call, median of 15 runs of CPU time, a shared 2-core machine;
"before" is the same function reading the body with plain `json.loads`):

    body                                  json.loads   parse before   parse after   added
    1-message chat, 233 B                       2.4            4.9           5.6     +0.7
    20-message chat, 20.8 KB                   21.0           70.3          70.7     +0.4
    non-ASCII chat as \\uXXXX, 2.3 KB            6.3           14.6          14.6     +0.0
    tool call with a nested "model", 410 B      4.1            6.7           7.5     +0.8
    OpenAI chat, 8 top-level fields, 269 B      3.1            6.2           8.6     +2.5

About 0.3 µs per top-level key whatever the body's size: reading the body costs 1.0-1.1x
`json.loads` on large bodies and at most 1.8x on a small one of many scalar fields. Byte
screens were measured and dropped: `raw.count(b'"model"')` alone costs 13 µs on the 20 KB chat
(more than half a parse), a per-key count screen cost more than this walk even on small bodies,
and escaped duplicates (`"mod\\u0065l"`) would have sent every body whose text is escaped as
\\uXXXX down a second, precise parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from json import decoder as _jd
from typing import Any

from .errors import ApiError

# The top-level request fields of the APIs the router serves or forwards, looked up in:
# Ollama's api/types.go (GenerateRequest, ChatRequest, EmbedRequest, EmbeddingRequest,
# ShowRequest; Create/Copy/Pull/Push/DeleteRequest, whose bodies pass here too) and its
# openai/ and anthropic/ request types; the official clients' request parameters (openai-python:
# chat and legacy completions, embeddings, responses, images, audio transcriptions;
# anthropic-sdk: messages; ollama-python); the rerank APIs (vLLM, llama.cpp, Cohere, Jina).
FIELDS: frozenset[str] = frozenset(
    (
        # Ollama /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show
        "model",
        "prompt",
        "suffix",
        "system",
        "template",
        "context",
        "stream",
        "raw",
        "format",
        "keep_alive",
        "images",
        "options",
        "think",
        "truncate",
        "shift",
        "_debug_render_only",
        "logprobs",
        "top_logprobs",
        "messages",
        "tools",
        "input",
        "dimensions",
        "verbose",
        "name",
        "width",
        "height",
        "steps",
        # Ollama model management
        "modelfile",
        "path",
        "quantize",
        "quantization",
        "draft_quantize",
        "from",
        "remote_host",
        "files",
        "draft_files",
        "adapters",
        "license",
        "parameters",
        "renderer",
        "parser",
        "requires",
        "info",
        "source",
        "destination",
        "insecure",
        "username",
        "password",
        # OpenAI chat/completions and completions
        "audio",
        "best_of",
        "echo",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream_options",
        "temperature",
        "tool_choice",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
        # OpenAI embeddings, responses, images, audio transcriptions (multipart, same names)
        "encoding_format",
        "access_programs",
        "background",
        "background_options",
        "context_management",
        "conversation",
        "image",
        "include",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "previous_response_id",
        "text",
        "truncation",
        "complexity",
        "frame_count",
        "frame_duration_ms",
        "output_compression",
        "output_format",
        "partial_images",
        "quality",
        "size",
        "style",
        "svg",
        "chunking_strategy",
        "file",
        "keywords",
        "known_speaker_names",
        "known_speaker_references",
        "language",
        "languages",
        "timestamp_granularities",
        # rerank
        "query",
        "documents",
        "top_n",
        "return_documents",
        "max_tokens_per_doc",
        "rank_fields",
        "truncate_prompt_tokens",
        # Anthropic /v1/messages
        "cache_control",
        "container",
        "diagnostics",
        "inference_geo",
        "mcp_servers",
        "output_config",
        "speed",
        "stop_sequences",
        "thinking",
        "top_k",
        "user_profile_id",
        "workspace_id",
    )
)
_FOLDED: dict[str, str] = {f.casefold(): f for f in FIELDS}
assert len(_FOLDED) == len(FIELDS), "two field names fold alike"

_DECODER = json.JSONDecoder()  # what json.loads uses: the same C scanner, the same settings
# json's scanner internals, which typeshed leaves out of its json stubs (ignored below): (value,
# end) of the JSON value at an index; (text, end) of the string whose opening quote is before
# an index; the run of whitespace at an index (empty or not: never None)
_scan_value: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_scan_string: Callable[[str, int], tuple[str, int]] = _jd.scanstring  # type: ignore[attr-defined]
_skip: Callable[[str, int], re.Match[str]] = _jd.WHITESPACE.match  # type: ignore[attr-defined]
_WS = " \t\n\r"


def _bad(message: str, key: str) -> ApiError:
    return ApiError(400, message, param=key)


def quoted(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)  # quoted as in JSON, shown as written (ſ, K)


# ---- JSON ----------------------------------------------------------------------------------------
def loads(raw: bytes) -> object:
    """`json.loads(raw)`, parsed once, with the top-level object's keys checked (400 naming the
    key). Any other JSON value is returned as is; invalid JSON raises json.loads's own error."""
    if raw[:1] == b"{" and raw[1:2] != b"\x00":  # json.detect_encoding's answer is utf-8
        text = raw.decode("utf-8", "surrogatepass")
        start = 0
    else:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        start = _skip(text, 0).end()
        if text[start : start + 1] != "{":
            return _DECODER.decode(text)
    read = _members(text, start)
    if read is None:  # not valid JSON: json.loads says why
        json.loads(raw)
        raise ApiError(400, "the JSON body could not be read")  # (never: the walk accepts what json accepts)
    body, twice = read
    if twice is not None:
        raise _bad(
            f"the key {quoted(twice)} appears more than once in the body; "
            f"backends disagree on which one counts: send it once",
            twice,
        )
    if not FIELDS.issuperset(body):
        check_spelling(body)
    return body


def _members(s: str, i: int) -> tuple[dict[str, Any], str | None] | None:
    """The top-level object at s[i] ('{') and the first key it gives twice (or None); None if
    s is not exactly one valid JSON object (json.loads's grammar and whitespace). Written for
    speed: one C call per key and one per value, whitespace skipped inline when it is one
    character (json.dumps's ", " and ": ")."""
    body: dict[str, Any] = {}
    twice = None
    i += 1
    try:
        c = s[i]
        if c in _WS:
            i = _skip(s, i).end()
            c = s[i]
        if c == "}":
            i += 1
        else:
            while True:
                if c != '"':
                    return None
                key, i = _scan_string(s, i + 1)
                if s[i] != ":":
                    i = _skip(s, i).end()
                    if s[i] != ":":
                        return None
                i += 1
                if s[i] in _WS:
                    i += 1
                    if s[i] in _WS:
                        i = _skip(s, i).end()
                value, i = _scan_value(s, i)
                if key in body and twice is None:
                    twice = key
                body[key] = value
                c = s[i]
                if c in _WS:
                    i = _skip(s, i).end()
                    c = s[i]
                i += 1
                if c == "}":
                    break
                if c != ",":
                    return None
                c = s[i]
                if c in _WS:
                    i += 1
                    c = s[i]
                    if c in _WS:
                        i = _skip(s, i).end()
                        c = s[i]
    except (IndexError, StopIteration, ValueError):
        return None
    if i != len(s) and _skip(s, i).end() != len(s):
        return None  # extra data
    return body, twice


def check_spelling(keys: Iterable[str], what: str = "key") -> None:
    """400 for a key that folds to an API field without being spelt as it, or two keys that
    fold alike. Python's casefold() folds the long s to s and the Kelvin sign to k, as Go's
    simple folding does (and folds a little more: that only refuses more)."""
    seen: dict[str, str] = {}
    for key in keys:
        folded = key.casefold()
        field = _FOLDED.get(folded)
        if field is not None and key != field:
            raise _bad(
                f"the {what} {quoted(key)} is the field {quoted(field)} spelt another way; "
                f"some backends read it as {quoted(field)}: spell it exactly so",
                key,
            )
        other = seen.get(folded)
        if other is not None:
            raise _bad(
                f"the {what}s {quoted(other)} and {quoted(key)} differ only in case; "
                "backends may read them as one: send one",
                key,
            )
        seen[folded] = key
