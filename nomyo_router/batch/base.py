"""What keeps the Batch API's files, batches and lines: one interface, two stores —
`sqlite_store.py` (one file, `batch.path`, shared by `--workers N`) and `redis_store.py`
(`state: redis://`: every instance serves and may run any batch).

A batch's lines are kept one by one, each `queued` until its one result is written together
with its new state (`done` or `failed`) by `finish_line`, which only a queued line passes: a
line run twice (its runner died, another took over) keeps the first result, and a line in
flight when the process died is still queued, so it runs again and nothing of its earlier
attempt was kept. The output and error files are made from the results, in the input's
order, when the batch ends (`finalize`, once: only while the batch is still active).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any

ACTIVE = ("in_progress", "cancelling", "finalizing")
Line = tuple[str, int, str, str, str]  # (batch_id, idx, custom_id, model, request JSON)
# a line as read from the input file: (idx, custom_id, model, request JSON, the result of a
# line refused before it runs, else None)
NewLine = tuple[int, str, str, str, str | None]


class BatchStore(ABC):
    # what the store raises when it cannot answer (the routes say 503, the runner tries later)
    errors: tuple[type[Exception], ...] = (OSError,)

    @abstractmethod
    async def open(self) -> None:
        """Open or connect (at start)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def put_file(self, obj: dict[str, Any], owner: str, content: bytes) -> None: ...

    @abstractmethod
    async def get_file(self, file_id: str) -> tuple[dict[str, Any], str] | None:
        """(the file object, its owner), None when there is none."""

    @abstractmethod
    async def content(self, file_id: str) -> bytes | None:
        """The file's bytes."""

    @abstractmethod
    async def list_files(
        self, owner: str | None, purpose: str | None, after: str | None, limit: int, desc: bool
    ) -> list[Any]:
        """Files of `owner` (None: all), newest first unless `desc` is False, after the file `after`."""

    @abstractmethod
    async def create_batch(self, obj: dict[str, Any], owner: str, lines: Iterable[NewLine]) -> None:
        """The batch and its lines, at once."""

    @abstractmethod
    async def save_batch(self, obj: dict[str, Any], only_if: Sequence[str] = ()) -> bool:
        """Write the batch's new object; `only_if`: only when its status is one of these."""

    @abstractmethod
    async def delete_file(self, file_id: str) -> None: ...

    @abstractmethod
    async def get_batch(self, batch_id: str) -> tuple[dict[str, Any], str] | None:
        """(the batch object, its owner)."""

    @abstractmethod
    async def list_batches(self, owner: str | None, after: str | None, limit: int) -> list[dict[str, Any]]:
        """Batches of `owner` (None: all), newest first, after the batch `after`."""

    @abstractmethod
    async def active(self) -> list[dict[str, Any]]:
        """The batches still running, each with its owner under `_owner`."""

    @abstractmethod
    async def counts(self, batch_id: str) -> dict[str, int]:
        """The batch's lines by state."""

    @abstractmethod
    async def models(self, batch_id: str) -> list[str]:
        """The models the batch's lines ask for."""

    @abstractmethod
    async def queued(self, batch_id: str, model: str, skip: set[tuple[str, int]], limit: int) -> list[Line]:
        """Up to `limit` queued lines of the batch for `model`, in their order, not in `skip`."""

    @abstractmethod
    async def finish_line(self, batch_id: str, idx: int, ok: bool, result: str) -> bool:
        """The line's one result: False when it already had one (it ran twice)."""

    @abstractmethod
    async def fail_queued(self, batch_id: str, result_of: Callable[[str], str]) -> None:
        """Every line still queued fails with `result_of(custom_id)` (an expired batch)."""

    @abstractmethod
    async def results(self, batch_id: str, state: str) -> bytes:
        """The results of the lines in `state`, in the input's order, one a line."""

    @abstractmethod
    async def finalize(self, obj: dict[str, Any], files: Sequence[tuple[dict[str, Any], bytes]], owner: str) -> bool:
        """The batch's output and error files and its final object at once, only while it is active."""

    @abstractmethod
    async def line_counts(self) -> list[tuple[str, str, int]]:
        """(model, state, lines) over the batches kept: /metrics."""

    @abstractmethod
    async def lead(self, holder: str, ttl: float) -> bool:
        """Become or stay the one runner for `ttl` seconds; False while another holds it."""

    @abstractmethod
    async def resign(self, holder: str) -> None: ...

    @abstractmethod
    async def sweep(self, now: float, retention: float) -> None:
        """Files past their time, and batches finished longer ago than `retention`, go."""
