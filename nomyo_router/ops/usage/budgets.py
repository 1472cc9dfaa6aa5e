"""What the token budgets had spent before this process: read from the usage database.

`tpm` and `tokens_per_day` are counted in memory (state/key_limits.py), by the one process that
counts for every worker. When that count starts — the router starts, or a new shared-state
host takes over from one that died — it reads what the usage database holds: each client
key's tokens of today (UTC), and the spends of its last minute (the `recent` table, by
second). A restart therefore forgets nothing the workers had written: a normal stop writes
everything; a worker killed with SIGKILL loses at most its last second (store.py's FLUSH_S).

With `state: redis://…` the budgets live in Redis itself and nothing is read here; with
`usage_db: null` there is nothing to read, and the budgets start at zero.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from ...state.key_limits import DAY_S, WINDOW_S, BudgetSource, Seed
from .store import today

if TYPE_CHECKING:
    from ...config import RouterConfig


def read_spent(path: str) -> Seed:
    """Today's tokens per client key, and the last minute's spends, from the database at
    `path` (created if it is not there yet)."""
    from .store import open_usage_db  # (SQLite only when it is used)

    now = time.time()
    db = open_usage_db(path)
    try:
        day = {
            str(client): int(n)
            for client, n in db.execute(
                "SELECT client, SUM(prompt_tokens + completion_tokens) FROM usage WHERE day = ? AND client != '' "
                "GROUP BY client",
                (today(),),
            )
        }
        recent = [
            (str(client), float(t), int(n))
            for client, t, n in db.execute(
                "SELECT client, t, SUM(tokens) FROM recent WHERE t > ? GROUP BY client, t", (now - WINDOW_S,)
            )
        ]
    finally:
        db.close()
    return Seed(int(now // DAY_S), day, recent)


def budget_source(config: RouterConfig) -> BudgetSource | None:
    """Where the in-memory budgets read what was spent before them: the usage database, when
    the router keeps one and its budgets are not in Redis."""
    if config.state.startswith(("redis://", "rediss://", "unix://")) or not config.usage_db:
        return None
    return functools.partial(read_spent, config.usage_db)
