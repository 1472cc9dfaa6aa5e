"""The newer routes on the mock: `/v1/responses` (stream and not), `/api/status`, rerank,
image generation and audio transcription (multipart), in the shapes Ollama v0.24, vLLM and
llama.cpp answer with. Deterministic, instant; each route counts in the mock's `requests`."""

from __future__ import annotations

import base64
import json
import re
import time
from typing import Any

from . import http as web
from .generation import BadRequest, read_json
from .route_group import Backend, Routes
from .text import content_text, count_tokens, output_tokens

# a 1x1 transparent PNG
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
        "0000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082"
    )
).decode()


class NewerRoutes:
    """The routes this module names, answered from the backend's config and counted in its `requests`."""

    def __init__(self, backend: Backend) -> None:
        self.b = backend
        self.routes: Routes = {
            ("POST", "/v1/responses"): self.responses,
            ("GET", "/api/status"): self.status,
            ("POST", "/v1/rerank"): self.rerank,
            ("POST", "/rerank"): self.rerank,
            ("POST", "/v1/images/generations"): self.images,
            ("POST", "/v1/audio/transcriptions"): self.transcription,
        }

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response({"cloud": {"disabled": True, "source": "env"}})

    async def _body(self, request: web.Request) -> dict[str, Any]:
        self.b.requests[request.path] += 1
        body = await read_json(request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _bad("model is required")
        self.b.check_model(model)
        return body

    async def responses(self, request: web.Request) -> Any:
        body = await self._body(request)
        inp = body.get("input")
        if isinstance(inp, list):
            text = "".join(content_text(i.get("content")) for i in inp if isinstance(i, dict))
        elif isinstance(inp, str):
            text = inp
        else:
            raise _bad("input is required")
        limit = body.get("max_output_tokens")
        n = self.b.config.tokens if not isinstance(limit, int) else min(limit, self.b.config.tokens)
        tokens = output_tokens(n)
        rid = f"resp_{self.b.rid_prefix}{next(self.b.rid_counter):08x}"
        usage = {
            "input_tokens": count_tokens(text),
            "output_tokens": len(tokens),
            "total_tokens": count_tokens(text) + len(tokens),
        }
        done = _response(rid, body["model"], "".join(tokens), "completed", usage)
        if not body.get("stream"):
            return web.json_response(done)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        seq = iter(range(1 << 30))
        start = _response(rid, body["model"], "", "in_progress", None)
        start["output"] = []
        await resp.write(_event("response.created", {"response": start}, seq))
        item = {"id": "msg_" + rid[5:], "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        await resp.write(_event("response.output_item.added", {"output_index": 0, "item": item}, seq))
        for tok in tokens:
            await resp.write(
                _event(
                    "response.output_text.delta",
                    {"item_id": item["id"], "output_index": 0, "content_index": 0, "delta": tok},
                    seq,
                )
            )
        await resp.write(_event("response.output_item.done", {"output_index": 0, "item": done["output"][0]}, seq))
        await resp.write(_event("response.completed", {"response": done}, seq))
        await resp.write_eof()
        return resp

    async def rerank(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        query, docs = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(docs, list):
            raise _bad("query and documents are required")
        words = set(query.lower().split())
        texts = [d if isinstance(d, str) else str((d or {}).get("text", "")) for d in docs]
        scores = [len(words & set(t.lower().split())) / (len(words) or 1) for t in texts]
        order = sorted(range(len(texts)), key=lambda i: -scores[i])
        top = body.get("top_n")
        order = order[:top] if isinstance(top, int) and top > 0 else order
        return web.json_response(
            {
                "id": f"rerank-{self.b.rid_prefix}",
                "model": body["model"],
                "results": [{"index": i, "document": {"text": texts[i]}, "relevance_score": scores[i]} for i in order],
                "usage": {"total_tokens": count_tokens(query + "".join(texts))},
            }
        )

    async def images(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        n = body.get("n") or 1
        return web.json_response({"created": int(time.time()), "data": [{"b64_json": PNG} for _ in range(n)]})

    async def transcription(self, request: web.Request) -> web.Response:
        self.b.requests[request.path] += 1
        m = re.search(r"boundary=([^;]+)", request.headers.get("content-type", ""))
        if m is None or not request.body.startswith(b"--" + m.group(1).strip('"').encode()):
            return web.Response(
                400,
                json.dumps(
                    {"error": {"message": "expected multipart/form-data", "type": "invalid_request_error"}}
                ).encode(),
            )
        fields, file_size = _form(request.body, m.group(1).strip('"').encode())
        model = fields.get("model", "")
        self.b.check_model(model)
        return web.json_response({"text": f"mock transcription of {file_size} bytes"})


def _form(raw: bytes, boundary: bytes) -> tuple[dict[str, str], int]:
    fields: dict[str, str] = {}
    size = 0
    for part in raw.split(b"--" + boundary)[1:]:
        if part.startswith(b"--"):
            break
        head, _, value = part[2:].partition(b"\r\n\r\n")
        value = value[:-2]
        name = re.search(rb'name="([^"]*)"', head)
        if b"filename=" in head:
            size += len(value)
        elif name:
            fields[name.group(1).decode()] = value.decode(errors="replace")
    return fields, size


def _response(rid: str, model: str, text: str, status: str, usage: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "output": [
            {
                "id": "msg_" + rid[5:],
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def _event(kind: str, fields: dict[str, Any], seq: Any) -> bytes:
    data = {"type": kind, "sequence_number": next(seq), **fields}
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _bad(message: str) -> Exception:
    return BadRequest(400, message)
