"""How reliable is `loadtest compare` as a CI gate on this machine?

Per trial: a baseline run, a run of the identical build, and a run whose mock backend is
20% slower (TTFT and per-token time x1.2), each `python loadtest.py --mock-backend` with
`--repeat`; then `loadtest compare` of each against the baseline with the given
thresholds. Prints how many identical pairs passed and how many slower pairs failed.

  python bench/compare_gate.py                       # 20 trials, defaults below
  python bench/compare_gate.py --trials 5 --repeat 5 --duration 2 --ramp 8,32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLOWER = 1.2


def run(out: str, args: argparse.Namespace, slow: bool) -> None:
    ttft, tok = args.ttft_ms * (SLOWER if slow else 1), args.tok_ms * (SLOWER if slow else 1)
    cmd = [
        sys.executable,
        "loadtest.py",
        "--mock-backend",
        "--ramp",
        args.ramp,
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--repeat",
        str(args.repeat),
        "--mock-ttft-ms",
        str(ttft),
        "--mock-tok-ms",
        str(tok),
        "--mock-tokens",
        str(args.tokens),
        "--quiet",
        "--json",
        out,
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"loadtest failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")


def compare(base: str, cur: str, args: argparse.Namespace) -> tuple[int, str]:
    cmd = [sys.executable, "loadtest.py", "compare", base, cur, "--max-regression", args.max_regression]
    if args.advisory:
        cmd += ["--advisory", args.advisory]
    if args.strict:  # gate stages flagged MACHINE-BUSY too (else they exit 3: not comparable here)
        cmd.append("--strict")
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr
    return p.returncode, last


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--ramp", default="8,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--warmup", type=float, default=0.3)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--tok-ms", type=float, default=1.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-regression", default="throughput=10%,p50=15%,p99=30%,ttft=15%")
    ap.add_argument("--advisory", default="")
    ap.add_argument("--strict", action="store_true", help="pass --strict to compare (gate flagged stages)")
    ap.add_argument("--keep", default=None, help="keep the JSON files in this directory")
    args = ap.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="compare-gate-")
    os.makedirs(tmp, exist_ok=True)
    same_pass = slow_fail = busy = 0
    t0 = time.time()
    for i in range(args.trials):
        base, same, slow = (os.path.join(tmp, f"{k}{i}.json") for k in ("base", "same", "slow"))
        run(base, args, False)
        order = [(same, False), (slow, True)] if i % 2 == 0 else [(slow, True), (same, False)]
        for path, is_slow in order:  # alternate, so drift during a trial favours neither
            run(path, args, is_slow)
        rc_same, why_same = compare(base, same, args)
        rc_slow, why_slow = compare(base, slow, args)
        same_pass += rc_same == 0
        slow_fail += rc_slow == 1
        busy += (rc_same == 3) + (rc_slow == 3)
        print(
            f"trial {i + 1:2d}: identical -> exit {rc_same} ({why_same}); 20% slower -> exit {rc_slow} ({why_slow})",
            flush=True,
        )
    print(
        json.dumps(
            {
                "trials": args.trials,
                "identical_passed": same_pass,
                "slower_failed": slow_fail,
                "repeat": args.repeat,
                "ramp": args.ramp,
                "duration": args.duration,
                "max_regression": args.max_regression,
                "advisory": args.advisory,
                "strict": args.strict,
                "not_comparable_here": busy,
                "seconds": round(time.time() - t0),
            }
        )
    )
    print(
        f"identical builds passed {same_pass} of {args.trials}; 20% slower backend failed {slow_fail} of {args.trials}"
    )
    return 0 if same_pass >= args.trials * 0.95 and slow_fail >= args.trials * 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
