"""The mock's read-only routes about its models and itself: Ollama's `/api/tags`, `/api/ps`,
`/api/version`, `/api/show`, OpenAI's `/v1/models` and vLLM's `/health`, answered from the
mock's current config."""

from __future__ import annotations

import asyncio

from . import formats
from . import http as web
from .generation import BadRequest, read_json
from .route_group import Backend, Routes


class Metadata:
    def __init__(self, backend: Backend) -> None:
        self.b = backend
        self.routes: Routes = {
            ("POST", "/api/show"): self.show,
            ("GET", "/api/tags"): self.tags,
            ("GET", "/api/ps"): self.ps,
            ("GET", "/api/version"): self.version,
            ("GET", "/v1/models"): self.models,
            ("GET", "/health"): self.health,  # vLLM's liveness route (vllm-router waits on it)
        }

    async def _slow_list(self) -> None:
        if self.b.config.list_delay_ms:
            self.b.errors_injected["list_delay"] += 1
            await asyncio.sleep(self.b.config.list_delay_ms / 1000)

    async def tags(self, request: web.Request) -> web.Response:
        await self._slow_list()
        return web.json_response({"models": [formats.ollama_model_entry(m) for m in self.b.config.models]})

    async def ps(self, request: web.Request) -> web.Response:
        await self._slow_list()
        c = self.b.config
        return web.json_response({"models": [formats.ollama_ps_entry(m, c.context_length) for m in c.models]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": formats.OLLAMA_VERSION})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(200, b"")

    async def models(self, request: web.Request) -> web.Response:
        await self._slow_list()
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": m,
                        "object": "model",
                        "created": int(self.b.started),
                        "owned_by": "mock",
                        "max_model_len": self.b.config.context_length,
                    }
                    for m in self.b.config.models
                ],
            }
        )

    async def show(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        model = body.get("model") or body.get("name")
        if not isinstance(model, str) or not model:
            raise BadRequest(400, "model is required")
        self.b.check_model(model)
        return web.json_response(formats.ollama_show(model, self.b.config.context_length))
