"""Shared-prefix workloads (`--prefix-groups G --prefix-tokens P`) and the mocks' KV hit rate.

G applications each have a system prompt of about P tokens; every conversation picks one
(uniformly, or Zipf-skewed with `--prefix-skew S`: group k has weight 1/k^S), so requests
share prefixes across users, as an application's system prompt, a RAG document or an
agent's tool definitions do. Combined with `--turns`, each conversation then grows.
"""

from __future__ import annotations

import argparse
import json
import random
import urllib.request
from typing import Any

from .workload import filler_text


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("shared prefixes")
    g.add_argument(
        "--prefix-groups",
        type=int,
        default=0,
        help="G applications, each with its own shared system prompt (default: off)",
    )
    g.add_argument("--prefix-tokens", type=int, default=2000, help="tokens per shared prefix (default: 2000)")
    g.add_argument(
        "--prefix-skew",
        type=float,
        default=0.0,
        help="Zipf exponent of the groups' popularity (0: uniform; 1.5: one hot prefix)",
    )


class Prefixes:
    """The G shared prefixes and a seeded chooser."""

    def __init__(self, groups: int, tokens: int, skew: float = 0.0, seed: int = 0) -> None:
        self.texts = [filler_text(tokens, f"[application {g}: shared instructions] ") for g in range(groups)]
        self.weights = [1.0 / (k + 1) ** skew for k in range(groups)]
        self.rng = random.Random(seed)

    def pick(self) -> str:
        return self.rng.choices(self.texts, self.weights)[0]


def kv_stats(mock_urls: list[str]) -> dict[str, Any]:
    """Each mock's KV prefix-cache counters (/mock/stats) and the token hit rate over all
    (of the mocks that answer: a killed one is listed as unreachable)."""
    per: dict[str, Any] = {}
    hit = miss = 0
    for url in mock_urls:
        try:
            with urllib.request.urlopen(url + "/mock/stats", timeout=5) as r:
                kv = json.load(r)["kv_cache"]
        except OSError as e:  # a mock a --fault killed (its counters died with it)
            per[url] = {"unreachable": str(getattr(e, "reason", e))}
            continue
        per[url] = kv
        hit += kv["hit_tokens"]
        miss += kv["miss_tokens"]
    return {"hit_rate": hit / (hit + miss) if hit + miss else None, "per_mock": per}
