"""Semantic mode (`cache.similarity` < 1): a question close enough to one answered before gets
that answer, even when not worded the same.

- What is compared by meaning: the text of the request's last user turn (chat) or its prompt
  (generate), and nothing else, embedded in one call by `cache.embed_model` on the router's
  own endpoints (no model runs in the router).
- What must match exactly: everything else that can change the answer, i.e. the namespace is
  the exact key of the whole request with only that text left out: the client key, route and
  model, every earlier message (system prompt, history, tool calls and their results), what
  follows the last user turn (tool results, an assistant prefill), the last turn's images and
  other parts that are not text, sampling parameters, tools and format.
- What is never matched: an answer that holds, or whose question holds, something personal
  (an e-mail address, a UUID, a number of 8 digits or more) is kept for exact hits only.
- A known limit: a question and its negation ("is X safe?", "is X not safe?") embed close
  together; a similarity near 1 (the documented 0.95) keeps most of them apart, none keeps all.

The nearest-neighbour search runs on this process's index (numpy, one matrix per namespace),
fed from the store with what was added since its last look (stores.py), so entries another
worker or instance stored are found too. An entry gone from the store (expired, evicted) is a
miss and leaves the index.
"""

from __future__ import annotations

import json
import re
import time
from typing import Protocol

import numpy as np

from ..api.requests import GenRequest
from ..config import CacheConfig
from ..events import RequestRecord
from ..server.asgi import Send, Whole
from .answer import Answer
from .keys import DELIVERY, request_key
from .stores import AnswerStore, Cursor

KINDS = frozenset(("chat", "generate"))
PERSONAL = re.compile(
    r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
    r"|\d(?:[ .-]?\d){7,}",
    re.I,
)


def personal(*texts: str) -> bool:
    return any(PERSONAL.search(t) for t in texts if t)


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's content parts: their text
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


class Index:
    """Unit vectors by namespace; `nearest` is one matrix-vector product per lookup."""

    def __init__(self) -> None:
        self.spaces: dict[str, tuple[list[str], np.ndarray | None, list[np.ndarray]]] = {}
        self.size = 0

    def add(self, key: str, ns: str, vector: bytes) -> None:
        v = np.frombuffer(vector, dtype=np.float32)
        keys, matrix, pending = self.spaces.setdefault(ns, ([], None, []))
        if (matrix is not None and matrix.shape[1] != v.shape[0]) or (pending and pending[0].shape[0] != v.shape[0]):
            self.size -= len(keys)  # another embedding model's vectors: they cannot be compared
            keys, matrix, pending = [], None, []
            self.spaces[ns] = (keys, matrix, pending)
        keys.append(key)
        pending.append(v)
        self.size += 1

    def nearest(self, ns: str, q: np.ndarray, threshold: float) -> str | None:
        space = self.spaces.get(ns)
        if space is None:
            return None
        keys, matrix, pending = space
        if pending:
            matrix = np.vstack([m for m in (matrix, *pending) if m is not None])
            self.spaces[ns] = space = (keys, matrix, [])
        if matrix is None or matrix.shape[1] != q.shape[0]:
            return None
        scores = matrix @ q
        best = int(np.argmax(scores))
        return keys[best] if scores[best] >= threshold else None

    def drop(self, ns: str, key: str) -> None:
        keys, matrix, pending = self.spaces.get(ns, ([], None, []))
        if key in keys and not pending and matrix is not None:
            i = keys.index(key)
            self.spaces[ns] = (keys[:i] + keys[i + 1 :], np.delete(matrix, i, axis=0), [])
            self.size -= 1

    def clear(self) -> None:
        self.spaces.clear()
        self.size = 0


class _Handler(Protocol):
    async def handle(self, req: GenRequest, send: Send, rec: RequestRecord) -> None: ...


class Owner(Protocol):
    """The Router, as semantic mode uses it: its proxy asks the embedding model (and records
    that request like any)."""

    @property
    def proxy(self) -> _Handler: ...


class Semantic:
    def __init__(self, cfg: CacheConfig, owner: Owner, store: AnswerStore) -> None:
        self.threshold, self.model, self.max_entries = cfg.similarity, cfg.embed_model or "", cfg.max_entries
        self.owner = owner
        self.store = store  # where the vectors are read from
        self.index = Index()
        self.cursor: Cursor = None

    def applies(self, req: GenRequest) -> bool:
        return req.kind in KINDS

    def namespace(self, req: GenRequest) -> str:
        """The exact key of the whole request with only the text compared by meaning left out
        (the last user turn's text, or the prompt)."""
        body = {k: v for k, v in req.body.items() if k not in DELIVERY}
        if req.kind != "chat":
            body["prompt"] = None
            return request_key(req, req.client or "", body)
        messages = body.get("messages")
        if isinstance(messages, list):
            last = _last_user(messages)
            if last >= 0:
                turn = messages[last]
                body["messages"] = [*messages[:last], {**turn, "content": _without_text(turn.get("content"))}]
                body["messages"] += messages[last + 1 :]
        return request_key(req, req.client or "", body)

    def question(self, req: GenRequest) -> str:
        """The text compared by meaning: the last user turn's, or the prompt."""
        if req.kind != "chat":
            return _text(req.body.get("prompt"))
        messages = req.body.get("messages")
        if not isinstance(messages, list):
            return ""
        last = _last_user(messages)
        return _text(messages[last].get("content")) if last >= 0 else ""

    async def vector(self, req: GenRequest, rec: RequestRecord) -> bytes | None:
        """The request's unit vector (float32 bytes), or None (no question, or no embedding)."""
        question = self.question(req)
        if not question.strip():
            return None
        got = await self._embed([question], req, rec)
        if not got:
            return None
        return _unit(np.asarray(got[0], dtype=np.float32)).astype(np.float32).tobytes()

    async def nearest(self, ns: str, vector: bytes) -> str | None:
        """The key of the closest kept answer in `ns` at least `threshold` alike, or None."""
        if self.index.size > 2 * self.max_entries:  # many stale vectors: read the store's afresh
            self.index.clear()
            self.cursor = None
        rows, self.cursor = await self.store.vectors(self.cursor)
        for key, space, v in rows:
            self.index.add(key, space, v)
        return self.index.nearest(ns, np.frombuffer(vector, dtype=np.float32), self.threshold)

    def keepable(self, req: GenRequest, found: Answer) -> bool:
        """May this answer be found by meaning? Not when it, or its question, is personal."""
        texts = [c.text for c in found.choices] + [c.thinking for c in found.choices]
        texts += [json.dumps(c.tool_calls) for c in found.choices if c.tool_calls]
        return not personal(self.question(req), *texts)

    def clear(self) -> None:
        self.index.clear()
        self.cursor = None

    async def _embed(self, texts: list[str], req: GenRequest, rec: RequestRecord) -> list[list[float]] | None:
        """`texts` embedded by the embedding model through this router's own endpoints, as a
        request of its own (`<request id>.embed`: accounted like any)."""
        router = self.owner
        body = {"model": self.model, "input": texts}
        sub = GenRequest(
            "ollama", "embed", "/api/embed", self.model, False, body, json.dumps(body).encode(), time.perf_counter()
        )
        sub.client = req.client
        step = RequestRecord(f"{rec.request_id}.embed", "ollama", "/api/embed", self.model, False, req.client)
        got = Whole()
        await router.proxy.handle(sub, got.send, step)  # (recorded there like any request)
        if got.status != 200:
            return None
        try:
            vectors = json.loads(got.body()).get("embeddings")
        except (ValueError, AttributeError):
            return None
        return vectors if isinstance(vectors, list) and vectors and isinstance(vectors[0], list) else None


def _last_user(messages: list[object]) -> int:
    """The index of the last user message, or -1."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, dict) and m.get("role") == "user":
            return i
    return -1


def _without_text(content: object) -> object:
    """A message's content with its text left out and every other part kept (images, audio,
    files): a plain string is "", a text part keeps its place without its text."""
    if isinstance(content, str):
        return ""
    if isinstance(content, list):
        return [
            {k: v for k, v in p.items() if k != "text"} if isinstance(p, dict) and p.get("type") == "text" else p
            for p in content
        ]
    return content


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v
