"""Rate limits and token budgets in Redis: one count for every instance (key_limits.py says what
is counted). Each admission is one atomic script call — a round trip per request, paid only
by keys that have limits; an answer's tokens are added by another, without waiting for it.
Times are Redis's own (`TIME`), so instances with clocks apart still count one window.

Keys under the store's prefix P, per client C:
  P:rl:C:req         zset  admitted request id -> time (s): the last minute's requests
  P:rl:C:tok         zset  "<id>:<tokens>" -> time (s): the last minute's spends
  P:rl:C:held        zset  "<id>:<tokens>" -> time (s): reservations of requests in progress
                           (dropped after HOLD_S: an instance killed with SIGKILL never settles)
  P:rl:C:day:<day>   int   tokens of that UTC day (kept two days)
  P:rl:seq           int   ids

Redis keeps them across router restarts. While Redis is away (the store is degraded) the
process's own count stands in, as slots do; a reservation made there is numbered below zero
and settled there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from .base import StateStore
from .key_limits import HOLD_S, RESERVED_WAIT_S, Limits, Verdict
from .redis_link import RedisLink

log = logging.getLogger("nomyo_router.redis")

_COMMON = r"""
local P = ARGV[1] .. ':rl:' .. ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local day = math.floor(now / 86400)
local kr, kt, kd, kh = P .. ':req', P .. ':tok', P .. ':day:' .. day, P .. ':held'
"""

# ARGV: prefix, client, rpm, tpm, tokens_per_day (0: none), count (1: count an admitted request),
# reserve (tokens to reserve for it), HOLD_S, RESERVED_WAIT_S
ADMIT = (
    _COMMON
    + r"""
local rpm, tpm, tpd = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', kr, '-inf', now - 60)
redis.call('ZREMRANGEBYSCORE', kt, '-inf', now - 60)
redis.call('ZREMRANGEBYSCORE', kh, '-inf', now - tonumber(ARGV[8]))
local nreq = redis.call('ZCARD', kr)
local spends = redis.call('ZRANGE', kt, 0, -1, 'WITHSCORES')
local ntok = 0
for i = 1, #spends, 2 do ntok = ntok + tonumber(string.match(spends[i], ':(%d+)$')) end
local held = 0
for _, h in ipairs(redis.call('ZRANGE', kh, 0, -1)) do held = held + tonumber(string.match(h, ':(%d+)$')) end
local nday = tonumber(redis.call('GET', kd) or '0')
local refused, wait, reserved_wait = '', 0, tonumber(ARGV[9])
if tpd > 0 and nday + held >= tpd then
  refused, wait = 'tokens_per_day', reserved_wait
  if nday >= tpd then wait = (day + 1) * 86400 - now end
end
if rpm > 0 and nreq >= rpm then
  if refused == '' then refused = 'rpm' end
  local oldest = redis.call('ZRANGE', kr, nreq - rpm, nreq - rpm, 'WITHSCORES')
  wait = math.max(wait, tonumber(oldest[2]) + 60 - now)
end
if tpm > 0 and ntok + held >= tpm then
  if refused == '' then refused = 'tpm' end
  local left, waited = ntok + held, reserved_wait
  for i = 1, #spends, 2 do
    left = left - tonumber(string.match(spends[i], ':(%d+)$'))
    if left < tpm then waited = tonumber(spends[i + 1]) + 60 - now break end
  end
  wait = math.max(wait, waited)
end
local hold, reserve = 0, tonumber(ARGV[7])
if refused == '' and ARGV[6] == '1' then
  if rpm > 0 then
    redis.call('ZADD', kr, now, redis.call('INCR', ARGV[1] .. ':rl:seq'))
    redis.call('EXPIRE', kr, 61)
    nreq = nreq + 1
  end
  if reserve > 0 and (tpm > 0 or tpd > 0) then
    hold = redis.call('INCR', ARGV[1] .. ':rl:seq')
    redis.call('ZADD', kh, now, hold .. ':' .. reserve)
    redis.call('EXPIRE', kh, math.ceil(tonumber(ARGV[8])) + 1)
    held = held + reserve
  end
end
local reset_req, reset_tok = 0, 0
if nreq > 0 then reset_req = tonumber(redis.call('ZRANGE', kr, 0, 0, 'WITHSCORES')[2]) + 60 - now end
if #spends > 0 then reset_tok = tonumber(spends[2]) + 60 - now end
return {refused, tostring(math.max(wait, 0)), nreq, ntok, nday, tostring(reset_req), tostring(reset_tok), held, hold}
"""
)

# ARGV: prefix, client, tokens, tpm?, tokens_per_day? (1: the key has that limit), the
# reservation settled ("<id>:<tokens>", or "" for none)
SPEND = (
    _COMMON
    + r"""
local n = tonumber(ARGV[3])
if ARGV[6] ~= '' then redis.call('ZREM', kh, ARGV[6]) end
if n <= 0 then return 1 end
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

    async def admit(self, client: str, limits: Limits, count: bool, reserve: int = 0) -> Verdict:
        if not self._degraded():
            args: list[str | int | float] = [self.link.prefix, client, *limits.wire(), int(count), reserve]
            try:
                v = await self.link.call(self._admit(args=[*args, HOLD_S, RESERVED_WAIT_S]))
            except (RedisError, OSError) as e:
                self._degrade(e)
            else:
                got: list[Any] = [x.decode() if isinstance(x, bytes) else x for x in v]
                return Verdict.from_wire(got)
        v = await self.local.admit(client, limits, count, reserve)
        return v._replace(hold=-v.hold)  # (settled in the local count, whatever Redis does then)

    def spend(self, client: str, tokens: int, limits: Limits, hold: int = 0, reserved: int = 0) -> None:
        if hold < 0:
            self.local.spend(client, 0, limits, -hold, reserved)
            hold = 0
        if self._degraded():
            self.local.spend(client, tokens, limits)
            return
        self._background(self._send(client, tokens, limits, f"{hold}:{reserved}" if hold else ""))

    async def _send(self, client: str, tokens: int, limits: Limits, held: str) -> None:
        try:
            await self.link.call(
                self._spend(
                    args=[
                        self.link.prefix,
                        client,
                        tokens,
                        int(limits.tpm is not None),
                        int(limits.tokens_per_day is not None),
                        held,
                    ]
                )
            )
        except (RedisError, OSError) as e:
            self.local.spend(client, tokens, limits)  # (counted here at least)
            self._degrade(e)
