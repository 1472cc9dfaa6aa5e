"""Numbers formatted by kind: counts as integers, rates and times with 3 significant digits,
in the terminal table, the knee line and the HTML report."""

from __future__ import annotations

import io

from rich.console import Console

from loadtest.numbers import count, load, sig
from loadtest.report import knee_line, table


def test_kinds():
    assert [sig(v) for v in (371.681, 1513.2, 0.08213, 54.03, 0.146, 48424.3, 0)] == [
        "372", "1513", "0.0821", "54.0", "0.146", "48424", "0",
    ]  # fmt: skip
    assert count(8.0) == "8" and count(7669) == "7669"
    assert load(32.0, "closed") == "32" and load(22.5, "open") == "22.5" and load(8.0, "open") == "8"


def test_terminal_table_and_knee_line():
    stage = {
        "load": 8.0, "requests": 736, "completed": 736, "failed": 0, "request_throughput": 146.5812,
        "median_e2el_ms": 54.0312, "p90_e2el_ms": 55.31, "p99_e2el_ms": 56.456, "max_e2el_ms": 58.5,
        "median_ttft_ms": 21.61, "p99_ttft_ms": 24.1, "output_throughput": 4691.2,
        "median_router_overhead_ms": 0.08213, "client": {"bottleneck": False},
    }  # fmt: skip
    knee = {"knee_load": 8.0, "max_request_throughput": 371.681, "max_throughput_load": 32.0, "saturation_load": 32.0}
    out = io.StringIO()
    Console(file=out, width=200).print(table([stage], knee, "closed"))
    row = next(line for line in out.getvalue().splitlines() if "736" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:13] == [
        "8",
        "736",
        "736",
        "0",
        "147",
        "54.0",
        "55.3",
        "56.5",
        "58.5",
        "21.6",
        "24.1",
        "4691",
        "0.0821",
    ]
    assert knee_line(knee, "closed") == "knee: 8 concurrent  |  max throughput: 372 req/s at 32  |  saturates at: 32"
    assert knee_line(knee | {"knee_load": 22.5}, "open").startswith("knee: 22.5 req/s offered")
