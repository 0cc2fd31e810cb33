--[[ dead_purge: delete DEAD jobs for good.

Only the given ids are deleted; ids not in DEAD are skipped. (To purge "the oldest N",
list them with dead_list first: naming the ids is what makes a re-sent call harmless.)

KEYS (4), all <prefix>:{<queue>}:<role>
  1 jobs      hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
  2 dead      zset  id -> dead_ms
  3 errors    hash  id -> last error text
  4 counters  hash  counter name -> integer ('purged')

ARGV (k)
  1.. ids     1..1000 job ids

Returns  {purged, remaining}: jobs deleted, and jobs left in DEAD.
Errors   PQ_BADARG, WRONGTYPE (nothing written on any error).
Replay   a re-sent call finds the ids gone and deletes nothing.
]]

local jobs_key, dead_key, errors_key, counters_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

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
if #ARGV < 1 or #ARGV > 1000 then return redis.error_reply('PQ_BADARG 1..1000 ids per call') end

-- 2. Read.
local ids, seen = {}, {}
for i = 1, #ARGV do
  if not seen[ARGV[i]] and redis.call('ZSCORE', dead_key, ARGV[i]) then ids[#ids + 1] = ARGV[i] end
  seen[ARGV[i]] = true
end
-- Read the count before writing: nothing may fail after the first write.
local remaining = redis.call('ZCARD', dead_key) - #ids
if #ids > 0 then
  local err = expect_type(jobs_key, 'hash') or expect_type(errors_key, 'hash') or expect_type(counters_key, 'hash')
  if err then return redis.error_reply(err) end

  -- 3. Write.
  -- The first write removes something: at its memory limit Redis refuses a script only at a
  -- first write that may grow memory, so this transition (which frees what it moves) still runs.
  call_chunked('ZREM', dead_key, ids)
  redis.call('HINCRBY', counters_key, 'purged', #ids)
  call_chunked('HDEL', errors_key, ids)
  call_chunked('HDEL', jobs_key, ids)
end
return { #ids, remaining }
