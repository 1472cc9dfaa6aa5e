"""Ollama's model management on the mock, so the router's fan-out is tested fast.

- `POST /api/pull`: simulated progress (`pulling manifest`, one layer in 4 steps, `verifying
  sha256 digest`, `writing manifest`, `success`); the model joins the list. A name starting
  with `missing` fails like an unknown model does on a registry.
- `POST /api/push`: progress for a model the mock has (404 otherwise).
- `POST /api/create`: `from` a model it has, or `files` whose blobs were uploaded; the model joins.
- `POST /api/copy`, `DELETE /api/delete`: change the list (404 for an unknown model).
- `HEAD|POST /api/blobs/sha256:…`: blobs kept by digest; an upload is checked against it.
All honour `stream: false` (one JSON answer). The mock's requests counter counts each route.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from . import http as web
from .route_group import Backend, Routes

STEP_S = 0.002  # between two progress lines


class Manage:
    def __init__(self, backend: Backend) -> None:
        self.b = backend
        self.blobs: set[str] = set()
        self.routes: Routes = {
            ("POST", "/api/pull"): self.pull,
            ("POST", "/api/push"): self.push,
            ("POST", "/api/create"): self.create,
            ("POST", "/api/copy"): self.copy,
            ("DELETE", "/api/delete"): self.delete,
        }

    # ---- the model list ----
    def _find(self, name: str) -> str | None:
        for m in self.b.config.models:
            if m == name or m == name + ":latest" or name == m + ":latest":
                return m
        return None

    def _add(self, name: str) -> None:
        if self._find(name) is None:
            self.b.config.models = [*self.b.config.models, name]

    # ---- routes ----
    async def pull(self, request: web.Request) -> Any:
        body, model = await self._start(request, "model", "name")
        digest = "sha256:" + hashlib.sha256(model.encode()).hexdigest()
        lines: list[dict[str, Any]] = [{"status": "pulling manifest"}]
        if model.startswith("missing"):
            lines.append({"error": "pull model manifest: file does not exist"})
        else:
            total = 4096
            lines += [
                {"status": f"pulling {digest[7:19]}", "digest": digest, "total": total, "completed": total * i // 4}
                for i in range(5)
            ]
            lines += [{"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}]
        return await self._progress(request, body, lines, lambda: self._add(model))

    async def push(self, request: web.Request) -> Any:
        body, model = await self._start(request, "model", "name")
        if self._find(model) is None:
            return _error(404, f"model '{model}' not found")
        digest = "sha256:" + hashlib.sha256(model.encode()).hexdigest()
        lines = [{"status": "retrieving manifest"}]
        lines += [
            {"status": f"pushing {digest[7:19]}", "digest": digest, "total": 2048, "completed": 1024 * i}
            for i in range(3)
        ]
        lines += [{"status": "pushing manifest"}, {"status": "success"}]
        return await self._progress(request, body, lines, lambda: None)

    async def create(self, request: web.Request) -> Any:
        body, model = await self._start(request, "model", "name")
        files = body.get("files") or {}
        source = body.get("from")
        if not isinstance(files, dict):
            return _error(400, "files must be an object")
        missing = [d for d in files.values() if d not in self.blobs]
        if missing:
            return _error(400, f"blob {missing[0]} not found")
        lines: list[dict[str, Any]] = []
        if source and self._find(str(source)) is None:
            lines += [{"status": "pulling manifest"}, {"error": "pull model manifest: file does not exist"}]
        else:
            lines += [{"status": f"using existing layer {d}"} for d in files.values()]
            lines += [{"status": "writing manifest"}, {"status": "success"}]
        return await self._progress(request, body, lines, lambda: self._add(model))

    async def copy(self, request: web.Request) -> Any:
        body = await _body(request)
        source, dest = body.get("source"), body.get("destination")
        if not isinstance(source, str) or not isinstance(dest, str) or not source or not dest:
            return _error(400, "source and destination are required")
        self.b.requests[request.path] += 1
        if self._find(source) is None:
            return _error(404, f'model "{source}" not found')
        self._add(dest)
        return web.Response(200, b"", "text/plain")

    async def delete(self, request: web.Request) -> Any:
        body, model = await self._start(request, "model", "name")
        found = self._find(model)
        if found is None:
            return _error(404, f"model '{model}' not found")
        self.b.config.models = [m for m in self.b.config.models if m != found]
        return web.Response(200, b"", "text/plain")

    async def blob(self, request: web.Request) -> Any:
        digest = request.path[len("/api/blobs/") :].replace("-", ":", 1)
        self.b.requests["/api/blobs"] += 1
        if request.method == "HEAD":
            return web.Response(200 if digest in self.blobs else 404, b"")
        if digest in self.blobs:
            return web.Response(200, b"")
        got = "sha256:" + hashlib.sha256(request.body).hexdigest()
        if got != digest:
            return _error(400, f'digest mismatch, expected "{digest}", got "{got}"')
        self.blobs.add(digest)
        return web.Response(201, b"")

    # ---- helpers ----
    async def _start(self, request: web.Request, *fields: str) -> tuple[dict[str, Any], str]:
        body = await _body(request)
        self.b.requests[request.path] += 1
        for f in fields:
            if isinstance(body.get(f), str) and body[f]:
                return body, body[f]
        raise BadInput(f"{fields[0]} is required")

    async def _progress(
        self, request: web.Request, body: dict[str, Any], lines: list[dict[str, Any]], on_success: Any
    ) -> Any:
        ok = lines[-1].get("status") == "success"
        if body.get("stream") is False:
            await asyncio.sleep(STEP_S * len(lines))
            if ok:
                on_success()
                return web.Response(200, b'{"status":"success"}')
            return _error(500, lines[-1]["error"])
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        for line in lines:
            await asyncio.sleep(STEP_S)
            if line.get("status") == "success":
                on_success()
            await resp.write(json.dumps(line).encode() + b"\n")
        await resp.write_eof()
        return resp


class BadInput(Exception):
    """A 400 the server answers in the route's shape."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _error(status: int, message: str) -> web.Response:
    return web.Response(status, json.dumps({"error": message}).encode())


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        raise BadInput("invalid JSON body") from None
    if not isinstance(body, dict):
        raise BadInput("the JSON body must be an object")
    return body
