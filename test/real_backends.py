"""The real servers in ../shared/real-backends (a real Ollama, llama-cpp-python's OpenAI-only
server), started by their own scripts, for the conformance tests."""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mock import free_port

REPO = Path(__file__).resolve().parent.parent
SHARED = next((p for p in (REPO.parent / "shared", Path("/work/shared")) if (p / "real-backends").is_dir()), None)


def require(what: str) -> Path:
    """The real-backends directory, or a skip naming what the test would have used."""
    if SHARED is None:
        pytest.skip(f"../shared/real-backends is absent: {what}")
    return SHARED / "real-backends"


def start(script: str, *args: str, timeout: float = 180) -> tuple[str, int]:
    """Run `script PORT *args` (it prints the server's pid last): (url, pid)."""
    port = free_port()
    out = subprocess.run(
        [str(require("no real backend to start") / script), str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        pytest.fail(f"{script} failed: {out.stderr[-500:]}")
    return f"http://127.0.0.1:{port}", int(out.stdout.strip().splitlines()[-1])


def ollama_server(why: str, parallel: int = 2) -> Iterator[str]:
    """A real Ollama (models tiny and tiny2) for one test module's fixture: `yield from` it.
    Skipped, saying `why`, where the real backends are absent; stopped when the module ends."""
    require(why)
    url, pid = start("start-ollama.sh", str(parallel), tempfile.mkdtemp(prefix="ollama-test-"))
    try:
        yield url
    finally:
        os.kill(pid, 15)


def ollama_cli() -> Path:
    """The real `ollama` binary (the CLI), unpacked where start-ollama.sh puts it (its
    `.bin/`, or `$TMPDIR/ollama-real-bin` when that is read-only) if no server was started
    yet: a test that only runs the CLI must not depend on the order the suite runs in."""
    here = require("no real ollama CLI")
    bindirs = (here / ".bin", Path(os.environ.get("TMPDIR", "/tmp")) / "ollama-real-bin")
    for bindir in bindirs:
        if (bindir / "ollama").exists():
            return bindir / "ollama"
    for bindir in bindirs:
        part = bindir / f"ollama.tmp.{os.getpid()}"
        try:
            bindir.mkdir(parents=True, exist_ok=True)
            with lzma.open(here / "ollama.xz") as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except OSError:
            part.unlink(missing_ok=True)  # (a read-only or full place: try the next)
            continue
        part.chmod(0o755)
        part.replace(bindir / "ollama")  # (atomic: a server starting meanwhile sees all or nothing)
        return bindir / "ollama"
    pytest.fail(f"could not unpack {here / 'ollama.xz'}")
