"""What refusing ambiguous bodies (nomyo_router/api/body_keys.py) costs: µs per parse, in-process.

    python bench/body_keys.py [--runs 9]

Times `nomyo_router.api.requests.parse()` per call on typical bodies, "before" and "after":
before is the same function with the body read by plain `json.loads` (the checks swapped out
for the run, so nothing else differs), after is the function as it is. `json.loads` alone is
shown for scale. Each figure is the median of `--runs` timeit runs of about 0.2 s each, timed
in the process's CPU time (on a shared machine, wall time also counts the other processes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import timeit
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nomyo_router.api import body_keys, requests  # noqa: E402

LOREM = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "


def bodies() -> list[tuple[str, str, bytes]]:
    """(label, route, body) for the typical shapes."""
    small = {
        "model": "llama3",
        "stream": True,
        "options": {"num_predict": 64, "temperature": 0.7},
        "messages": [
            {
                "role": "user",
                "content": "Why is the sky blue? Explain it briefly to a child, "
                "in two or three sentences please, thanks a lot.",
            }
        ],
    }
    long = {
        "model": "llama3",
        "stream": True,
        "options": {"num_predict": 64},
        "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": LOREM * 13} for i in range(20)],
    }
    escaped = {
        "model": "llama3",
        "stream": False,  # json.dumps escapes non-ASCII as \uXXXX (ensure_ascii)
        "messages": [{"role": "user", "content": "Почему небо голубое? 为什么天空是蓝色的？ Warum ist er blau? " * 12}],
    }
    tool = {
        "model": "llama3",
        "stream": False,
        "messages": [{"role": "user", "content": "run the model"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "run_model",
                    "description": "Run a model on an input",
                    "parameters": {
                        "type": "object",
                        "required": ["model", "input"],
                        "properties": {
                            "model": {"type": "string", "description": "which model"},
                            "input": {"type": "string", "description": "what to give it"},
                        },
                    },
                },
            }
        ],
    }
    openai = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Why is the sky blue?"},
        ],
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 128,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "bench",
    }
    return [
        ("1-message chat", "/api/chat", json.dumps(small).encode()),
        ("20-message chat", "/api/chat", json.dumps(long).encode()),
        ("non-ASCII chat as \\uXXXX", "/api/chat", json.dumps(escaped).encode()),
        ('tool call with nested "model"', "/api/chat", json.dumps(tool).encode()),
        ("OpenAI chat, 8 top-level keys", "/v1/chat/completions", json.dumps(openai).encode()),
    ]


@contextlib.contextmanager
def before() -> Iterator[None]:
    """requests.load_json reading the body with plain json.loads, as it did before the checks."""
    real = body_keys.loads
    body_keys.loads = json.loads  # type: ignore[assignment]
    try:
        yield
    finally:
        body_keys.loads = real  # type: ignore[assignment]


def per_call(fn: Any, runs: int) -> float:
    """µs per call: the median of `runs` timeit runs sized to about 0.2 s each."""
    timer = timeit.Timer(fn, timer=time.process_time)  # CPU time: other processes on the machine count less
    number, _ = timer.autorange()
    number = max(1, number)
    return statistics.median(timer.repeat(number=number, repeat=runs)) / number * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=9)
    args = p.parse_args()
    t0 = time.perf_counter()
    print(f"{'body':34} {'bytes':>7} {'json.loads':>11} {'parse before':>13} {'parse after':>12} {'added':>7}")
    for label, route, raw in bodies():
        assert requests.parse(route, raw, t0).body == json.loads(raw)
        loads = per_call(lambda raw=raw: json.loads(raw), args.runs)
        with before():
            old = per_call(lambda route=route, raw=raw: requests.parse(route, raw, t0), args.runs)
        new = per_call(lambda route=route, raw=raw: requests.parse(route, raw, t0), args.runs)
        print(f"{label:34} {len(raw):7d} {loads:11.2f} {old:13.2f} {new:12.2f} {new - old:+7.2f}")
    print("(µs per call, median of", args.runs, "runs)")


if __name__ == "__main__":
    main()
