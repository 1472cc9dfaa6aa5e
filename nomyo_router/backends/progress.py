"""Several Ollama progress streams (pull, push, create) merged into one NDJSON stream.

What the `ollama` CLI and Python client read from `/api/pull`, `/api/push`, `/api/create`:
lines `{"status": ...}`, progress lines `{"status", "digest", "total", "completed"}` (the CLI
draws one bar per digest, sized by the first `total` it sees), `{"error": ...}` (the client
raises it), and a last `{"status": "success"}`.

Merged for N endpoints:
- a status line of one endpoint is relayed as `"<endpoint>: <status>"` (so the CLI's spinner
  says which box is doing what, and no endpoint's own `success` ends a client's loop early);
- a progress line of one layer becomes ONE combined line for that digest: `total` = the
  layer's size x the number of endpoints (a digest names one content, so one size: the
  total is right from the first line and the bar never has to grow), `completed` = the sum
  of what each endpoint has done;
- the end: `{"status": "success"}` only when every endpoint succeeded; otherwise
  `{"error": "<op> failed on b (why); succeeded on a"}`.
"""

from __future__ import annotations

import json
from typing import Any


class ProgressMerge:
    def __init__(self, op: str, names: list[str]) -> None:
        self.op = op
        self.names = names
        self.sizes: dict[str, int] = {}  # digest -> its size (one endpoint's total)
        self.done: dict[str, dict[str, int]] = {}  # digest -> endpoint -> completed
        self.failures: dict[str, str] = {}
        self.succeeded: list[str] = []

    def line(self, name: str, obj: dict[str, Any]) -> bytes:
        """The merged line(s) for one line an endpoint sent (b"" for nothing)."""
        digest, total = obj.get("digest"), obj.get("total")
        status = str(obj.get("status", ""))
        if isinstance(digest, str) and digest and isinstance(total, int) and total > 0:
            completed = obj.get("completed")
            completed = completed if isinstance(completed, int) and completed >= 0 else 0
            size = self.sizes.setdefault(digest, total)
            self.done.setdefault(digest, {})[name] = min(completed, size)
            merged = {
                "status": status,
                "digest": digest,
                "total": size * len(self.names),
                "completed": sum(self.done[digest].values()),
            }
            return _dump(merged)
        if status == "success":
            self.succeeded.append(name)
        return _dump({"status": f"{name}: {status}"}) if status else b""

    def failed(self, name: str, why: str) -> bytes:
        self.failures[name] = why
        return _dump({"status": f"{name}: failed: {why}"})

    def final(self) -> dict[str, Any]:
        return final(self.op, self.names, self.failures)


def final(op: str, names: list[str], failures: dict[str, str]) -> dict[str, Any]:
    if not failures:
        return {"status": "success"}
    return {"error": describe(op, names, failures)}


def describe(op: str, names: list[str], failures: dict[str, str]) -> str:
    failed = "; ".join(f"{n} ({failures[n]})" for n in names if n in failures)
    ok = [n for n in names if n not in failures]
    return f"{op} failed on {failed}" + (f"; succeeded on {', '.join(ok)}" if ok else "")


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"
