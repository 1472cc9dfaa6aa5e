"""What the deployment tests share: the repository's paths, the tools (from the venv, else
PATH), the Dockerfile read as (instruction, arguments), and how the deployment files' command
lines are run for real outside a container, systemd or a cluster, against the mock backend."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from mock import MockConfig, MockProcess

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CONTAINER_CONFIG = "/etc/nomyo-router/config.yaml"


def tool(name: str) -> str | None:
    """An executable from the venv (pip-installed tools), else from PATH."""
    return shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, **kw)


def check_config(path: Path, env: dict[str, str] | None = None) -> None:
    out = run(
        [sys.executable, "-m", "nomyo_router", "--config", str(path), "--check"], env={**os.environ, **(env or {})}
    )
    assert out.returncode == 0, f"{path}: {out.stderr}"


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def container_command() -> list[str]:
    """ENTRYPOINT + CMD of the final stage (both in exec form)."""
    entry = [json.loads(a) for i, a in dockerfile() if i == "ENTRYPOINT"][-1]
    cmd = [json.loads(a) for i, a in dockerfile() if i == "CMD"][-1]
    return entry + cmd


@contextmanager
def mock_backend() -> Iterator[MockProcess]:
    """The mock backend the command lines are served against, in a process of its own."""
    m = MockProcess(MockConfig(ttft_ms=0, tokens=4, tok_ms=0)).start()
    try:
        yield m
    finally:
        m.stop()


def health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def serve(command: list[str], cwd: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while health(port) != 200:
        if proc.poll() is not None:
            raise AssertionError(f"{command} exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        assert time.monotonic() < deadline, f"{command}: /health never answered 200"
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen) -> int:
    """SIGTERM, as docker stop and systemctl stop send; uvicorn shuts down gracefully, then
    re-raises the signal, so a clean stop is exit status 0 or -SIGTERM."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(40)
        return 0 if code == -signal.SIGTERM else code
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def write_config(tmp_path: Path, backend: MockProcess) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"endpoints": [{"url": backend.url, "name": "mock", "max_concurrent": 2}]}))
    return config
