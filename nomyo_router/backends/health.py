"""One place decides whether an endpoint takes traffic: from requests and probes together.

States per endpoint (per process; the verdict is pushed into the state store, so every
worker and instance routes by it):

    healthy --(eject_after consecutive backend failures | unreachable)--> ejected
    ejected --(backoff over)--> trial     (half-open: the next request is the one trial; no
                                           other request is sent there until it ends)
    trial   --(a success)--> healthy      (backoff reset)
    trial   --(a failure)--> ejected      (backoff doubled, up to eject_backoff_max)
    ejected (unreachable) --(a probe answers)--> healthy
    failing --(a success)--> healthy      (the last endpoint of a model that keeps failing:
                                           still in rotation, but /health says so)

What counts against an endpoint: 5xx answers, connection errors, timeouts and hangs,
streams cut by the backend, error chunks before content, error records or objects inside a
200 answer (error_record.py). Never a client disconnect, never a client that stops reading
(its stalled connection is closed: server/protocol.py, relay/pump.py), and never a 4xx the client
caused. What does not eject:
- a probe that timed out while this process's event loop lagged (the router was slow, not
  the backend), or while the endpoint delivered traffic recently (traffic beats probes);
- anything but an unreachable backend, when it is the last healthy endpoint of one of its
  models: its requests then fail or succeed on their own, with the backend's own error,
  instead of a false "no healthy endpoint". After `eject_after` consecutive failures it is
  `failing` instead (in rotation; `/health` no longer calls it healthy), until a request
  succeeds there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import RouterConfig
from ..domain import Endpoint
from ..events import Events
from ..state import StateStore

log = logging.getLogger("nomyo_router.health")


class LagSource(Protocol):
    """What health reads of this process's event-loop lag (the probe itself runs in the
    wiring: `runtime/loop_lag.py`)."""

    lag: float  # seconds late, last tick

    def recent_max(self, since: float | None = None) -> float:
        """The worst lag of the recent window, or since `since` (a monotonic time)."""
        ...


@dataclass
class _State:
    state: str = "healthy"  # healthy | ejected | trial | failing (the last of a model, in rotation)
    since: float = 0.0  # wall-clock time of the last change
    reason: str = ""
    failures: int = 0  # consecutive
    backoff: float = 0.0
    until: float = 0.0  # monotonic end of the current ejection
    unreachable: bool = False  # ejected for a connection error: a probe may end it
    last_ok: float = 0.0  # monotonic time of the last successful request or probe
    ejections: int = 0
    trial_at: float = 0.0  # monotonic time the trial request went out


class Health:
    def __init__(
        self, endpoints: Sequence[Endpoint], store: StateStore, events: Events, config: RouterConfig, lag: LagSource
    ) -> None:
        self.endpoints = endpoints
        self.store = store
        self.events = events
        self.lag = lag
        self.eject_after = config.eject_after
        self.backoff_min = config.eject_backoff
        self.backoff_max = config.eject_backoff_max
        self.lag_limit = config.health_timeout / 4  # a probe timing out under this much lag is void
        self.traffic_window = 3 * max(config.health_interval, config.health_timeout)
        self.trial_timeout = config.first_byte_floor
        self.overload_lag = config.overload_lag_ms / 1000 if config.overload_lag_ms else None
        self._states: dict[str, _State] = {}

    def _get(self, ep: Endpoint) -> _State:
        st = self._states.get(ep.name)
        if st is None:
            st = self._states[ep.name] = _State(since=time.time())
        return st

    # ---- from requests ----------------------------------------------------------------
    def sending(self, ep: Endpoint) -> None:
        """A request is about to go to `ep`: if it is the trial, nothing else follows it there
        until its result is known."""
        st = self._states.get(ep.name)
        if st is not None and st.state == "trial" and self.store.is_healthy(ep):
            st.trial_at = time.monotonic()
            self.store.set_healthy(ep, False)

    def success(self, ep: Endpoint) -> None:
        st = self._states.get(ep.name)
        if st is None:
            st = self._get(ep)
        st.last_ok = time.monotonic()
        st.failures = 0
        if st.state != "healthy":
            self._set(ep, st, "healthy", "a request succeeded")
            st.backoff = 0.0

    def failure(self, ep: Endpoint, reason: str, unreachable: bool = False) -> None:
        """A backend-side failure of a request to `ep` (never a client disconnect)."""
        st = self._get(ep)
        st.failures += 1
        if st.state == "ejected":
            return
        if unreachable or st.state == "trial" or st.failures >= self.eject_after:
            self._eject(ep, st, reason, unreachable)

    # ---- from probes ------------------------------------------------------------------
    def probe(
        self, ep: Endpoint, ok: bool, reason: str = "", timed_out: bool = False, started: float | None = None
    ) -> None:
        st = self._get(ep)
        now = time.monotonic()
        if ok:
            st.last_ok = now
            if st.state == "ejected" and (st.unreachable or now >= st.until):
                # Unreachable: it answers again, so it is back. Failing requests: the backoff
                # is over; a trial decides (probes cannot see a model runner's 500s).
                if st.unreachable:
                    self._set(ep, st, "healthy", "answers probes again")
                    st.backoff, st.failures = 0.0, 0
                else:
                    self._set(ep, st, "trial", "backoff over; next requests decide")
            elif st.state in ("healthy", "failing") and not self.store.is_healthy(ep):
                self.store.set_healthy(ep, True)  # e.g. another worker's verdict, now stale
            return
        if timed_out and self._probe_void(st, started):
            log.info(
                "endpoint %s: probe timed out but the verdict is void (loop lag %.0f ms, last success %.1f s ago)",
                ep.name,
                self.lag.recent_max(started) * 1000,
                now - st.last_ok if st.last_ok else -1,
            )
            return
        if st.state in ("healthy", "trial", "failing"):
            self._eject(ep, st, f"probe failed: {reason}", unreachable=not timed_out)

    def _probe_void(self, st: _State, started: float | None) -> bool:
        if self.lag.recent_max(started) > self.lag_limit:
            return True  # the router was slow, not (necessarily) the backend
        return bool(st.last_ok) and time.monotonic() - st.last_ok < self.traffic_window

    def tick(self) -> None:
        """Called often (every fast probe round): ends ejections whose backoff is over for
        endpoints that cannot be probed into health (failing requests)."""
        now = time.monotonic()
        for ep in self.endpoints:
            st = self._states.get(ep.name)
            if st is None:
                continue
            if st.state == "ejected" and not st.unreachable and now >= st.until:
                self._set(ep, st, "trial", "backoff over; next requests decide")
            elif st.state == "trial" and st.trial_at and now - st.trial_at > self.trial_timeout:
                st.trial_at = 0.0  # the trial's client left without a verdict: allow another
                self.store.set_healthy(ep, True)

    # ---- decisions --------------------------------------------------------------------
    def _eject(self, ep: Endpoint, st: _State, reason: str, unreachable: bool) -> None:
        if not unreachable and self._last_for_a_model(ep):
            if st.state != "failing":
                self._set(
                    ep,
                    st,
                    "failing",
                    f"{reason} ({st.failures} consecutive; the last endpoint of a model: in rotation)",
                )
            return
        st.backoff = min(self.backoff_max, st.backoff * 2 if st.backoff else self.backoff_min)
        st.until = time.monotonic() + st.backoff
        st.unreachable = unreachable
        st.ejections += 1
        self.events.count("ejection", ep.name, "")
        self._set(
            ep,
            st,
            "ejected",
            f"{reason} ({st.failures} consecutive; back in {st.backoff:g}s at the latest)"
            if not unreachable
            else reason,
        )

    def _last_for_a_model(self, ep: Endpoint) -> bool:
        for key in ep.models:
            if not any(o is not ep and key in o.models and self.is_available(o) for o in self.endpoints):
                return True
        return False

    def _set(self, ep: Endpoint, st: _State, state: str, reason: str) -> None:
        st.state, st.reason, st.since = state, reason, time.time()
        self.store.set_healthy(ep, state != "ejected")
        level = logging.WARNING if state in ("ejected", "failing") else logging.INFO
        log.log(level, "endpoint %s: %s (%s)", ep.name, state, reason)
        self.events.endpoint_state(ep.name, state, reason)

    # ---- questions --------------------------------------------------------------------
    def is_available(self, ep: Endpoint) -> bool:
        return self.store.is_healthy(ep)

    def failing(self, name: str) -> bool:
        """The last endpoint of a model, failing request after request (still in rotation)."""
        st = self._states.get(name)
        return st is not None and st.state == "failing"

    def is_down(self, ep: Endpoint) -> bool:
        """Worth probing fast: ejected or in trial, or unhealthy by another process's verdict."""
        st = self._states.get(ep.name)
        return (st is not None and st.state not in ("healthy", "failing")) or not self.store.is_healthy(ep)

    def overloaded(self) -> bool:
        """This process's loop lags beyond `overload_lag_ms`: new work is turned away."""
        return self.overload_lag is not None and self.lag.lag > self.overload_lag

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for ep in self.endpoints:
            st = self._get(ep)
            out[ep.name] = {
                "state": st.state,
                "since": round(st.since, 3),
                "reason": st.reason,
                "consecutive_failures": st.failures,
                "ejections": st.ejections,
            }
        return out
