--[[ extend: push the deadlines of current leases to now + lease_ms, batched.

Fenced: a receipt no longer in `leased` changes nothing. A deadline is never moved
earlier: the new deadline is max(current deadline, now + lease_ms). A lease past its
deadline that maintenance has not yet reclaimed can still be extended.

KEYS (2), all <prefix>:{<queue>}:<role>
  1 jobs     hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>" (read only)
  2 leased   zset  receipt -> deadline_ms

ARGV (2 + r)
  1  now_ms      '' (use the server clock) or integer >= 0; tests only
  2  lease_ms    integer 1..604800000
  3.. receipts   1..1000 receipts from lease

Returns  {status_1, deadline_ms_1, .., status_r, deadline_ms_r}; status 'ok' with the
         new deadline, or 'stale' / 'gone' (as ack.lua) with deadline 0.
Errors   PQ_BADARG (nothing written), WRONGTYPE (nothing written).
Replay   a re-sent call sets the same deadlines again, or later ones: one extension.
]]

local jobs_key, leased_key = KEYS[1], KEYS[2]

local MAX_BATCH = 1000

local function int_arg(value, name, lo, hi)
  if type(value) ~= 'string' or not string.match(value, '^%-?%d+$') then
    return nil, 'PQ_BADARG ' .. name .. ' must be an integer, got ' .. string.format('%q', tostring(value))
  end
  local n = tonumber(value)
  if n < lo or n > hi then
    return nil, string.format('PQ_BADARG %s must be in [%d, %d], got %s', name, lo, hi, value)
  end
  return n
end

-- 1. Validate.
local now_ms, lease_ms, err
if ARGV[1] ~= '' then
  now_ms, err = int_arg(ARGV[1], 'now_ms', 0, 2 ^ 53)
  if err then return redis.error_reply(err) end
end
lease_ms, err = int_arg(ARGV[2], 'lease_ms', 1, 604800000)
if err then return redis.error_reply(err) end
if #ARGV < 3 or #ARGV - 2 > MAX_BATCH then return redis.error_reply('PQ_BADARG 1..1000 receipts per call') end
local leases = {}
for i = 3, #ARGV do
  local id = string.match(ARGV[i], '^[%w_.:%-]+|[%w_.:%-]+|%d+|%d+|(.+)$')
  if not id then return redis.error_reply('PQ_BADARG malformed receipt ' .. string.format('%q', ARGV[i])) end
  leases[#leases + 1] = { receipt = ARGV[i], id = id }
end
if now_ms == nil then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 2. Read: the only key written is `leased`, and it is read first.
local reply, updates = {}, {}
for _, lease in ipairs(leases) do
  local current = redis.call('ZSCORE', leased_key, lease.receipt)
  if current then
    local deadline_ms = math.max(tonumber(current), now_ms + lease_ms)
    updates[#updates + 1] = { deadline_ms, lease.receipt }
    reply[#reply + 1] = 'ok'
    reply[#reply + 1] = deadline_ms
  else
    reply[#reply + 1] = redis.call('HEXISTS', jobs_key, lease.id) == 1 and 'stale' or 'gone'
    reply[#reply + 1] = 0
  end
end

-- 3. Write. ZREM then ZADD: never re-creates a lease that is gone; and a first write that
-- removes lets extend run at Redis's memory limit (it refuses only a growing first write).
for _, u in ipairs(updates) do
  if redis.call('ZREM', leased_key, u[2]) == 1 then redis.call('ZADD', leased_key, u[1], u[2]) end
end
return reply
