"""What a multi-worker router creates in its private directory goes when it stops (SIGTERM),
what a SIGKILLed one left goes when the next one starts, and a living router's files are
never touched by another. Real routers, real directories."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mock import MockConfig, MockProcess
from nomyo_router.ops import private_dir_cleanup as leftovers
from test.process_tree import descendants, health, supervisor, wait_gone, write_config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture(scope="module")
def backend_url():
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=4, parallel=64)) as m:
        yield m.url


@pytest.fixture
def xdg(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return run


def config(tmp_path: Path, url: str) -> Path:
    return write_config(tmp_path, {"endpoints": [{"url": url, "name": "m"}]})


def entries_of(directory: Path, pid: int) -> dict[str, int]:
    """name -> inode of everything in `directory` named after supervisor `pid`."""
    if not directory.is_dir():
        return {}
    return {p.name: p.stat().st_ino for p in directory.iterdir() if leftovers.owner_pid(p.name) == pid}


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_sigterm_to_the_supervisor_removes_everything_it_created(tmp_path, xdg, backend_url):
    cfg = config(tmp_path, backend_url)
    with supervisor(cfg, 2, env={"XDG_RUNTIME_DIR": str(xdg)}) as (url, proc):
        private = xdg / "nomyo-router"
        made = entries_of(private, proc.pid)
        tag = next(n for n in made if n.endswith(".lock")).split(".")[0]
        assert {
            f"supervisor-{proc.pid}",
            f"metrics-{proc.pid}",
            f"{tag}.lock",
            f"{tag}.sock",
            f"{tag}.slots",
            f"{tag}.pins",
        } <= set(made), made
        assert any((private / f"metrics-{proc.pid}").iterdir())  # the workers' prometheus files
        tree = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)  # the supervisor alone
        assert proc.wait(20) == 0
        assert not wait_gone(tree, 3.0)
        assert sorted(os.listdir(private)) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["router.yaml", "run", "usage.db"]  # (no -wal, -shm)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_without_xdg_runtime_dir_the_files_in_dev_shm_go_too(tmp_path, backend_url):
    """The default place is /dev/shm/nomyo-router-<uid> (tmpfs). Other routers may use it at
    the same time: only what is named after this supervisor is looked at."""
    shm = Path(f"/dev/shm/nomyo-router-{os.geteuid()}")
    unset = ("XDG_RUNTIME_DIR", "NOMYO_ROUTER_STATE_PATH", "PROMETHEUS_MULTIPROC_DIR")
    with supervisor(config(tmp_path, backend_url), 2, unset=unset) as (url, proc):
        made = entries_of(shm, proc.pid)
        assert f"metrics-{proc.pid}" in made and any(n.endswith(".slots") for n in made), made
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(20) == 0
        assert entries_of(shm, proc.pid) == {}


@pytest.mark.parametrize("workers", [1, 2])
def test_what_dead_routers_left_is_removed_at_start_and_nothing_else(tmp_path, xdg, backend_url, workers):
    private = xdg / "nomyo-router"
    private.mkdir(mode=0o700)
    dead = dead_pid()
    sleeper = subprocess.Popen(["sleep", "60"])  # a living pid that is no router of ours
    me = os.getpid()  # a living pid without a record: may be a router of an older version
    try:
        stale = [
            f"metrics-{dead}",
            f"{dead}-0a1b2c3d.lock",
            f"{dead}-0a1b2c3d.sock",
            f"{dead}-0a1b2c3d.slots",
            f"{dead}-0a1b2c3d.pins",
            f"supervisor-{dead}",
            # the pid was given to another process since: its record says another start time
            f"metrics-{sleeper.pid}",
            f"{sleeper.pid}-0a1b2c3d.lock",
            f"supervisor-{sleeper.pid}",
        ]
        kept = [f"metrics-{me}", f"{me}-0a1b2c3d.lock", "notes.txt", "metrics-abc", "0-0a1b2c3d.lock", f"{dead}.lock"]
        for name in stale + kept:
            if name.startswith("metrics-"):
                (private / name).mkdir(mode=0o700)
                (private / name / "counter_1.db").write_bytes(b"x")
            else:
                (private / name).write_text("")
        (private / f"supervisor-{sleeper.pid}").write_text(str(leftovers.start_ticks(sleeper.pid) - 1))
        (private / f"metrics-{dead}0").symlink_to(tmp_path)  # not a directory of ours: left alone
        kept.append(f"metrics-{dead}0")
        with supervisor(config(tmp_path, backend_url), workers, env={"XDG_RUNTIME_DIR": str(xdg)}) as (_, proc):
            names = set(os.listdir(private))
            assert not names & set(stale), sorted(names & set(stale))
            assert set(kept) <= names, sorted(set(kept) - names)
            assert (tmp_path / "router.yaml").exists()  # (the symlink's target was not followed)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_second_router_leaves_a_living_routers_files_alone(tmp_path, xdg, backend_url):
    env = {"XDG_RUNTIME_DIR": str(xdg)}
    private = xdg / "nomyo-router"
    with supervisor(config(tmp_path, backend_url), 2, env=env) as (url_a, a):
        before = entries_of(private, a.pid)
        assert len(before) >= 6
        other = tmp_path / "b"
        other.mkdir()
        with supervisor(config(other, backend_url), 2, env=env) as (url_b, b):
            assert entries_of(private, a.pid) == before  # same names, same inodes
            assert entries_of(private, b.pid)
            os.kill(b.pid, signal.SIGTERM)
            assert b.wait(20) == 0
            assert entries_of(private, b.pid) == {}
        assert entries_of(private, a.pid) == before
        assert health(url_a) == 200
        with urllib.request.urlopen(url_a + "/metrics", timeout=5) as r:  # reads metrics-<a.pid>
            assert r.status == 200 and b"nomyo" in r.read()


def test_sweep_keeps_entries_it_cannot_prove_dead(tmp_path):
    """Unit level: another user's file, a living pid without a record, a zombie's, and a dead
    supervisor's whose orphaned worker still holds the shared-state lock."""
    dead, dead_but_hosting = dead_pid(), dead_pid()
    (tmp_path / f"{dead}-aa.lock").write_text("")
    for name in (f"{dead_but_hosting}-aa.lock", f"{dead_but_hosting}-aa.slots", f"metrics-{dead_but_hosting}"):
        (tmp_path / name).mkdir() if name.startswith("metrics-") else (tmp_path / name).write_text("")
    held = os.open(tmp_path / f"{dead_but_hosting}-aa.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # (as the host worker does; another open file conflicts even here)
    (tmp_path / f"{os.getpid()}-aa.lock").write_text("")
    if os.geteuid() == 0:
        (tmp_path / f"{dead}-bb.lock").write_text("")
        os.chown(tmp_path / f"{dead}-bb.lock", 65534, 65534)
    zombie = subprocess.Popen(["true"])  # exits at once; not reaped until wait(): a zombie
    time.sleep(0.2)
    (tmp_path / f"{zombie.pid}-aa.lock").write_text("")
    try:
        assert leftovers.sweep(str(tmp_path)) == [f"{dead}-aa.lock"]
        left = set(os.listdir(tmp_path))
        assert f"{os.getpid()}-aa.lock" in left and f"{zombie.pid}-aa.lock" in left
        assert os.geteuid() != 0 or f"{dead}-bb.lock" in left
        assert {f"{dead_but_hosting}-aa.slots", f"metrics-{dead_but_hosting}"} <= left
        os.close(held)  # the last orphan is gone: now they go
        assert sorted(leftovers.sweep(str(tmp_path))) == sorted(
            [f"{dead_but_hosting}-aa.lock", f"{dead_but_hosting}-aa.slots", f"metrics-{dead_but_hosting}"]
        )
    finally:
        zombie.wait()
