"""Whether a process of this host still lives: the workers' shared tables free what a dead
worker held, and the model lists' exchange drops a dead peer's claim."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie (killed, not yet reaped by uvicorn's master) is gone too."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
