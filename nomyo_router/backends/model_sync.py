"""One model list per router, whatever the worker count (and across Redis-shared instances).

Every worker process keeps its own copy of each endpoint's model list (`Endpoint.tags`,
`.models`, `.ps`, …): listings, `/api/show` and routing read it with no I/O. A model
pulled, created, copied, pushed or deleted through one worker used to be known to that
worker only, until the others' next periodic poll. Now:

- The worker that made the change re-reads the concerned endpoints (as before), then
  publishes the new lists through the state store's publish/subscribe (`StateStore.publish`:
  relayed by the shared-state host under `--workers N`, a Redis channel with `state:
  redis://`, nothing with one process), and answers the client only when every other live
  worker has acknowledged that it applied them (or after `ACK_TIMEOUT_S`, logged).
  A worker applies a list and only then acknowledges it, so once the management call has
  answered, any worker answers from the new list: exact, not "soon".
- Publish/subscribe may lose a message: a worker's subscription is not in place yet when it
  is already known (Redis confirms a subscription in the background) or is being replaced
  after an outage, or its store drops what it publishes while Redis is away. So the lists
  are sent again (`RESEND_S`, then twice as long each time) to the workers that have not
  acknowledged yet, marked for them only; a worker that already holds them only acknowledges
  again. A lost message costs a resend, not the whole `ACK_TIMEOUT_S`.
- A periodic refresh is done by one worker (the lowest peer id) and shared the same way
  (without waiting for acknowledgements); the others apply it instead of polling every
  backend themselves, and poll only if none arrives for 1.5 intervals (that worker died).

Why acknowledgements rather than a shared generation counter checked per request: the
check would sit on every request's path, and under Redis it is a network round trip per
generation; the acknowledged version costs nothing per request — the management call,
rare and slow anyway, waits one message round (~1 ms between workers of one host) instead.

Ordering: each list carries the wall-clock time its fetch started. A list read before the
change completed is older than the one read after it, so a worker never replaces a newer
list with an older one, whatever order messages and its own polls finish in (across hosts
this relies on their clocks agreeing to well within the time between two changes).

Peers: each worker says `hello` when it starts (the others answer `here`) and `bye` when it
stops; any message from a peer also makes it known. A peer that does not acknowledge in
time is not waited for again until it is heard from again; on one host a dead process
(`kill -9`) is noticed at once by its pid, not by the timeout.

Size: the shared-state host reads one line per message with a 64 KiB limit, so lists are
compressed, and an endpoint whose lists would not fit in `INLINE_MAX` is sent as a notice
only ("endpoint X changed at T"): the receivers re-read that endpoint themselves (before
acknowledging, when asked to).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import os
import socket
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..domain import Endpoint, model_key
from ..state import StateStore
from ..state.processes import alive

log = logging.getLogger("nomyo_router.model_sync")

TOPIC = "models"
ACK_TIMEOUT_S = 5.0  # a live worker answers in milliseconds; this bounds a stuck or vanished one
RESEND_S = 0.25  # no answer by then: the lists again to the silent ones (then at 0.75, 1.75, 3.75 s)
INLINE_MAX = 24_000  # encoded bytes of lists per message (well under the host's 64 KiB line)
_HOST = socket.gethostname()

Snapshot = dict[str, Any]  # what one fetch of one endpoint found (see `apply`)


def apply(ep: Endpoint, snap: Snapshot) -> None:
    """Put one endpoint's fetched lists into it (the caller reindexes the scheduler)."""
    ep.type = snap["type"]
    if snap.get("version"):
        ep.version = snap["version"]
    if ep.type == "ollama":
        ep.tags = snap["tags"]
        ep.ps = snap["ps"]
        if ep.static_models is None:
            ep.set_models([str(m.get("model") or m.get("name")) for m in ep.tags if m.get("model") or m.get("name")])
        ep.loaded = frozenset(model_key(m.get("model") or m.get("name", "")) for m in ep.ps)
    else:
        if ep.static_models is None and snap.get("openai") is not None:
            ep.openai_models = snap["openai"]
            ep.set_models([m["id"] for m in ep.openai_models])
        ep.loaded = frozenset(ep.models)  # an OpenAI-style server keeps its models loaded


def _encode(snap: Snapshot) -> str:
    return base64.b64encode(zlib.compress(json.dumps(snap, separators=(",", ":")).encode(), 6)).decode("ascii")


def _decode(text: str) -> Snapshot:
    snap = json.loads(zlib.decompress(base64.b64decode(text)))
    if not isinstance(snap, dict):
        raise ValueError("a model-list snapshot must be an object")
    return snap


def _live(peer: str) -> bool:
    """On this host a peer's pid tells at once whether it is gone; elsewhere, assume it lives."""
    parts = peer.rsplit(":", 2)  # host:pid:nonce
    if len(parts) != 3 or parts[0] != _HOST or not parts[1].isdigit():
        return True
    return alive(int(parts[1]))


class ModelSync:
    """This process's side of the exchange. `endpoints()`: the endpoints now configured;
    `reindex()`: rebuild the routing index; `refetch(ep)`: read one endpoint from its backend
    (applying and returning what it found, or None)."""

    def __init__(
        self,
        store: StateStore,
        endpoints: Callable[[], Sequence[Endpoint]],
        reindex: Callable[[], None],
        refetch: Callable[[Endpoint], Awaitable[Snapshot | None]],
    ) -> None:
        self.store = store
        self.endpoints = endpoints
        self.reindex = reindex
        self.refetch = refetch
        self.me = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.peers: set[str] = set()
        self.last_full = time.monotonic()  # the last refresh of every endpoint, ours or a peer's
        self._at: dict[str, float] = {}  # endpoint name -> fetch time of the list it holds
        self._seq = itertools.count(1)
        self._pending: dict[int, tuple[set[str], asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._refetching: set[tuple[str, object]] = set()  # (sender, seq) of lists being re-read

    # ---- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self.store.subscribe(TOPIC, self._received)
        self._say({"k": "hello"})
        # Said again a moment later: a store whose subscription starts in the background
        # (Redis) may have missed the first answers.
        self._spawn(self._hello_again())

    async def _hello_again(self) -> None:
        await asyncio.sleep(1.0)
        self._say({"k": "hello"})

    def stop(self) -> None:
        self._say({"k": "bye"})
        for t in self._tasks:
            t.cancel()

    # ---- what this process fetched ------------------------------------------------------
    def take(self, ep: Endpoint, snap: Snapshot) -> bool:
        """Apply `snap` unless this process already holds a list fetched later."""
        if snap["at"] < self._at.get(ep.name, 0.0):
            return False
        self._at[ep.name] = snap["at"]
        apply(ep, snap)
        return True

    async def share(self, snaps: dict[Endpoint, Snapshot], wait: bool, full: bool) -> None:
        """Tell the other processes; with `wait`, return when they all applied it."""
        if not snaps:
            return
        lists: dict[str, Any] = {}
        room = INLINE_MAX
        for ep, snap in snaps.items():
            text = _encode(snap)
            if len(text) <= room:
                room -= len(text)
                lists[ep.name] = [ep.url, snap["at"], text]
            else:  # too big to carry: the receivers read it themselves
                lists[ep.name] = [ep.url, snap["at"], None]
        seq = next(self._seq)
        expected = {p for p in self.peers if _live(p)}
        self.peers = set(expected)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if wait and expected:
            self._pending[seq] = (expected, fut)
        msg: dict[str, Any] = {"k": "lists", "seq": seq, "ack": wait, "full": full, "eps": lists}
        self._say(msg)
        if wait and expected:
            await self._acknowledged(seq, expected, fut, msg)

    async def _acknowledged(self, seq: int, expected: set[str], fut: asyncio.Future[None], msg: dict[str, Any]) -> None:
        start = time.monotonic()
        deadline = start + ACK_TIMEOUT_S
        gap = RESEND_S  # twice as long after each resend
        resend = start + gap
        try:
            while not fut.done() and (left := deadline - time.monotonic()) > 0:
                await asyncio.wait({fut}, timeout=min(0.1, left, max(resend - time.monotonic(), 0.0)))
                if not fut.done() and time.monotonic() >= resend and expected:
                    # The lists or an acknowledgement was lost (a subscription not yet or no
                    # longer in place, a publish dropped while the store was away): the same
                    # message again, for those who have not answered only.
                    self._say({**msg, "only": sorted(expected)})
                    gap *= 2
                    resend = time.monotonic() + gap
                for p in [p for p in expected if not _live(p)]:  # killed meanwhile: not waited for
                    expected.discard(p)
                    self.peers.discard(p)
                if not expected and not fut.done():
                    fut.set_result(None)
        finally:
            self._pending.pop(seq, None)
        if not fut.done():
            log.warning(
                "%d worker(s) did not confirm new model lists within %.0f s (%s); not waited "
                "for until heard from again",
                len(expected),
                ACK_TIMEOUT_S,
                ", ".join(sorted(expected)),
            )
            self.peers -= expected

    # ---- periodic refresh ---------------------------------------------------------------
    def next_refresh(self, interval: float) -> float:
        """When (monotonic) this process should poll every endpoint: after `interval` for the
        lowest peer id, later for the others (each a bit later than the one before), so one
        process polls and the others take over only when it has gone quiet."""
        ranked = sorted({self.me, *(p for p in self.peers if _live(p))})
        rank = ranked.index(self.me)
        return self.last_full + interval * (1.0 if rank == 0 else 1.5 + 0.5 * rank / len(ranked))

    # ---- messages -------------------------------------------------------------------------
    def _say(self, msg: dict[str, Any]) -> None:
        msg["from"] = self.me
        self.store.publish(TOPIC, msg)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _received(self, data: Any) -> None:
        """Called by the store in its reader: must never raise (it would end the reader)."""
        try:
            sender = data.get("from") if isinstance(data, dict) else None
            if not isinstance(sender, str) or sender == self.me:
                return
            kind = data.get("k")
            if kind == "bye":
                self.peers.discard(sender)
                for expected, fut in self._pending.values():
                    expected.discard(sender)
                    if not expected and not fut.done():
                        fut.set_result(None)
                return
            if kind == "lists":
                only = data.get("only")
                if isinstance(only, list) and self.me not in only:
                    return  # sent again for others (this process has acknowledged it)
                self._lists(sender, data)  # (a malformed one raises: its sender is not a peer)
            elif kind not in ("hello", "here", "ack"):
                return
            self.peers.add(sender)
            if kind == "hello":
                self._say({"k": "here"})
            elif kind == "ack" and data.get("to") == self.me:
                pending = self._pending.get(data.get("seq"))
                if pending is not None:
                    pending[0].discard(sender)
                    if not pending[0] and not pending[1].done():
                        pending[1].set_result(None)
        except Exception:  # a malformed message is dropped, never the store's reader
            log.exception("model-list message dropped")

    def _lists(self, sender: str, data: dict[str, Any]) -> None:
        by_name = {ep.name: ep for ep in self.endpoints()}
        refetch: list[Endpoint] = []
        changed = False
        for name, (url, at, text) in data["eps"].items():
            ep = by_name.get(name)
            if ep is None or ep.url != url or at <= self._at.get(name, 0.0):
                continue  # unknown here (config differs), older than what we hold, or held (sent again)
            if text is None:
                refetch.append(ep)
                continue
            snap = _decode(text)
            snap["at"] = at
            changed |= self.take(ep, snap)
        if changed:
            self.reindex()
        if data.get("full"):
            self.last_full = time.monotonic()
        ack = {"k": "ack", "to": sender, "seq": data.get("seq")} if data.get("ack") else None
        if refetch:
            key = (sender, data.get("seq"))
            if key in self._refetching:
                return  # sent again while still re-reading: the acknowledgement comes when done
            self._refetching.add(key)
            self._spawn(self._refetch_then(refetch, ack, key))
        elif ack is not None:
            self._say(ack)

    async def _refetch_then(self, eps: list[Endpoint], ack: dict[str, Any] | None, key: tuple[str, object]) -> None:
        try:
            await asyncio.gather(*(self.refetch(ep) for ep in eps))
        finally:
            self._refetching.discard(key)
            if ack is not None:
                self._say(ack)
