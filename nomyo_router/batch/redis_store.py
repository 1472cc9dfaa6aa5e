"""The batch store in Redis (`state: redis://`): every instance serves any file or batch, and
whichever holds the runner's lease runs the lines (see base.py for what is kept).

Keys, under `nomyo:batch:`:
- `seq`: a counter that orders files and batches as they were made;
- `f:<id>`: a file (`meta`: its object and owner as JSON, `content`), `files`: their order;
- `b:<id>`: a batch (`obj`, `owner`, `status`), `batches`: their order, `active`: those running;
- `l:<batch>:req` (each line's custom_id, model and request), `l:<batch>:q` (the queued lines'
  numbers) and `l:<batch>:q:<model>` (those of one model), `l:<batch>:models` (the batch's
  models), `l:<batch>:done` and `l:<batch>:failed` (results by line number);
- `models`: lines per model and state, for /metrics; `leader`: the runner's lease.

A line's result is written by one script that first takes it out of the queue: only a queued
line gets one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.exceptions import RedisError

from ..state import redis_url
from .base import ACTIVE, BatchStore, Line, NewLine

P = "nomyo:batch:"
_FINISH = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local model = cjson.decode(redis.call('HGET', KEYS[3], ARGV[1]))[2]
redis.call('ZREM', KEYS[1] .. ':' .. model, ARGV[1])
redis.call('HINCRBY', KEYS[4], model .. '\\t' .. 'queued', -1)
redis.call('HINCRBY', KEYS[4], model .. '\\t' .. ARGV[3], 1)
return 1
"""
_SAVE = """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return 0 end
if #ARGV > 3 then
  local ok = false
  for i = 4, #ARGV do if ARGV[i] == cur then ok = true end end
  if not ok then return 0 end
end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'obj', ARGV[2])
if ARGV[1] == 'in_progress' or ARGV[1] == 'cancelling' or ARGV[1] == 'finalizing' then
  redis.call('SADD', KEYS[2], ARGV[3])
else
  redis.call('SREM', KEYS[2], ARGV[3])
end
return 1
"""
_LEAD = """
local h = redis.call('GET', KEYS[1])
if not h or h == ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
_RESIGN = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end return 0"


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisBatches(BatchStore):
    errors = (RedisError, OSError, TimeoutError)

    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.timeout = url, timeout
        self.r: Any = None

    async def open(self) -> None:
        r = self.r = redis_url.client(self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout)
        self._finish = r.register_script(_FINISH)
        self._save = r.register_script(_SAVE)
        self._lead = r.register_script(_LEAD)
        self._resign = r.register_script(_RESIGN)

    async def close(self) -> None:
        if self.r is not None:
            await redis_url.close(self.r)
            self.r = None

    # ---- files ---------------------------------------------------------------------------------
    async def put_file(self, obj: dict[str, Any], owner: str, content: bytes) -> None:
        seq = await self.r.incr(P + "seq")
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(P + "f:" + obj["id"], mapping={"meta": json.dumps([obj, owner]), "content": content})
        pipe.zadd(P + "files", {obj["id"]: seq})
        await pipe.execute()

    async def get_file(self, file_id: str) -> tuple[dict[str, Any], str] | None:
        meta = await self.r.hget(P + "f:" + file_id, "meta")
        if meta is None:
            return None
        obj, owner = json.loads(meta)
        return obj, owner

    async def content(self, file_id: str) -> bytes | None:
        data: bytes | None = await self.r.hget(P + "f:" + file_id, "content")
        return data

    async def list_files(
        self, owner: str | None, purpose: str | None, after: str | None, limit: int, desc: bool
    ) -> list[Any]:
        ids = [_s(i) for i in await self.r.zrange(P + "files", 0, -1, desc=desc)]
        if after in ids:
            ids = ids[ids.index(after) + 1 :]
        out = []
        for file_id in ids:
            found = await self.get_file(file_id)
            if (
                found is not None
                and (owner is None or found[1] == owner)
                and (not purpose or found[0]["purpose"] == purpose)
            ):
                out.append(found[0])
                if len(out) >= limit:
                    break
        return out

    async def delete_file(self, file_id: str) -> None:
        await self.r.delete(P + "f:" + file_id)
        await self.r.zrem(P + "files", file_id)

    # ---- batches -------------------------------------------------------------------------------
    async def create_batch(self, obj: dict[str, Any], owner: str, lines: Iterable[NewLine]) -> None:
        bid = obj["id"]
        seq = await self.r.incr(P + "seq")
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(P + "b:" + bid, mapping={"obj": json.dumps(obj), "owner": owner, "status": obj["status"]})
        pipe.zadd(P + "batches", {bid: seq})
        if obj["status"] in ACTIVE:
            pipe.sadd(P + "active", bid)
        req: dict[str, str] = {}
        queued: dict[str, int] = {}
        by_model: dict[str, dict[str, int]] = {}
        failed: dict[str, str] = {}
        per_model: dict[str, int] = {}
        for idx, cid, model, request, result in lines:
            req[str(idx)] = json.dumps([cid, model, request])
            state = "queued" if result is None else "failed"
            if result is None:
                queued[str(idx)] = idx
                by_model.setdefault(model, {})[str(idx)] = idx
            else:
                failed[str(idx)] = result
            per_model[f"{model}\t{state}"] = per_model.get(f"{model}\t{state}", 0) + 1
        if req:
            pipe.hset(f"{P}l:{bid}:req", mapping=req)
        if queued:
            pipe.zadd(f"{P}l:{bid}:q", queued)
            pipe.sadd(f"{P}l:{bid}:models", *by_model)
        for model, nums in by_model.items():
            pipe.zadd(f"{P}l:{bid}:q:{model}", nums)
        if failed:
            pipe.hset(f"{P}l:{bid}:failed", mapping=failed)
        for field, n in per_model.items():
            pipe.hincrby(P + "models", field, n)
        await pipe.execute()

    async def get_batch(self, batch_id: str) -> tuple[dict[str, Any], str] | None:
        obj, owner = await self.r.hmget(P + "b:" + batch_id, ["obj", "owner"])
        return None if obj is None else (json.loads(obj), _s(owner))

    async def list_batches(self, owner: str | None, after: str | None, limit: int) -> list[dict[str, Any]]:
        ids = [_s(i) for i in await self.r.zrange(P + "batches", 0, -1, desc=True)]
        if after in ids:
            ids = ids[ids.index(after) + 1 :]
        out = []
        for bid in ids:
            found = await self.get_batch(bid)
            if found is not None and (owner is None or found[1] == owner):
                out.append(found[0])
                if len(out) >= limit:
                    break
        return out

    async def save_batch(self, obj: dict[str, Any], only_if: Sequence[str] = ()) -> bool:
        keys = [P + "b:" + obj["id"], P + "active"]
        return bool(await self._save(keys=keys, args=[obj["status"], json.dumps(obj), obj["id"], *only_if]))

    async def active(self) -> list[dict[str, Any]]:
        out = []
        for bid in sorted(_s(i) for i in await self.r.smembers(P + "active")):
            obj, owner, status = await self.r.hmget(P + "b:" + bid, ["obj", "owner", "status"])
            if obj is not None and _s(status) in ACTIVE:
                out.append({**json.loads(obj), "_owner": _s(owner)})
        return out

    async def counts(self, batch_id: str) -> dict[str, int]:
        pipe = self.r.pipeline(transaction=False)
        pipe.zcard(f"{P}l:{batch_id}:q")
        pipe.hlen(f"{P}l:{batch_id}:done")
        pipe.hlen(f"{P}l:{batch_id}:failed")
        q, d, f = await pipe.execute()
        return {"queued": q, "done": d, "failed": f}

    # ---- lines ---------------------------------------------------------------------------------
    async def models(self, batch_id: str) -> list[str]:
        return sorted(_s(m) for m in await self.r.smembers(f"{P}l:{batch_id}:models"))

    async def queued(self, batch_id: str, model: str, skip: set[tuple[str, int]], limit: int) -> list[Line]:
        nums = [int(_s(i)) for i in await self.r.zrange(f"{P}l:{batch_id}:q:{model}", 0, limit + len(skip) - 1)]
        nums = [i for i in nums if (batch_id, i) not in skip][:limit]
        if not nums:
            return []
        out: list[Line] = []
        for i, raw in zip(nums, await self.r.hmget(f"{P}l:{batch_id}:req", [str(i) for i in nums]), strict=True):
            if raw is not None:
                cid, model_name, request = json.loads(raw)
                out.append((batch_id, i, cid, model_name, request))
        return out

    async def finish_line(self, batch_id: str, idx: int, ok: bool, result: str) -> bool:
        state = "done" if ok else "failed"
        keys = [f"{P}l:{batch_id}:q", f"{P}l:{batch_id}:{state}", f"{P}l:{batch_id}:req", P + "models"]
        return bool(await self._finish(keys=keys, args=[str(idx), result, state]))

    async def fail_queued(self, batch_id: str, result_of: Callable[[str], str]) -> None:
        nums = [int(_s(i)) for i in await self.r.zrange(f"{P}l:{batch_id}:q", 0, -1)]
        for i in nums:
            raw = await self.r.hget(f"{P}l:{batch_id}:req", str(i))
            if raw is not None:
                await self.finish_line(batch_id, i, False, result_of(json.loads(raw)[0]))

    async def results(self, batch_id: str, state: str) -> bytes:
        got = await self.r.hgetall(f"{P}l:{batch_id}:{state}")
        rows = sorted((int(_s(k)), v if isinstance(v, bytes) else str(v).encode()) for k, v in got.items())
        return b"".join(v + b"\n" for _, v in rows)

    async def finalize(self, obj: dict[str, Any], files: Sequence[tuple[dict[str, Any], bytes]], owner: str) -> bool:
        for f, content in files:  # (first: the batch never names a file that is not there)
            await self.put_file(f, owner, content)
        if await self.save_batch(obj, ACTIVE):
            return True
        for f, _ in files:  # another runner finalized it first
            await self.delete_file(f["id"])
        return False

    async def line_counts(self) -> list[tuple[str, str, int]]:
        got = await self.r.hgetall(P + "models")
        out = []
        for k, v in got.items():
            model, _, state = _s(k).rpartition("\t")
            out.append((model, state, int(v)))
        return out

    async def lead(self, holder: str, ttl: float) -> bool:
        return bool(await self._lead(keys=[P + "leader"], args=[holder, int(ttl * 1000)]))

    async def resign(self, holder: str) -> None:
        await self._resign(keys=[P + "leader"], args=[holder])

    async def sweep(self, now: float, retention: float) -> None:
        for file_id in [_s(i) for i in await self.r.zrange(P + "files", 0, -1)]:
            found = await self.get_file(file_id)
            if found is None or found[0]["expires_at"] < now:
                await self.delete_file(file_id)
        for bid in [_s(i) for i in await self.r.zrange(P + "batches", 0, -1)]:
            found = await self.get_batch(bid)
            if found is None:
                await self.r.zrem(P + "batches", bid)
            elif found[0]["status"] not in ACTIVE and found[0]["created_at"] < now - retention:
                await self._forget(bid)

    async def _forget(self, bid: str) -> None:
        """A finished batch goes, and its lines leave the per-model counts."""
        reqs = await self.r.hgetall(f"{P}l:{bid}:req")
        done = {_s(k) for k in await self.r.hkeys(f"{P}l:{bid}:done")}
        models = [f"{P}l:{bid}:q:{_s(m)}" for m in await self.r.smembers(f"{P}l:{bid}:models")]
        pipe = self.r.pipeline(transaction=True)
        for k, v in reqs.items():
            model = json.loads(v)[1]
            pipe.hincrby(P + "models", f"{model}\t{'done' if _s(k) in done else 'failed'}", -1)
        pipe.delete(*(f"{P}l:{bid}:{x}" for x in ("req", "q", "models", "done", "failed")), *models, P + "b:" + bid)
        pipe.zrem(P + "batches", bid)
        pipe.srem(P + "active", bid)
        await pipe.execute()
