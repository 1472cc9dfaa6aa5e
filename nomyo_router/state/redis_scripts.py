"""Lua scripts for RedisStore. Each runs atomically in Redis; together they keep the same
rules as MemoryStore: exact slots, one FIFO queue, a freed slot to the oldest waiter that
may use it.

Keys under the prefix P (passed as ARGV[1]):
  P:slots            hash  endpoint -> slots
  P:unhealthy        set   endpoints out of rotation
  P:lease:<ep>       zset  lease id -> expiry (ms); in flight = live members
  P:queue            zset  waiter id -> queue order
  P:waiter:<id>      hash  cands (",a,b,"), owner (the instance to wake)
  P:granted:<id>     str   endpoint a waiter was handed (so a late cancel can give it back)
  P:ticket           int   queue order counter
  channel P:wake:<owner>   "<waiter id> <endpoint>"
"""

# Shared helpers, prepended to the scripts below.
_COMMON = r"""
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

-- hand free slots of ep to the oldest waiters that may use it
local function dispatch(ep, ttl)
  if redis.call('SISMEMBER', P .. ':unhealthy', ep) == 1 then return end
  local free = slots(ep) - live(ep)
  if free <= 0 then return end
  local waiters = redis.call('ZRANGE', P .. ':queue', 0, 999)
  for _, w in ipairs(waiters) do
    if free <= 0 then break end
    local cands = redis.call('HGET', P .. ':waiter:' .. w, 'cands')
    if not cands then
      redis.call('ZREM', P .. ':queue', w)  -- its owner vanished; the entry expired
    elseif string.find(cands, ',' .. ep .. ',', 1, true) then
      local owner = redis.call('HGET', P .. ':waiter:' .. w, 'owner')
      redis.call('ZREM', P .. ':queue', w)
      redis.call('DEL', P .. ':waiter:' .. w)
      redis.call('ZADD', P .. ':lease:' .. ep, now + ttl, w)
      redis.call('SET', P .. ':granted:' .. w, ep, 'PX', 60000)
      redis.call('PUBLISH', P .. ':wake:' .. owner, w .. ' ' .. ep)
      free = free - 1
    end
  end
end
"""

# ARGV: P, lease_ttl_ms, lease_id, max_queue, owner, order ('' = new), waiter_ttl_ms,
#       then candidates as name, loaded(0/1) pairs in the caller's (shuffled) order.
ACQUIRE = _COMMON + r"""
local ttl, id, max_queue, owner, order, waiter_ttl =
  tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7])
local best, best_key = nil, nil
local healthy = 0
local loads = {}  -- in flight per candidate, returned with a grant (the routing policy's view)
local cands = ','
for i = 8, #ARGV, 2 do
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
if best then
  redis.call('ZADD', P .. ':lease:' .. best, now + ttl, id)
  return {'ok', best, unpack(loads)}
end
if healthy == 0 then return {'none'} end
if redis.call('ZCARD', P .. ':queue') >= max_queue then return {'full'} end
if order == '' then order = redis.call('INCR', P .. ':ticket') end
redis.call('HSET', P .. ':waiter:' .. id, 'cands', cands, 'owner', owner)
redis.call('PEXPIRE', P .. ':waiter:' .. id, waiter_ttl)
redis.call('ZADD', P .. ':queue', order, id)
return {'queued', tostring(order)}
"""

# ARGV: P, lease_ttl_ms, endpoint, lease id
RELEASE = _COMMON + r"""
redis.call('ZREM', P .. ':lease:' .. ARGV[3], ARGV[4])
dispatch(ARGV[3], tonumber(ARGV[2]))
return 1
"""

# A waiter gives up (timeout or client gone). ARGV: P, lease_ttl_ms, waiter id
CANCEL = _COMMON + r"""
local id = ARGV[3]
if redis.call('ZREM', P .. ':queue', id) == 1 then
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

# Periodic: extend our leases, let expired ones go, hand freed slots on.
# ARGV: P, lease_ttl_ms, then endpoint, lease id pairs to extend
SWEEP = _COMMON + r"""
local ttl = tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  redis.call('ZADD', P .. ':lease:' .. ARGV[i], 'XX', now + ttl, ARGV[i + 1])
end
for _, ep in ipairs(redis.call('HKEYS', P .. ':slots')) do
  dispatch(ep, ttl)
end
return 1
"""

# ARGV: P, lease_ttl_ms, endpoint, healthy (0/1)
HEALTH = _COMMON + r"""
if ARGV[4] == '1' then
  redis.call('SREM', P .. ':unhealthy', ARGV[3])
  dispatch(ARGV[3], tonumber(ARGV[2]))
else
  redis.call('SADD', P .. ':unhealthy', ARGV[3])
end
return 1
"""
