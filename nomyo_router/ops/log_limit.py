"""Log lines rate-limited per cause: one line when a cause first fails, then at most one a
minute while it goes on, saying how many were held back; one line when it works again.

A failure that repeats with every write (a full disk under the response cache, Redis down
under the usage store's flush each second, in every worker) used to log every time: hundreds
of lines a minute that bury what else happened. With this, an outage of any length costs a
line at its start, one a minute while it lasts (with the count of what was not logged) and
one at its end.

A cause is a short key the caller chooses from a fixed set (an operation, a store), never
from a request or an error's text, so the table stays small; it is bounded anyway
(`MAX_CAUSES`, the oldest forgotten first).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

EVERY_S = 60.0  # at most one line per cause in this long
MAX_CAUSES = 256


class LimitedLog:
    """Rate-limited lines on `logger`, per cause (see the module docstring)."""

    def __init__(
        self, logger: logging.Logger, every: float = EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.every = every
        self.clock = clock
        # cause: [when its last line was logged, lines held back since, failures since the first line]
        self._causes: OrderedDict[str, list[float]] = OrderedDict()

    def failed(self, cause: str, level: int, msg: str, *args: Any) -> bool:
        """Log `msg % args` for `cause` unless one was logged less than `every` ago (then count
        it). A line after held-back ones ends with their count. True: it was logged."""
        now = self.clock()
        state = self._causes.get(cause)
        if state is None:
            self._causes[cause] = [now, 0, 1]
            while len(self._causes) > MAX_CAUSES:
                self._causes.popitem(last=False)
            self.logger.log(level, msg, *args)
            return True
        state[2] += 1
        if now - state[0] < self.every:
            state[1] += 1
            return False
        held, since = int(state[1]), now - state[0]
        state[0], state[1] = now, 0
        if held:
            self.logger.log(level, msg + " (and %d more times in the last %.0f s, not logged)", *args, held, since)
        else:
            self.logger.log(level, msg, *args)
        return True

    def recovered(self, cause: str, level: int, msg: str, *args: Any) -> bool:
        """`cause` works again: log `msg % args` with how many times it failed, if it had
        failed (else nothing). True: it was logged."""
        state = self._causes.pop(cause, None)
        if state is None:
            return False
        self.logger.log(level, msg + " (after %d failures)", *args, int(state[2]))
        return True

    def failing(self, cause: str) -> bool:
        return cause in self._causes
