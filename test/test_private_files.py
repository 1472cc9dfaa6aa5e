"""Every file the router writes is its user's alone, whatever the umask it was started with.

The usage database (with its SQLite `-wal` and `-shm` files) names every client and model
with their traffic; the shared-state directory holds the workers' socket, lock, tables and
metrics. Files are 0600, directories 0700 — tested under the usual umask 022 (and 000 for
SQLite, which creates its files 0644 less the umask by itself).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from nomyo_router.events import Events
from nomyo_router.ops.usage.store import SqliteUsage
from nomyo_router.state import private
from test.helpers import endpoints, run_router
from test.router_proc import router_workers

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask() -> Iterator[object]:
    """Sets the process umask for the test (parametrize it), and puts the old one back."""
    old = os.umask(0o022)
    try:
        yield lambda m: os.umask(m)
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o000], ids=["umask022", "umask000"])
async def test_the_usage_database_and_its_wal_and_shm_are_0600(tmp_path, umask, mask):
    umask(mask)
    db = str(tmp_path / "usage.db")
    usage = SqliteUsage(Events(), db)
    await usage.start()
    try:
        await usage._write({("2024-01-01", "m", "e", "c"): [1, 0, 2, 3, 0, 0]})
        files = {p.name: mode(p) for p in tmp_path.iterdir()}
        assert files == {"usage.db": 0o600, "usage.db-wal": 0o600, "usage.db-shm": 0o600}
    finally:
        await usage.close()
    assert mode(db) == 0o600


async def test_an_older_readable_usage_database_is_made_private(tmp_path, umask):
    db = tmp_path / "usage.db"
    for name in ("usage.db", "usage.db-wal", "usage.db-shm"):
        (tmp_path / name).touch(0o644)  # (empty files: SQLite takes them as a new database)
        os.chmod(tmp_path / name, 0o644)
    usage = SqliteUsage(Events(), str(db))
    await usage.start()
    try:
        assert {p.name: mode(p) for p in tmp_path.iterdir()} == dict.fromkeys(
            ("usage.db", "usage.db-wal", "usage.db-shm"), 0o600
        )
    finally:
        await usage.close()


async def test_the_router_writes_its_usage_database_private(mock, tmp_path, umask):
    cfg = {"endpoints": endpoints(mock), "usage_db": str(tmp_path / "u.db")}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        async with s.post(r.url + "/api/chat", json=CHAT) as resp:
            assert resp.status == 200
        async with s.get(r.url + "/api/usage") as resp:  # hands the batch to SQLite now
            assert (await resp.json())["totals"]["requests"] == 1
        modes = {p.name: mode(p) for p in tmp_path.iterdir()}
    assert modes["u.db"] == 0o600 and set(modes.values()) == {0o600}, modes


def test_the_state_directory_is_created_and_kept_0700(tmp_path, umask):
    fresh = str(tmp_path / "fresh")
    assert private.ensure_private_dir(fresh) == fresh and mode(fresh) == 0o700
    older = tmp_path / "older"
    older.mkdir()
    os.chmod(older, 0o755)  # ours, nobody else may write it: tightened rather than refused
    private.ensure_private_dir(str(older))
    assert mode(older) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o775)  # someone else might have planted files: refused
    with pytest.raises(private.UnsafeStatePath, match="writable by group"):
        private.ensure_private_dir(str(open_dir))


def test_a_readable_state_file_of_ours_is_made_0600_before_use(tmp_path):
    f = tmp_path / "1-abc.slots"
    f.write_bytes(b"")
    os.chmod(f, 0o644)
    private.check_file(str(f))
    assert mode(f) == 0o600
    private.check_file(str(tmp_path / "absent.lock"))  # absent: fine, its owner creates it 0600


async def test_every_file_of_two_workers_is_0600_in_a_0700_directory(mock, tmp_path, monkeypatch, umask):
    """`nomyo-router --workers 2` under umask 022: socket, lock, slot and pin tables, the
    metrics files each worker writes, and the usage database."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("NOMYO_ROUTER_STATE_PATH", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    state = tmp_path / "nomyo-router"
    state.mkdir(0o755)  # left by an older version, readable by others
    os.chmod(state, 0o755)
    db = tmp_path / "usage.db"
    cfg = {"endpoints": [{"url": mock.url, "name": "m"}], "usage_db": str(db)}
    with router_workers(cfg, 2, wait=False) as (url, _):
        from test.router_proc import ready

        await ready(url)
        for _ in range(4):  # both workers, most likely: each writes its own metrics files
            await asyncio.to_thread(_get, url + "/api/chat", CHAT)
        await asyncio.to_thread(_get, url + "/metrics")
        await asyncio.to_thread(_get, url + "/api/usage")
        files = {str(p.relative_to(tmp_path)): (mode(p), p.is_dir()) for p in tmp_path.rglob("*")}
    kinds = {name.rsplit(".", 1)[-1] for name in files}
    assert {"sock", "lock", "slots", "pins", "db"} <= kinds, files
    assert any(name.startswith("nomyo-router/metrics-") and name.endswith(".db") for name in files), files
    for name, (m, is_dir) in files.items():
        assert m == (0o700 if is_dir else 0o600), (name, oct(m))
    assert files["nomyo-router"] == (0o700, True)


def _get(url: str, body: dict | None = None) -> bytes:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode() if body is not None else None, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()
