"""The systemd unit (deploy/systemd/nomyo-router.service): hardened, verified by
`systemd-analyze verify` and `systemd-analyze security` (skipped with the reason when absent);
then its ExecStart run as written, outside systemd, against the mock backend, and its
ExecReload's SIGHUP keeping the router up."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator

import pytest

from mock import MockProcess, free_port
from test.deploy_files import (
    CONTAINER_CONFIG,
    ROOT,
    container_command,
    health,
    mock_backend,
    run,
    serve,
    stop,
    tool,
    write_config,
)

UNIT = ROOT / "deploy/systemd/nomyo-router.service"


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit_is_hardened():
    s = unit_settings()
    for key, value in {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictNamespaces": "yes",
        "UMask": "0077",
        "CapabilityBoundingSet": "",
        "MemoryDenyWriteExecute": "yes",
        "WorkingDirectory": "/var/lib/nomyo-router",
    }.items():
        assert s.get(key) == [value], key
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # SIGHUP reloads the config in place
    command = shlex.split(s["ExecStart"][0])
    assert command[0].endswith("/nomyo-router") and command[1:5] == container_command()[1:]


def test_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is absent")
    # verify wants ExecStart's program to exist: the installed one stands in for /opt/...
    command = shlex.split(unit_settings()["ExecStart"][0])
    unit = tmp_path / "nomyo-router.service"
    unit.write_text(UNIT.read_text().replace(command[0], tool("nomyo-router") or sys.executable))
    out = run([analyze, "verify", str(unit)])
    assert out.returncode == 0 and "nomyo-router.service" not in out.stdout + out.stderr, out.stdout + out.stderr
    out = run([analyze, "security", "--offline=true", "--threshold=20", str(unit)])  # exposure <= 2.0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr


# ---------------------------------------------------------------- the unit's command, run for real


@pytest.fixture
def backend() -> Iterator[MockProcess]:
    with mock_backend() as m:
        yield m


def test_the_systemd_command_serves_health_and_reloads_outside_systemd(tmp_path, backend):
    """ExecStart as written, with the binary from this install, the config for the mock and a
    free port; the unit's environment and working directory; ExecReload's SIGHUP keeps it up."""
    settings = unit_settings()
    config, port = write_config(tmp_path, backend), free_port()
    command = shlex.split(settings["ExecStart"][0])
    command = [tool("nomyo-router") or "", *command[1:]]
    command = [str(config) if a == CONTAINER_CONFIG else str(port) if a == "12434" else a for a in command]
    assert command[0] and str(port) in command
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}  # Environment=XDG_RUNTIME_DIR=%t/nomyo-router
    assert [e for e in settings["Environment"] if e.startswith("XDG_RUNTIME_DIR=")]
    proc = serve(command, state, env, port)
    try:
        os.kill(proc.pid, signal.SIGHUP)  # ExecReload
        time.sleep(0.5)
        assert proc.poll() is None and health(port) == 200
    finally:
        assert stop(proc) == 0
