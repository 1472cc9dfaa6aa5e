"""What conversation affinity buys, measured with the load tester's multi-turn workload.

    python bench/affinity.py [--contexts 2000,8000,16000,32000] [--conversations 20] [--turns 10]

Two mocks with the simulated KV prefix cache (prefill 25 ms per 1k uncached tokens, a
10x faster "GPU" than Olla's measurement so the run takes minutes, not hours); each
conversation opens with `context` tokens of history and grows each turn. Compared:
affinity off (least busy alone), the cache-aware prefix index alone (no pins), affinity on
(cache_aware, the default) without a header, and with X-Session-ID.
Reports turn>=2 TTFT p50 per context, the hit rate over turns >= 2, and the load split.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = {
    "off": ["--router-set", "conversation_affinity=false", "--router-set", "routing=least_busy"],
    "index": ["--router-set", "conversation_affinity=false"],  # cache_aware's prefix index alone
    "on": [],
    "header": ["--session-header", "X-Session-ID"],
}


def run(context: int, mode: str, conversations: int, turns: int, prefill: float, extra: list[str]) -> dict:
    # Each mock's KV cache holds a bit more than its half of the conversations (as a real
    # GPU's would hold a limited number of long contexts); without affinity it thrashes.
    kv_tokens = int(conversations * (context + turns * 300) * 0.6)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [
        sys.executable,
        os.path.join(ROOT, "loadtest.py"),
        "--mock-backend",
        "--mock-count",
        "2",
        "--mock-ttft-ms",
        "20",
        "--mock-tokens",
        "32",
        "--mock-tok-ms",
        "1",
        "--mock-parallel",
        "8",
        "--mock-prefill-ms-per-1k-tokens",
        str(prefill),
        "--mock-kv-cache-tokens",
        str(kv_tokens),
        "--router-max-conc",
        "8",
        "--concurrency",
        str(conversations),
        "--turns",
        str(turns),
        "--requests",
        str(conversations * turns),
        "--warmup",
        "0",
        "--context-tokens",
        str(context),
        "--quiet",
        "--json",
        out,
        *MODES[mode],
        *extra,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    with open(out) as f:
        doc = json.load(f)
    os.unlink(out)
    return doc["stages"][0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", default="2000,8000,16000,32000")
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--prefill-ms-per-1k", type=float, default=25.0)
    p.add_argument("--json", default=None)
    args, extra = p.parse_known_args()
    rows = []
    print(f"{'context':>8} {'mode':>7} {'ttft2+ p50':>11} {'hit rate':>9} {'split':>12} {'ok':>5}")
    for context in [int(c) for c in args.contexts.split(",")]:
        base = None
        for mode in MODES:
            s = run(context, mode, args.conversations, args.turns, args.prefill_ms_per_1k, extra)
            aff = s.get("affinity_turn2plus", {})
            later = sum(aff.values())
            hit = aff.get("hit", 0) / later if later else None
            eps = s["endpoints"]
            total = sum(eps.values()) or 1
            split = "/".join(f"{100 * v / total:.0f}" for _, v in sorted(eps.items()))
            ttft = s.get("median_ttft_turn2plus_ms")
            if mode == "off":
                base = ttft
            speedup = f"  {base / ttft:.1f}x" if base and ttft and mode != "off" else ""
            rows.append(
                {
                    "context": context,
                    "mode": mode,
                    "ttft_turn2plus_p50_ms": ttft,
                    "hit_rate": hit,
                    "outcomes": aff,
                    "split": eps,
                    "completed": s["completed"],
                    "failed": s["failed"],
                }
            )
            print(
                f"{context:>8} {mode:>7} {ttft:>9.1f}ms {'' if hit is None else f'{hit:.1%}':>9} "
                f"{split:>12} {s['completed']:>5}{speedup}  {aff}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
