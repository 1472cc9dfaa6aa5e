"""Rate limits and token budgets in Redis: one count for every instance (limits.py says what
is counted). Each admission is one atomic script call — a round trip per request, paid only
by keys that have limits; an answer's tokens are added by another, without waiting for it.
Times are Redis's own (`TIME`), so instances with clocks apart still count one window.

Keys under the store's prefix P, per client C:
  P:rl:C:req         zset  admitted request id -> time (s): the last minute's requests
  P:rl:C:tok         zset  "<id>:<tokens>" -> time (s): the last minute's spends
  P:rl:C:day:<day>   int   tokens of that UTC day (kept two days)
  P:rl:seq           int   ids

While Redis is away (the store is degraded) the process's own count stands in, as slots do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from .base import StateStore
from .limits import Limits, Verdict
from .redis_link import RedisLink

log = logging.getLogger("nomyo_router.redis")

_COMMON = r"""
local P = ARGV[1] .. ':rl:' .. ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local day = math.floor(now / 86400)
local kr, kt, kd = P .. ':req', P .. ':tok', P .. ':day:' .. day
"""

# ARGV: prefix, client, rpm, tpm, tokens_per_day (0: none), count (1: count an admitted request)
ADMIT = (
    _COMMON
    + r"""
local rpm, tpm, tpd = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', kr, '-inf', now - 60)
redis.call('ZREMRANGEBYSCORE', kt, '-inf', now - 60)
local nreq = redis.call('ZCARD', kr)
local spends = redis.call('ZRANGE', kt, 0, -1, 'WITHSCORES')
local ntok = 0
for i = 1, #spends, 2 do ntok = ntok + tonumber(string.match(spends[i], ':(%d+)$')) end
local nday = tonumber(redis.call('GET', kd) or '0')
local refused, wait = '', 0
if tpd > 0 and nday >= tpd then refused, wait = 'tokens_per_day', (day + 1) * 86400 - now end
if rpm > 0 and nreq >= rpm then
  if refused == '' then refused = 'rpm' end
  local oldest = redis.call('ZRANGE', kr, nreq - rpm, nreq - rpm, 'WITHSCORES')
  wait = math.max(wait, tonumber(oldest[2]) + 60 - now)
end
if tpm > 0 and ntok >= tpm then
  if refused == '' then refused = 'tpm' end
  local left = ntok
  for i = 1, #spends, 2 do
    left = left - tonumber(string.match(spends[i], ':(%d+)$'))
    if left < tpm then wait = math.max(wait, tonumber(spends[i + 1]) + 60 - now) break end
  end
end
if refused == '' and ARGV[6] == '1' and rpm > 0 then
  redis.call('ZADD', kr, now, redis.call('INCR', ARGV[1] .. ':rl:seq'))
  redis.call('EXPIRE', kr, 61)
  nreq = nreq + 1
end
local reset_req, reset_tok = 0, 0
if nreq > 0 then reset_req = tonumber(redis.call('ZRANGE', kr, 0, 0, 'WITHSCORES')[2]) + 60 - now end
if #spends > 0 then reset_tok = tonumber(spends[2]) + 60 - now end
return {refused, tostring(math.max(wait, 0)), nreq, ntok, nday, tostring(reset_req), tostring(reset_tok)}
"""
)

# ARGV: prefix, client, tokens, tpm?, tokens_per_day? (1: the key has that limit)
SPEND = (
    _COMMON
    + r"""
local n = tonumber(ARGV[3])
if ARGV[4] == '1' then
  redis.call('ZADD', kt, now, redis.call('INCR', ARGV[1] .. ':rl:seq') .. ':' .. n)
  redis.call('EXPIRE', kt, 61)
end
if ARGV[5] == '1' then
  redis.call('INCRBY', kd, n)
  redis.call('EXPIRE', kd, 172800)
end
return 1
"""
)


class RedisLimits:
    """RedisStore's rate limits. `local`: the process's own store (its count while Redis is away)."""

    def __init__(
        self,
        link: RedisLink,
        local: StateStore,
        degraded: Callable[[], bool],
        degrade: Callable[[BaseException], None],
        background: Callable[[Coroutine[object, object, None]], None],
    ) -> None:
        self.link, self.local = link, local
        self._degraded, self._degrade, self._background = degraded, degrade, background
        self._admit = link.client.register_script(ADMIT)
        self._spend = link.client.register_script(SPEND)

    async def admit(self, client: str, limits: Limits, count: bool) -> Verdict:
        if not self._degraded():
            try:
                v = await self.link.call(self._admit(args=[self.link.prefix, client, *limits.wire(), int(count)]))
            except (RedisError, OSError) as e:
                self._degrade(e)
            else:
                got: list[Any] = [x.decode() if isinstance(x, bytes) else x for x in v]
                return Verdict.from_wire(got)
        return await self.local.admit(client, limits, count)

    def spend(self, client: str, tokens: int, limits: Limits) -> None:
        if self._degraded():
            self.local.spend(client, tokens, limits)
            return
        self._background(self._send(client, tokens, limits))

    async def _send(self, client: str, tokens: int, limits: Limits) -> None:
        try:
            await self.link.call(
                self._spend(
                    args=[
                        self.link.prefix,
                        client,
                        tokens,
                        int(limits.tpm is not None),
                        int(limits.tokens_per_day is not None),
                    ]
                )
            )
        except (RedisError, OSError) as e:
            self.local.spend(client, tokens, limits)  # (counted here at least)
            self._degrade(e)
