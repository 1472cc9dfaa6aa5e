"""Writes docs/cli-reference.md from the programs' own --help, so the flag lists cannot drift
from the code: `python docs/cli_reference.py` (make docs runs it before building the site;
test/test_readme.py checks the committed page is current)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cli-reference.md"

PROGRAMS = [
    ("nomyo-router", "the router", ["-m", "nomyo_router"]),
    ("nomyo-loadtest", "the load tester (also `python loadtest.py`, `python -m loadtest`)", ["-m", "loadtest"]),
    ("nomyo-loadtest compare", "the CI gate on two load-test results", ["-m", "loadtest", "compare"]),
    ("nomyo-mock", "the mock backend (also `python -m mock`)", ["-m", "mock"]),
]

HEAD = """# Command-line reference

Every flag of the three programs `pip install` puts on PATH, with its default, exactly as
their `--help` prints it (this page is generated from it by `docs/cli_reference.py`). Guides:
[getting started](getting-started.md), [the load tester](loadtest.md), [the mock](mock.md).
"""


def help_text(args: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NOMYO_ROUTER_CONFIG"}
    env["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it
    out = subprocess.run(
        [sys.executable, *args, "--help"], capture_output=True, text=True, cwd=ROOT, env=env, check=True, timeout=60
    )
    return out.stdout.rstrip()


def render() -> str:
    parts = [HEAD]
    for name, what, args in PROGRAMS:
        parts.append(f"## `{name}`\n\n{what[0].upper() + what[1:]}.\n\n```text\n{help_text(args)}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(ROOT)}")
