--[[ scrub: end every lease a dead service holds in this queue, at once, without
waiting for deadlines. Each job goes to the head of READY with the attempt counted, or
to DEAD once attempts reach max_attempts (a job that kills its worker every time ends
there). Leases are found through the `owners` index (receipts sort by owner), so no
scan; at most `limit` per call. Safe to run concurrently and twice: a lease ends once.

KEYS (8), all <prefix>:{<queue>}:<role>
  1 jobs       hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
  2 ready      list  job ids, head = next to lease
  3 leased     zset  receipt -> deadline_ms
  4 owners     zset  receipt -> 0
  5 dead       zset  id -> dead_ms
  6 errors     hash  id -> last error text of a dead job
  7 counters   hash  counter name -> integer ('scrubbed', 'dead')
  8 wake       zset  the single member "wake" while workers should wake up

ARGV (3)
  1  now_ms   '' (use the server clock) or integer >= 0; tests only
  2  owner    the dead service's lease owner, 1..64 bytes of [A-Za-z0-9_.:-]
  3  limit    integer 1..1000

Returns  {scrubbed, dead, more}: leases ended, of which jobs sent to DEAD, and 1 if
         the limit was reached (call again).
Errors   PQ_BADARG, PQ_CORRUPT, WRONGTYPE (nothing written on any error).
]]

local jobs_key, ready_key, leased_key, owners_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dead_key, errors_key, counters_key, wake_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]

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
local now_ms
if ARGV[1] ~= '' then
  if not string.match(ARGV[1] or '', '^%d+$') then return redis.error_reply('PQ_BADARG now_ms must be an integer >= 0') end
  now_ms = tonumber(ARGV[1])
end
local owner = ARGV[2] or ''
if #owner < 1 or #owner > 64 or not string.match(owner, '^[%w_.:%-]+$') then
  return redis.error_reply('PQ_BADARG owner must be 1..64 bytes of [A-Za-z0-9_.:-]')
end
if not string.match(ARGV[3] or '', '^%d+$') or tonumber(ARGV[3]) < 1 or tonumber(ARGV[3]) > 1000 then
  return redis.error_reply('PQ_BADARG limit must be an integer in [1, 1000]')
end
local limit = tonumber(ARGV[3])
if now_ms == nil then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 2. Read.
local receipts = redis.call('ZRANGEBYLEX', owners_key, '[' .. owner .. '|', '(' .. owner .. '}', 'LIMIT', 0, limit)
if #receipts == 0 then return { 0, 0, 0 } end
local leases, ids = {}, {}
for i, receipt in ipairs(receipts) do
  local attempt, id = string.match(receipt, '^[%w_.:%-]+|[%w_.:%-]+|%d+|(%d+)|(.+)$')
  if not attempt then return redis.error_reply('PQ_CORRUPT malformed receipt in ' .. owners_key) end
  leases[i] = { receipt = receipt, id = id, attempt = tonumber(attempt) }
  ids[i] = id
end
local records = redis.call('HMGET', jobs_key, unpack(ids))
local to_ready, to_dead, rewritten = {}, {}, {}
for i, lease in ipairs(leases) do
  local record = records[i]
  if record then
    local max_attempts, payload_at = string.match(record, '^%d+|(%d+)|%d+|()')
    if not max_attempts then return redis.error_reply('PQ_CORRUPT unparsable record in ' .. jobs_key) end
    lease.max = tonumber(max_attempts)
    rewritten[#rewritten + 1] = lease.id
    rewritten[#rewritten + 1] = string.format('%d|%d|%d|', lease.attempt, lease.max, now_ms) .. string.sub(record, payload_at)
    if lease.attempt >= lease.max then to_dead[#to_dead + 1] = lease else to_ready[#to_ready + 1] = lease end
  end
end
local err = expect_type(ready_key, 'list') or expect_type(leased_key, 'zset') or expect_type(wake_key, 'zset')
  or expect_type(counters_key, 'hash')
if not err and #to_dead > 0 then err = expect_type(dead_key, 'zset') or expect_type(errors_key, 'hash') end
if err then return redis.error_reply(err) end

-- 3. Write.
-- The first write removes something: at its memory limit Redis refuses a script only at a
-- first write that may grow memory, so this transition (which frees what it moves) still runs.
call_chunked('ZREM', leased_key, receipts)
call_chunked('ZREM', owners_key, receipts)
redis.call('HINCRBY', counters_key, 'scrubbed', #receipts)
if #rewritten > 0 then call_chunked('HSET', jobs_key, rewritten) end
if #to_ready > 0 then
  local reversed = {}
  for i = #to_ready, 1, -1 do reversed[#reversed + 1] = to_ready[i].id end
  call_chunked('LPUSH', ready_key, reversed)
  redis.call('ZADD', wake_key, 0, 'wake')
end
if #to_dead > 0 then
  local dead_args, error_args = {}, {}
  for _, lease in ipairs(to_dead) do
    dead_args[#dead_args + 1] = now_ms
    dead_args[#dead_args + 1] = lease.id
    error_args[#error_args + 1] = lease.id
    error_args[#error_args + 1] = string.format('worker %s died on attempt %d of %d', owner, lease.attempt, lease.max)
  end
  redis.call('HINCRBY', counters_key, 'dead', #to_dead)
  call_chunked('ZADD', dead_key, dead_args)
  call_chunked('HSET', errors_key, error_args)
end
return { #receipts, #to_dead, #receipts == limit and 1 or 0 }
