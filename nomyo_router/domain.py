"""Domain types shared by routing, state and the adapters. No I/O here."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from .config import EndpointConfig


def model_key(name: str) -> str:
    """`llama3` and `llama3:latest` are the same model."""
    return name if ":" in name else name + ":latest"


@dataclass(eq=False)
class Endpoint:
    """One backend as this process knows it: its fixed settings and what discovery found."""

    name: str
    url: str
    slots: int
    type: str | None = None  # "ollama" | "openai"; None until detected
    api_key: str | None = None
    static_models: tuple[str, ...] | None = None
    models: dict[str, str] = field(default_factory=dict)  # model_key -> the backend's own name
    loaded: frozenset[str] = frozenset()  # model keys in memory now (/api/ps)
    tags: list[dict[str, Any]] = field(default_factory=list)  # raw /api/tags entries
    openai_models: list[dict[str, Any]] = field(default_factory=list)  # raw /v1/models entries
    ps: list[dict[str, Any]] = field(default_factory=list)  # raw /api/ps entries
    version: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    context_length: int | None = None  # configured context window (tokens): overrides the learned ones

    @classmethod
    def from_config(cls, cfg: EndpointConfig) -> Endpoint:
        ep = cls(
            name=cfg.name,
            url=cfg.url,
            slots=cfg.max_concurrent,
            type=cfg.type,
            api_key=cfg.api_key,
            static_models=cfg.models,
            context_length=cfg.context_length,
        )
        # Every header aiohttp would add is set here, so it adds none (its cheapest path).
        ep.headers = {
            "Content-Type": "application/json",
            "Accept": "*/*",
            "Accept-Encoding": "identity",
            "User-Agent": "nomyo-router",
        }
        if cfg.api_key:
            ep.headers["Authorization"] = f"Bearer {cfg.api_key}"
        elif cfg.basic_auth:
            ep.headers["Authorization"] = "Basic " + base64.b64encode(cfg.basic_auth.encode()).decode("ascii")
        if cfg.models:
            ep.set_models(list(cfg.models))
        return ep

    def set_models(self, names: list[str]) -> None:
        self.models = {model_key(n): n for n in names}

    def serves(self, key: str) -> bool:
        return key in self.models
