"""How many slots interactive requests held at once lately, per endpoint: the headroom batch
lines leave them.

A batch line that takes the slot an interactive request would have had makes that request
wait for the next one freed, up to a whole line's time. Leaving free as many slots as the
interactive traffic held at once within the last `window` seconds keeps that from happening
while the traffic is as it was; when it stops, the peak ages out and batch lines take the
slots again. Sampled when any request ends (its slot counted back in) and at every round of
the runner: a few dictionary operations.
"""

from __future__ import annotations

import time
from collections import deque


class Demand:
    def __init__(self, window: float) -> None:
        self.window = window
        self._peaks: dict[str, deque[tuple[int, int]]] = {}  # endpoint -> (second, most held then)

    def saw(self, endpoint: str, held: int, now: float | None = None) -> None:
        """`held`: slots interactive requests held at `endpoint` at this moment."""
        second = int(now if now is not None else time.monotonic())
        peaks = self._peaks.get(endpoint)
        if peaks is None:
            peaks = self._peaks[endpoint] = deque()
        if peaks and peaks[-1][0] == second:
            if held > peaks[-1][1]:
                peaks[-1] = (second, held)
        else:
            peaks.append((second, held))
        while peaks and peaks[0][0] <= second - self.window:
            peaks.popleft()

    def peak(self, endpoint: str, now: float | None = None) -> int:
        """The most slots interactive requests held at once within the window."""
        peaks = self._peaks.get(endpoint)
        if not peaks:
            return 0
        oldest = int(now if now is not None else time.monotonic()) - self.window
        return max((n for s, n in peaks if s > oldest), default=0)
