--[[ release: give current leases back to the head of READY without counting the attempt
(graceful shutdown). Fenced: a receipt no longer in `leased` changes nothing.

Released jobs go to the head in receipt order, so the first receipt is leased next.
The job record is untouched: its stored attempts are those before the released lease.

KEYS (6), all <prefix>:{<queue>}:<role>
  1 jobs      hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>" (read only)
  2 ready     list  job ids, head = next to lease
  3 leased    zset  receipt -> deadline_ms
  4 owners    zset  receipt -> 0
  5 counters  hash  counter name -> integer ('released')
  6 wake      zset  the single member "wake" while workers should wake up

ARGV (r)
  1..r receipts  1..1000 receipts from lease

Returns  {status_1 .. status_r}: 'ok', 'stale' or 'gone' (as ack.lua).
Errors   PQ_BADARG (nothing written), WRONGTYPE (nothing written).
Replay   a re-sent call finds its receipts gone and changes nothing.
]]

local jobs_key, ready_key, leased_key, owners_key, counters_key, wake_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

local MAX_BATCH = 1000
local CHUNK = 500

local function expect_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'WRONGTYPE ' .. key .. ' holds a ' .. got .. ', expected a ' .. want
  end
end

local function call_chunked(cmd, key, values)
  for i = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
end

-- 1. Validate.
if #ARGV < 1 or #ARGV > MAX_BATCH then return redis.error_reply('PQ_BADARG 1..1000 receipts per call') end
local leases = {}
for i = 1, #ARGV do
  local id = string.match(ARGV[i], '^[%w_.:%-]+|[%w_.:%-]+|%d+|%d+|(.+)$')
  if not id then return redis.error_reply('PQ_BADARG malformed receipt ' .. string.format('%q', ARGV[i])) end
  leases[i] = { receipt = ARGV[i], id = id }
end

-- 2. Read.
local status, receipts, ids, releasing = {}, {}, {}, {}
for i, lease in ipairs(leases) do
  if not releasing[lease.receipt] and redis.call('ZSCORE', leased_key, lease.receipt) then
    releasing[lease.receipt] = true
    status[i] = 'ok'
    receipts[#receipts + 1] = lease.receipt
    ids[#ids + 1] = lease.id
  elseif releasing[lease.receipt] then
    status[i] = 'gone'
  else
    status[i] = redis.call('HEXISTS', jobs_key, lease.id) == 1 and 'stale' or 'gone'
  end
end

-- 3. Write.
if #receipts > 0 then
  local err = expect_type(owners_key, 'zset') or expect_type(ready_key, 'list') or expect_type(wake_key, 'zset')
    or expect_type(counters_key, 'hash')
  if err then return redis.error_reply(err) end
  -- The first write removes something: at its memory limit Redis refuses a script only at a
  -- first write that may grow memory, so this transition (which frees what it moves) still runs.
  call_chunked('ZREM', leased_key, receipts)
  call_chunked('ZREM', owners_key, receipts)
  redis.call('HINCRBY', counters_key, 'released', #receipts)
  local reversed = {}
  for i = #ids, 1, -1 do reversed[#reversed + 1] = ids[i] end
  call_chunked('LPUSH', ready_key, reversed)
  redis.call('ZADD', wake_key, 0, 'wake')
end
return status
