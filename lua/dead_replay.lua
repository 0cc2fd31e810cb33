--[[ dead_replay: move DEAD jobs back to the tail of READY with their attempts reset to 0.

Only the given ids move; ids not in DEAD are skipped. (To replay "the oldest N", list
them with dead_list first: naming the ids is what makes a re-sent call harmless.)

KEYS (6), all <prefix>:{<queue>}:<role>
  1 jobs      hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
  2 ready     list  job ids
  3 dead      zset  id -> dead_ms
  4 errors    hash  id -> last error text
  5 counters  hash  counter name -> integer ('replayed')
  6 wake      zset  the single member "wake" while workers should wake up

ARGV (1 + k)
  1  now_ms   '' (use the server clock) or integer >= 0; tests only
  2.. ids     1..1000 job ids

Returns  {replayed, remaining}: jobs moved, and jobs left in DEAD.
Errors   PQ_BADARG, PQ_CORRUPT, WRONGTYPE (nothing written on any error).
Replay   a re-sent call finds the ids no longer dead and moves nothing.
]]

local jobs_key, ready_key, dead_key, errors_key, counters_key, wake_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

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

local CHUNK = 500 -- values per unpack(); keeps every redis.call well under Lua's C stack limit

local function call_chunked(cmd, key, values)
  for i = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
end

local function expect_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'WRONGTYPE ' .. key .. ' holds a ' .. got .. ', expected a ' .. want
  end
end

-- 1. Validate.
local now_ms, err
if ARGV[1] ~= '' then
  now_ms, err = int_arg(ARGV[1], 'now_ms', 0, 2 ^ 53)
  if err then return redis.error_reply(err) end
end
if #ARGV < 2 or #ARGV > 1001 then return redis.error_reply('PQ_BADARG 1..1000 ids per call') end
if now_ms == nil then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 2. Read.
local ids, seen = {}, {}
for i = 2, #ARGV do
  if not seen[ARGV[i]] and redis.call('ZSCORE', dead_key, ARGV[i]) then ids[#ids + 1] = ARGV[i] end
  seen[ARGV[i]] = true
end
local rewritten = {}
-- Read the count before writing: nothing may fail after the first write.
local remaining = redis.call('ZCARD', dead_key) - #ids
if #ids > 0 then
  local records = {}
  for i = 1, #ids, CHUNK do
    local part = redis.call('HMGET', jobs_key, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
    for j = 1, #part do records[i + j - 1] = part[j] end
  end
  for i, id in ipairs(ids) do
    local max_attempts, payload_at = string.match(records[i] or '', '^%d+|(%d+)|%d+|()')
    if not max_attempts then return redis.error_reply('PQ_CORRUPT no valid record for dead job in ' .. jobs_key) end
    rewritten[#rewritten + 1] = id
    rewritten[#rewritten + 1] = string.format('0|%d|%d|', max_attempts, now_ms) .. string.sub(records[i], payload_at)
  end
  err = expect_type(ready_key, 'list') or expect_type(errors_key, 'hash') or expect_type(wake_key, 'zset')
    or expect_type(counters_key, 'hash')
  if err then return redis.error_reply(err) end

  -- 3. Write.
  -- The first write removes something: at its memory limit Redis refuses a script only at a
  -- first write that may grow memory, so this transition (which frees what it moves) still runs.
  call_chunked('ZREM', dead_key, ids)
  redis.call('HINCRBY', counters_key, 'replayed', #ids)
  call_chunked('HDEL', errors_key, ids)
  call_chunked('HSET', jobs_key, rewritten)
  call_chunked('RPUSH', ready_key, ids)
  redis.call('ZADD', wake_key, 0, 'wake')
end
return { #ids, remaining }
