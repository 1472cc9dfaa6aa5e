"""The runner: batches' lines on the slots interactive requests leave idle.

One runner at a time over every worker and instance that shares the batch store (a lease in
the store, renewed every third of `claim_timeout`; another process takes over when it lapses,
and a restarted router after that). It is the one holding batch lines, so its own counts are
the batch's share of each endpoint.

A line starts only when nobody waits for a slot (the state store's queue is empty), on an
endpoint with a free slot where batch lines hold fewer than `max_share` of its slots (at least
one) and fewer than the slots interactive requests left unused at their busiest within the
last `interactive_window` seconds (`demand.py`). The check and the slot's taking happen with
no pause between them (`_slot_for` just before `forward`), so in one process, or with the
workers' shared table, a line never waits in the queue: an interactive request arriving later
finds the line's slot the next one freed.
A line runs through the proxy's `forward` like an interactive request, with an `Exchange`
whose answer is kept (`Capture`) instead of written to a socket: the same parsing, routing,
retries, translation, usage events (the record's `batch`) and token budgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any

from ..api.errors import ApiError
from ..api.requests import parse
from ..config import BatchConfig
from ..domain import Endpoint, model_key
from ..events import Events, RequestRecord
from ..ops.log_limit import LimitedLog
from ..relay.exchange import Exchange, Handle
from ..state import StateStore
from ..state.queue_order import BATCH
from . import objects
from .base import BatchStore, Line
from .demand import Demand
from .intake import error_line

log = logging.getLogger("nomyo_router.batch")

MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a line's answer kept at most (a larger one is the line's error)
TRIES = 3  # a line that meets a busy or failing backend (502, 503, 504) this often fails
_AGAIN = frozenset((0, 502, 503, 504))
IDLE_POLL_S = 1.0  # between rounds while no batch runs (one made here wakes the runner at once)
MAX_PAUSE_S = 5.0  # the longest pause between rounds while the store fails
COUNTS_EVERY_S = 30.0  # /metrics' line counts are read again this often, and when a line ended here
ANY = "any"  # no endpoint serves the model: run it anyway, for the proxy's own answer (404)


class Capture:
    """An answer's `send`, kept in memory (bounded by MAX_ANSWER_BYTES)."""

    __slots__ = ("status", "parts", "size")

    def __init__(self) -> None:
        self.status = 0
        self.parts: list[bytes] = []
        self.size = 0

    async def send(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            self.status = msg["status"]
        elif msg["type"] == "http.response.body":
            data: bytes = msg.get("body", b"")
            self.size += len(data)
            if self.size <= MAX_ANSWER_BYTES and data:
                self.parts.append(data)


class Runner:
    def __init__(
        self,
        store: BatchStore,
        forward: Handle,
        state: StateStore,
        endpoints: Callable[[], list[Endpoint]],
        events: Events,
        settings: BatchConfig,
        may_use: Callable[[str, str], bool],
        budget_spent: Callable[[str], Awaitable[bool]],
    ) -> None:
        """`may_use(owner, model_key)`: the
        owner's key may use the model; `budget_spent(owner)`: its tokens_per_day is spent."""
        self.store, self.forward, self.state = store, forward, state
        self.endpoints, self.events, self.settings = endpoints, events, settings
        self.may_use, self.budget_spent = may_use, budget_spent
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.leading = False
        self.held: Counter[str] = Counter()  # batch lines holding a slot, per endpoint
        self.starting: Counter[str] = Counter()  # lines started for an endpoint, not yet at its slot
        self.running: Counter[str] = Counter()  # per model, for /metrics
        self.in_flight: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.tries: Counter[tuple[str, int]] = Counter()
        self.pending: deque[Line] = deque()
        self.batches: dict[str, dict[str, Any]] = {}  # the active batches as last read
        self._models: dict[str, list[str]] = {}  # each active batch's models
        self.blocked: set[str] = set()  # models whose lines found no idle slot in the last round
        self._wake = asyncio.Event()
        self._log = LimitedLog(log)
        self.demand = Demand(settings.interactive_window)
        self._by_name: dict[str, Endpoint] = {}
        self._task: asyncio.Task[None] | None = None
        self._lease_at = 0.0
        self._swept_at = 0.0
        self.counts: list[tuple[str, str, int]] = []  # (model, state, lines) in the store, for /metrics
        self._counted_at = 0.0
        self._changed = False  # a line ended since the counts were read

    def start(self) -> None:
        self.events.on_request_done(self._poke)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        self.events.off_request_done(self._poke)
        tasks = [t for t in (self._task, *self.in_flight.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.leading:  # (another process may take over at once; if the store is away, when the lease lapses)
            with contextlib.suppress(*self.store.errors):
                await self.store.resign(self.holder)

    def _poke(self, rec: RequestRecord) -> None:
        """A request ended: a slot may be free, and an interactive one says how many slots
        interactive requests held just before (its own counted back). On the hot path: cheap."""
        if self.pending:
            self._wake.set()
        name = rec.endpoint  # (sampled whether or not lines wait: a batch made later knows the traffic)
        if rec.batch is None and name is not None:
            ep = self._by_name.get(name)
            if ep is not None:
                self.demand.saw(name, self.state.in_flight(ep) + 1 - self.held[name])

    def poke(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        pause = self.settings.poll_interval
        while True:
            try:
                busy = await self._tick()
                if self._log.failing("round"):
                    self._log.recovered("round", logging.WARNING, "batch runner: the batch store answers again")
                pause = self.settings.poll_interval if busy else max(self.settings.poll_interval, IDLE_POLL_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the store away (Redis down, a locked file): fewer tries, fewer lines
                self._log.failed("round", logging.WARNING, "batch runner: a round failed (%s: %s)", type(e).__name__, e)
                pause = min(pause * 2, MAX_PAUSE_S)
            self._wake.clear()
            try:
                async with asyncio.timeout(pause):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _tick(self) -> bool:
        """One round; whether any batch is running (else the next comes after IDLE_POLL_S)."""
        now = time.time()
        if now - self._counted_at >= COUNTS_EVERY_S or self._changed:
            self._changed = False
            self._counted_at = now
            self.counts = await self.store.line_counts()
        if now - self._lease_at >= self.settings.claim_timeout / 3 or not self.leading:
            self.leading = await self.store.lead(self.holder, self.settings.claim_timeout)
            self._lease_at = now
        if not self.leading:
            self.pending.clear()
            return False
        if now - self._swept_at > 60:
            self._swept_at = now
            await self.store.sweep(now, self.settings.retention)
        self._by_name = {e.name: e for e in self.endpoints()}
        self.batches = {b["id"]: b for b in await self.store.active()}
        for b in list(self.batches.values()):
            await self._settle(b, now)
        live = [
            bid
            for bid, b in sorted(self.batches.items(), key=lambda kv: kv[1]["created_at"])
            if b["status"] == "in_progress"
        ]
        self.pending = deque(line for line in self.pending if line[0] in live)
        want = max(4, sum(e.slots for e in self.endpoints()))
        # more lines, of models that had an idle slot: lines waiting for a busy model never keep
        # another model's lines out (the pending lines stay under `want` per model)
        room = want - sum(1 for line in self.pending if line[3] not in self.blocked)
        if live and room > 0:
            have = {(line[0], line[1]) for line in self.pending} | set(self.in_flight)
            for bid in live:
                if bid not in self._models:
                    self._models[bid] = await self.store.models(bid)
                for model in self._models[bid]:
                    if room > 0 and model not in self.blocked:
                        got = await self.store.queued(bid, model, have, room)
                        self.pending.extend(got)
                        room -= len(got)
        await self._start_lines()
        return bool(self.batches)

    async def _start_lines(self) -> None:
        spent: dict[str, bool] = {}
        full: set[str] = set()  # model keys with no idle slot in this round
        self.blocked = set()
        kept: deque[Line] = deque()
        while self.pending:
            line = self.pending.popleft()
            bid, idx, _cid, model, _req = line
            batch = self.batches.get(bid)
            if batch is None or batch["status"] != "in_progress" or (bid, idx) in self.in_flight:
                continue
            owner = batch.get("_owner", "")
            if owner not in spent:
                spent[owner] = bool(owner) and await self.budget_spent(owner)
            key = model_key(model) if model else ""
            slot = None if spent[owner] or key in full else self._slot_for(key)
            if slot is None:
                full.add(key)
                self.blocked.add(model)
                kept.append(line)
                continue
            meant = slot.name if isinstance(slot, Endpoint) else None
            if meant is not None:  # (counted until the line's task looks again: `_answer`)
                self.starting[meant] += 1
            self.in_flight[(bid, idx)] = asyncio.get_running_loop().create_task(self._run(line, owner, meant))
        self.pending = kept

    def _slot_for(self, key: str) -> Endpoint | str | None:
        """An endpoint where a batch line may take a slot now, ANY when no endpoint serves the
        model (the proxy answers it), None when it must wait."""
        state = self.state
        if state.queue_length() + state.held_aside > 0:  # someone waits: every slot is theirs
            return None
        demand = self.demand
        best: Endpoint | None = None
        free_best = 0
        serving = False
        share = self.settings.max_share
        for ep in self.endpoints():
            if not key or not ep.serves(key):
                continue
            serving = True
            held, starting = self.held[ep.name], self.starting[ep.name]
            busy = state.in_flight(ep)
            demand.saw(ep.name, busy - held)
            room = min(max(1, int(ep.slots * share)), ep.slots - demand.peak(ep.name))
            if not state.is_healthy(ep) or held + starting >= room:
                continue
            free = ep.slots - busy - starting
            if free > free_best:
                best, free_best = ep, free
        return best if serving else ANY

    async def _run(self, line: Line, owner: str, meant: str | None) -> None:
        bid, idx, cid, model, request = line
        try:
            try:
                outcome = await self._answer(line, owner, meant)
            except Exception:  # a bug: this line fails, never the runner or another batch
                log.exception("batch %s: line %s failed in the router", bid, idx)
                outcome = False, json.dumps(error_line(cid, 500, "internal_error", "the router failed on this line"))
            if outcome is None:  # not run (no idle slot after all) or to be tried again
                self.pending.append(line)
                return
            ok, result = outcome
            await self.store.finish_line(bid, idx, ok, result)
            self._changed = True
            self.tries.pop((bid, idx), None)
        finally:
            self.in_flight.pop((bid, idx), None)
            self._wake.set()

    async def _answer(self, line: Line, owner: str, meant: str | None) -> tuple[bool, str] | None:
        bid, idx, cid, model, request = line
        if meant is not None:
            self.starting[meant] -= 1
            if not self.starting[meant]:
                del self.starting[meant]
        spec = json.loads(request)
        t0 = time.perf_counter()
        try:
            req = parse(spec["url"], json.dumps(spec["body"]).encode(), t0)
            if owner and not self.may_use(owner, req.key):
                raise ApiError(403, f"this API key may not use model '{req.model}'", code="model_not_allowed")
        except ApiError as e:
            return False, json.dumps(error_line(cid, e.status, e.code or "invalid_request", e.message))
        slot = self._slot_for(req.key)  # (checked again: the slot is taken with no pause after this)
        if slot is None:
            return None
        endpoint = slot if isinstance(slot, Endpoint) else None
        if endpoint is not None:
            req.pinned = (endpoint.name,)
            self.held[endpoint.name] += 1
        req.client = owner or None
        rid = "batch_req_" + secrets.token_hex(12)
        rec = RequestRecord(rid, req.api, req.path, req.model, False, req.client)
        rec.batch = bid
        req.client = BATCH[0]  # (the record keeps its key's name; in the queue, should it wait, it goes last)
        cap = Capture()
        ex = Exchange(cap.send, rec, t0, self.events)
        self.running[model] += 1
        try:
            await ex.run(self.forward(req, ex))  # (the exchange's one completion point)
        finally:
            self.running[model] -= 1
            if not self.running[model]:
                del self.running[model]
            if endpoint is not None:
                self.held[endpoint.name] -= 1
        status = cap.status
        if status in _AGAIN:
            self.tries[(bid, idx)] += 1
            if self.tries[(bid, idx)] < TRIES:
                return None
        if cap.size > MAX_ANSWER_BYTES:
            msg = f"the answer exceeds {MAX_ANSWER_BYTES} bytes"
            return False, json.dumps(error_line(cid, 502, "answer_too_large", msg, rid))
        return objects.result_line(cid, rid, status, b"".join(cap.parts))

    async def _settle(self, batch: dict[str, Any], now: float) -> None:
        """Move a batch on: expired, cancelled or completed once nothing of it runs."""
        bid = batch["id"]
        busy = any(k[0] == bid for k in self.in_flight)
        status = batch["status"]
        late = status == "in_progress" and now >= batch["expires_at"]
        if late:
            msg = "the batch expired before this request ran"
            await self.store.fail_queued(bid, lambda cid: json.dumps(error_line(cid, 408, "batch_expired", msg)))
        if busy or (status == "in_progress" and not late and any(line[0] == bid for line in self.pending)):
            return  # (lines of it wait for a slot: not done)
        counts = await self.store.counts(bid)
        if status == "cancelling":
            final = "cancelled"
        elif late:
            final = "expired"
        elif counts.get("queued", 0) == 0:
            final = "completed"
        else:
            return
        await self.finalize(batch, counts, final, now)

    async def finalize(self, batch: dict[str, Any], counts: dict[str, int], final: str, now: float) -> None:
        owner = batch.pop("_owner", "")
        bid = batch["id"]
        files = []
        for state, purpose, key in (("done", "output", "output_file_id"), ("failed", "error", "error_file_id")):
            content = await self.store.results(bid, state)
            if content:
                f = objects.file_object(
                    f"batch_{bid}_{purpose}.jsonl", "batch_output", len(content), now, self.settings.retention
                )
                files.append((f, content))
                batch[key] = f["id"]
        batch["status"] = final
        batch[f"{final}_at"] = int(now)
        batch["finalizing_at"] = batch.get("finalizing_at") or int(now)
        batch["request_counts"] = objects.request_counts(counts)
        if await self.store.finalize(batch, files, owner):
            log.info("batch %s %s: %s", bid, final, batch["request_counts"])
        self.counts = await self.store.line_counts()
        self.batches.pop(bid, None)
        self._models.pop(bid, None)
        for line_id in [k for k in self.tries if k[0] == bid]:
            del self.tries[line_id]
