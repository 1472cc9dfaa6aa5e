"""Lua scripts for RedisStore. Each runs atomically in Redis; together they keep the same
rules as MemoryStore: exact slots, one FIFO queue, a freed slot to the oldest waiter that
may use it.

Ids of leases and waiters are "<owner>:<n>": the instance that holds or waits (its random
owner tag) and its own running number. The owner makes every entry attributable; the number
lets a sweep tell an entry it has not heard of yet from one whose reply was lost.

Keys under the prefix P (passed as ARGV[1]):
  P:slots            hash  endpoint -> slots
  P:unhealthy        set   endpoints out of rotation
  P:lease:<ep>       zset  lease id -> expiry (ms); in flight = live members
  P:queue            zset  waiter id -> queue order
  P:waiter:<id>      hash  cands (",a,b,"), owner (the instance to wake)
  P:granted:<id>     str   endpoint a waiter was handed (so a late cancel can give it back)
  P:own:<owner>      hash  id -> endpoint ('' while it waits): all an instance holds or waits
                           for, so its sweep finds what it no longer knows of (reconciliation)
  P:usage-sent:<owner>  int   the last usage batch counted (a batch sent twice counts once)
  P:instances        zset  instance (host:supervisor pid) -> until when it counts as live (ms)
  P:fair:now         int   the virtual time: the start of the waiter last handed a slot (queue_order.py)
  P:fair:finish      hash  client -> the finish of its last waiter (its next one starts there or later)
  P:fair:served      hash  client -> the finish of its last waiter handed a slot
  P:fair:waiting:<c> zset  waiter id -> start, of client c's waiters
  channel P:wake:<owner>   "<waiter id> <endpoint>"
"""

from .queue_order import PRIORITY_MAX, PRIORITY_STEP

# Shared helpers, prepended to the scripts below.
_COMMON = (
    f"""
local FAIR_PRIORITY_MAX, FAIR_PRIORITY_STEP = {PRIORITY_MAX}, {PRIORITY_STEP}
"""
    + r"""
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function live(ep)
  redis.call('ZREMRANGEBYSCORE', P .. ':lease:' .. ep, '-inf', now)
  return redis.call('ZCARD', P .. ':lease:' .. ep)
end

local function slots(ep)
  return tonumber(redis.call('HGET', P .. ':slots', ep) or '0')
end

-- the index of everything the instance behind `id` holds or waits for
local function own_key(id)
  return P .. ':own:' .. string.match(id, '^[^:]*')
end

-- expire `key` no sooner than in `ms` (an index lives as long as what it indexes)
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end

-- hand free slots of ep to the first waiters (lowest order: priority, then fair share) that may use it
local function dispatch(ep, ttl)
  if redis.call('SISMEMBER', P .. ':unhealthy', ep) == 1 then return end
  local free = slots(ep) - live(ep)
  if free <= 0 then return end
  local waiters = redis.call('ZRANGE', P .. ':queue', 0, 999, 'WITHSCORES')
  for i = 1, #waiters, 2 do
    local w = waiters[i]
    if free <= 0 then break end
    local cands = redis.call('HGET', P .. ':waiter:' .. w, 'cands')
    if not cands then
      redis.call('ZREM', P .. ':queue', w)  -- its owner vanished; the entry expired
    elseif string.find(cands, ',' .. ep .. ',', 1, true) then
      local owner = redis.call('HGET', P .. ':waiter:' .. w, 'owner')
      local share = redis.call('HMGET', P .. ':waiter:' .. w, 'client', 'start', 'step')
      if share[1] then  -- its key is charged for it (queue_order.py)
        redis.call('ZREM', P .. ':fair:waiting:' .. share[1], w)
        local served = tonumber(redis.call('HGET', P .. ':fair:served', share[1]) or '0')
        redis.call('HSET', P .. ':fair:served', share[1],
                   string.format('%d', math.max(served, tonumber(share[2]) + tonumber(share[3]))))
      end
      redis.call('ZREM', P .. ':queue', w)
      redis.call('DEL', P .. ':waiter:' .. w)
      redis.call('ZADD', P .. ':lease:' .. ep, now + ttl, w)
      redis.call('HSET', own_key(w), w, ep)
      keep(own_key(w), ttl)
      redis.call('SET', P .. ':granted:' .. w, ep, 'PX', 60000)
      redis.call('PUBLISH', P .. ':wake:' .. owner, w .. ' ' .. ep)
      local start = math.fmod(tonumber(waiters[i + 1]), FAIR_PRIORITY_STEP)
      if start > tonumber(redis.call('GET', P .. ':fair:now') or '0') then
        redis.call('SET', P .. ':fair:now', string.format('%d', start))  -- the virtual time (queue_order.py)
      end
      free = free - 1
    end
  end
end
"""
)

# ARGV: P, lease_ttl_ms, lease_id, max_queue, owner, order ('' = new), waiter_ttl_ms,
#       client, priority, step (its share of the queue, queue_order.py),
#       then candidates as name, loaded(0/1) pairs in the caller's (shuffled) order.
ACQUIRE = (
    _COMMON
    + r"""
local ttl, id, max_queue, owner, order, waiter_ttl =
  tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7])
local client, priority, step = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local best, best_key = nil, nil
local healthy = 0
local loads = {}  -- in flight per candidate, returned with a grant (the routing policy's view)
local cands = ','
for i = 11, #ARGV, 2 do
  local ep, loaded = ARGV[i], ARGV[i + 1]
  cands = cands .. ep .. ','
  if redis.call('SISMEMBER', P .. ':unhealthy', ep) == 0 then
    healthy = healthy + 1
    dispatch(ep, ttl)  -- a slot freed by an expired lease goes to an older waiter first
    local n, cap = live(ep), slots(ep)
    loads[#loads + 1] = ep
    loads[#loads + 1] = n
    if n < cap then
      local key = (loaded == '1' and 0 or 1) * 1000000 + math.floor(n * 1000 / cap)
      if best_key == nil or key < best_key then best, best_key = ep, key end
    end
  end
end
local own = own_key(id)
if best then
  redis.call('ZADD', P .. ':lease:' .. best, now + ttl, id)
  redis.call('HSET', own, id, best)
  keep(own, ttl)
  return {'ok', best, unpack(loads)}
end
if healthy == 0 then return {'none'} end
if redis.call('ZCARD', P .. ':queue') >= max_queue then return {'full'} end
redis.call('HSET', P .. ':waiter:' .. id, 'cands', cands, 'owner', owner)
if order == '' then  -- its place: priority, then its key's fair share (queue_order.py)
  local now_v = tonumber(redis.call('GET', P .. ':fair:now') or '0')
  local start = math.max(now_v, tonumber(redis.call('HGET', P .. ':fair:finish', client) or '0'))
  redis.call('HSET', P .. ':fair:finish', client, string.format('%d', start + step))
  redis.call('HSET', P .. ':waiter:' .. id, 'client', client, 'start', string.format('%d', start),
             'step', string.format('%d', step))
  redis.call('ZADD', P .. ':fair:waiting:' .. client, start, id)
  order = string.format('%d', (FAIR_PRIORITY_MAX - priority) * FAIR_PRIORITY_STEP + start)
end
redis.call('PEXPIRE', P .. ':waiter:' .. id, waiter_ttl)
redis.call('ZADD', P .. ':queue', order, id)
redis.call('HSET', own, id, '')
keep(own, math.max(ttl, waiter_ttl))
return {'queued', tostring(order)}
"""
)

# ARGV: P, lease_ttl_ms, endpoint, lease id
RELEASE = (
    _COMMON
    + r"""
redis.call('ZREM', P .. ':lease:' .. ARGV[3], ARGV[4])
redis.call('HDEL', own_key(ARGV[4]), ARGV[4])
redis.call('DEL', P .. ':granted:' .. ARGV[4])
dispatch(ARGV[3], tonumber(ARGV[2]))
return 1
"""
)

# A waiter gives up (timeout or client gone). ARGV: P, lease_ttl_ms, waiter id
CANCEL = (
    _COMMON
    + r"""
local id = ARGV[3]
redis.call('HDEL', own_key(id), id)
if redis.call('ZREM', P .. ':queue', id) == 1 then
  local share = redis.call('HMGET', P .. ':waiter:' .. id, 'client', 'start', 'step')
  if share[1] then  -- left without a slot: its key is charged for what it was served and still waits for
    local waiting = P .. ':fair:waiting:' .. share[1]
    redis.call('ZREM', waiting, id)
    local finish = tonumber(redis.call('HGET', P .. ':fair:served', share[1]) or '0')
    local last = redis.call('ZRANGE', waiting, -1, -1, 'WITHSCORES')
    if last[2] then finish = math.max(finish, tonumber(last[2]) + tonumber(share[3])) end
    redis.call('HSET', P .. ':fair:finish', share[1], string.format('%d', finish))
  end
  redis.call('DEL', P .. ':waiter:' .. id)
  return 'removed'
end
local ep = redis.call('GET', P .. ':granted:' .. id)
if ep then
  redis.call('DEL', P .. ':granted:' .. id)
  redis.call('ZREM', P .. ':lease:' .. ep, id)
  dispatch(ep, tonumber(ARGV[2]))
  return 'released'
end
return 'gone'
"""
)

# Periodic, and the reconciliation after an outage: (re-)register every lease the instance
# holds — extended, or added back if Redis lost it or never saw it (granted locally while Redis
# was away) —; remove what Redis holds for the instance that the instance does not know of
# (ghosts: grants and queue entries whose replies a stalled or dead connection lost) but only
# up to number `max_seq`, as higher ones may still be on their way; let expired leases go;
# hand freed slots on; report every endpoint's count and the queue's length; count the
# instance as live for `lease_ttl` and report how many are (what each takes a share by while
# Redis is away: redis_local.py).
# ARGV: P, lease_ttl_ms, owner, max_seq, instance, then endpoint, id pairs (endpoint '' for an
#       id the instance waits on, queued or with its acquire under way)
# Returns {ghosts removed, queue length, live instances, endpoint, in flight, ...}
SWEEP = (
    _COMMON
    + r"""
local ttl, owner, max_seq = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local own = P .. ':own:' .. owner
local instances = P .. ':instances'
redis.call('ZADD', instances, now + ttl, ARGV[5])
redis.call('ZREMRANGEBYSCORE', instances, '-inf', now)
keep(instances, ttl)
local known = {}
for i = 6, #ARGV, 2 do
  local ep, id = ARGV[i], ARGV[i + 1]
  known[id] = true
  if ep ~= '' then
    redis.call('ZADD', P .. ':lease:' .. ep, now + ttl, id)
    redis.call('HSET', own, id, ep)
  end
end
local ghosts = 0
local entries = redis.call('HGETALL', own)
for i = 1, #entries, 2 do
  local id, ep = entries[i], entries[i + 1]
  local seq = tonumber(string.match(id, ':(%d+)$'))
  if not known[id] and seq and seq <= max_seq then
    redis.call('ZREM', P .. ':queue', id)
    local client = redis.call('HGET', P .. ':waiter:' .. id, 'client')
    if client then redis.call('ZREM', P .. ':fair:waiting:' .. client, id) end
    redis.call('DEL', P .. ':waiter:' .. id, P .. ':granted:' .. id)
    if ep ~= '' then redis.call('ZREM', P .. ':lease:' .. ep, id) end
    redis.call('HDEL', own, id)
    ghosts = ghosts + 1
  end
end
if redis.call('EXISTS', own) == 1 then keep(own, ttl) end
local out = {ghosts, 0, redis.call('ZCARD', instances)}
for _, ep in ipairs(redis.call('HKEYS', P .. ':slots')) do
  dispatch(ep, ttl)
  out[#out + 1] = ep
  out[#out + 1] = live(ep)
end
out[2] = redis.call('ZCARD', P .. ':queue')
return out
"""
)

# ARGV: P, lease_ttl_ms, endpoint, healthy (0/1)
HEALTH = (
    _COMMON
    + r"""
if ARGV[4] == '1' then
  redis.call('SREM', P .. ':unhealthy', ARGV[3])
  dispatch(ARGV[3], tonumber(ARGV[2]))
else
  redis.call('SADD', P .. ':unhealthy', ARGV[3])
end
return 1
"""
)

# Requests served, counted once per batch: a batch whose reply was lost is sent again with the
# same number, and Redis skips it if it already counted it.
# ARGV: P, lease_ttl_ms, owner, batch number, then endpoint, model, count triples
USAGE = r"""
local P = ARGV[1]
local sent = P .. ':usage-sent:' .. ARGV[3]
if tonumber(redis.call('GET', sent) or '0') >= tonumber(ARGV[4]) then return 0 end
for i = 5, #ARGV, 3 do
  redis.call('HINCRBY', P .. ':usage:' .. ARGV[i], ARGV[i + 1], ARGV[i + 2])
end
redis.call('SET', sent, ARGV[4], 'PX', 3600000)
return 1
"""

NAMES = ("ACQUIRE", "RELEASE", "CANCEL", "SWEEP", "HEALTH", "USAGE")
