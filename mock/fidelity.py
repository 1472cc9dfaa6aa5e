"""What a real server does with `n`, `tools`, `format`/`response_format` and
`encoding_format: base64`, deterministically, so clients' parsing of them is testable:

- `n` (OpenAI chat and completions): n identical choices, index 0..n-1, streamed too;
- `tools` (either API's chat; not when `tool_choice` is "none" or the last message is a tool
  result): one call of the first tool (or the one `tool_choice` names) whose arguments hold
  every required parameter with a value of its type; OpenAI: `arguments` a JSON string,
  `finish_reason: tool_calls`; Ollama: `arguments` an object;
- a JSON schema (`format` for Ollama, `response_format` `json_schema`/`json_object` for
  OpenAI): the answer is a JSON document with every required key, of its type;
- `encoding_format: base64` (OpenAI embeddings): little-endian float32, base64, like OpenAI.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

_DEFAULTS = {"string": "lorem", "integer": 1, "number": 1.5, "boolean": True, "null": None}


class Extras:
    __slots__ = ("n", "tool", "json_text")

    def __init__(self) -> None:
        self.n = 1
        self.tool: dict[str, Any] | None = None  # {"name", "arguments": dict}
        self.json_text: str | None = None


def parse(api: str, kind: str, body: dict[str, Any]) -> Extras | None:
    """None (the common case, at the cost of three dict lookups) when nothing applies."""
    n, tools = body.get("n"), body.get("tools")
    fmt = body.get("format") if api == "ollama" else body.get("response_format")
    if n in (None, 1) and not tools and not fmt:
        return None
    ex = Extras()
    if api == "openai" and isinstance(n, int) and not isinstance(n, bool) and 1 < n <= 16:
        ex.n = n
    if kind == "chat" and isinstance(tools, list) and tools:
        ex.tool = _tool_call(tools, body.get("tool_choice"), body.get("messages") or [])
    schema = _schema(api, fmt)
    if schema is not None and ex.tool is None:
        ex.json_text = json.dumps(value(schema))
    return ex


def _tool_call(tools: list[Any], choice: Any, messages: list[Any]) -> dict[str, Any] | None:
    if choice == "none" or (messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"):
        return None
    fns = [t.get("function") for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        named = [f for f in fns if f.get("name") == choice["function"].get("name")]
        fns = named or fns
    if not fns or not isinstance(fns[0].get("name"), str):
        return None
    params = fns[0].get("parameters")
    return {"name": fns[0]["name"], "arguments": value(params) if isinstance(params, dict) else {}}


def _schema(api: str, fmt: Any) -> dict[str, Any] | None:
    if api == "ollama":
        if fmt == "json":
            return {"type": "object"}
        return fmt if isinstance(fmt, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        schema = fmt["json_schema"].get("schema")
        return schema if isinstance(schema, dict) else {"type": "object"}
    return None


def value(schema: Any, depth: int = 0) -> Any:
    """A value satisfying `schema`'s type, required keys (recursively), enum and const."""
    if not isinstance(schema, dict) or depth > 8:
        return "lorem"
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return value(schema[key][0], depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        return {k: value(props.get(k, {}), depth + 1) for k in dict.fromkeys([*required, *props]) if isinstance(k, str)}
    if kind == "array":
        return [value(schema.get("items", {}), depth + 1)] * max(int(schema.get("minItems", 1) or 0), 1)
    if kind == "string":
        return "lorem" + "m" * max(int(schema.get("minLength", 0) or 0) - 5, 0)
    if kind in ("integer", "number"):
        low = schema.get("minimum", 1)
        return low if isinstance(low, (int, float)) and not isinstance(low, bool) else _DEFAULTS[kind]
    return _DEFAULTS.get(kind, "lorem")


def b64_embedding(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


# ---- applying them to answers ----
def whole(body: dict[str, Any], api: str, ex: Extras, rid: str) -> dict[str, Any]:
    """A complete answer with the extras applied."""
    if ex.tool is not None:
        if api == "ollama":
            call = {"function": {"name": ex.tool["name"], "arguments": ex.tool["arguments"]}}
            body["message"] = {"role": "assistant", "content": "", "tool_calls": [call]}
        else:
            choice = body["choices"][0]
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": [_openai_call(ex, rid)]}
            choice["finish_reason"] = "tool_calls"
    if api == "openai" and ex.n > 1:
        body["choices"] = [{**body["choices"][0], "index": i} for i in range(ex.n)]
    return body


def _openai_call(ex: Extras, rid: str) -> dict[str, Any]:
    assert ex.tool is not None
    return {
        "id": "call_" + rid[-12:],
        "type": "function",
        "function": {"name": ex.tool["name"], "arguments": json.dumps(ex.tool["arguments"])},
    }


def tool_chunks(api: str, ex: Extras, model: str, rid: str, created: int, now: str) -> list[bytes]:
    """The stream of a tool-call answer, before its tail."""
    if api == "ollama":
        msg = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": ex.tool["name"], "arguments": ex.tool["arguments"]}}],
        }  # type: ignore[index]
        return [json.dumps({"model": model, "created_at": now, "message": msg, "done": False}).encode() + b"\n"]
    call = _openai_call(ex, rid)
    out = []
    for i in range(ex.n):
        head = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
        args = {"index": 0, "function": {"arguments": call["function"]["arguments"]}}
        for delta in ({"role": "assistant", "content": None, "tool_calls": [head]}, {"tool_calls": [args]}):
            out.append(
                b"data: "
                + json.dumps(
                    {
                        "id": "chatcmpl-" + rid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}],
                    }
                ).encode()
                + b"\n\n"
            )
    return out


def fan(chunk: bytes, n: int) -> bytes:
    """One OpenAI SSE chunk of choice 0 as the same chunk for choices 0..n-1."""
    if n == 1 or b'"index":0' not in chunk.replace(b'"index": 0', b'"index":0'):
        return chunk
    chunk = chunk.replace(b'"index": 0', b'"index":0')
    return b"".join(chunk.replace(b'"index":0', b'"index":%d' % i, 1) for i in range(n))


def fan_tail(tail: bytes, n: int) -> bytes:
    """The finish chunk for every choice; the usage chunk and [DONE] once."""
    if n == 1:
        return tail
    events = tail.split(b"\n\n")
    return fan(events[0] + b"\n\n", n) + b"\n\n".join(events[1:])
