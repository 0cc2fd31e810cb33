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
Contract v2 (lua/README.md section 10): other counts of KEYS or ARGV than above answer
         PQ_CONTRACT, before anything is read or written.
]]

-- >>> pyqueue prelude: the same in every script; source tests/lua_prelude.lua, copied by tests/lua_prelude.py
-- Edit tests/lua_prelude.lua, then run `python tests/lua_prelude.py --write`; never edit a copy.
-- Every helper is in every script; an unused one is harmless and calls nothing.

local MAX_BATCH = 1000 -- per call at most this many jobs, receipts or ids; also the most count/limit
local CHUNK = 500 -- values per unpack(); keeps every redis.call well under Lua's C stack limit
local TRIM_BATCH = 10 -- expired tombstones are trimmed this many at a time, at least
local MAINTENANCE_INTERVAL_MS = 50 -- while READY is busy, maintenance still runs this often
local NONE = {} -- an empty list to read from; never written to, so no call allocates its own
local CONTRACT_VERSION = 2 -- of the KEYS and ARGV the headers list; lua/README.md section 10

-- Every script's first check, before any other check, read or write: a PQ_CONTRACT text
-- unless the call passes `nkeys` KEYS and lo..hi ARGV (with `step`: lo plus a multiple
-- of it), else nil. A client written for another contract version gets this answer,
-- never a Lua error, an error about some other argument, or a write.
local function contract(script, nkeys, lo, hi, step)
  local expected, got
  if #KEYS ~= nkeys then
    expected, got = nkeys .. (nkeys == 1 and ' key' or ' keys'), #KEYS
  elseif #ARGV < lo or #ARGV > hi or (#ARGV - lo) % (step or 1) ~= 0 then
    expected, got = lo .. (lo == 1 and ' argument' or ' arguments'), #ARGV
    if hi > lo then expected = lo .. '..' .. hi .. ' arguments' end
    if step then expected = expected .. ' in steps of ' .. step end
  else
    return nil
  end
  return string.format('PQ_CONTRACT %s expects %s (contract v%d), got %d', script, expected, CONTRACT_VERSION, got)
end

-- An integer argument in [lo, hi] ('^-?%d+$'), or nil and a PQ_BADARG text naming it.
local function int_arg(value, name, lo, hi)
  if type(value) ~= 'string' or not string.find(value, '^%-?%d+$') then
    return nil, 'PQ_BADARG ' .. name .. ' must be an integer, got ' .. string.format('%q', tostring(value))
  end
  local n = tonumber(value)
  if n < lo or n > hi then
    return nil, string.format('PQ_BADARG %s must be in [%d, %d], got %s', name, lo, hi, value)
  end
  return n
end

-- A PQ_BADARG text unless `value` (a string) is 1..64 bytes of [A-Za-z0-9_.:-]; else nil.
local function name_arg(value, name)
  if #value < 1 or #value > 64 or not string.find(value, '^[%w_.:%-]+$') then
    return 'PQ_BADARG ' .. name .. ' must be 1..64 bytes of [A-Za-z0-9_.:-]'
  end
end

-- A PQ_BADARG text unless `value` is a job id: 1..256 bytes without control characters.
local function id_arg(value)
  if type(value) ~= 'string' or #value < 1 or #value > 256 or string.find(value, '%c') then
    return 'PQ_BADARG id must be 1..256 bytes without control characters'
  end
end

-- ARGV now_ms: nil for '' (read the clock later, with server_now_ms), else as int_arg.
local function now_arg(value)
  if value == '' then return nil end
  return int_arg(value, 'now_ms', 0, 2 ^ 53)
end

-- The server clock in ms. One TIME call: call it only where the script needs the time.
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The id of a receipt "<owner>|<call>|<fence>|<attempt>|<id>", or nil if it does not parse.
-- The same rule as parse_receipt, without a table: acks need only the id.
local function receipt_id(receipt)
  return string.match(receipt, '^[%w_.:%-]+|[%w_.:%-]+|%d+|%d+|(.+)$')
end

-- "<owner>|<call>|<fence>|<attempt>|<id>" as {receipt, id, fence, attempt}, or nil.
local function parse_receipt(receipt)
  local owner, call, fence, attempt, id = string.match(receipt, '^([%w_.:%-]+)|([%w_.:%-]+)|(%d+)|(%d+)|(.+)$')
  if not owner then return nil end
  return { receipt = receipt, id = id, fence = tonumber(fence), attempt = tonumber(attempt) }
end

-- "<attempts>|<max_attempts>|<due_ms>|<payload>" as the 3 numbers and the payload's index, or nil.
local function parse_record(record)
  local attempts, max_attempts, due_ms, at = string.match(record, '^(%d+)|(%d+)|(%d+)|()')
  if not attempts then return nil end
  return tonumber(attempts), tonumber(max_attempts), tonumber(due_ms), at
end

-- A WRONGTYPE text if `key` exists with another type than `want`; else nil. One TYPE call.
local function expect_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'WRONGTYPE ' .. key .. ' holds a ' .. got .. ', expected a ' .. want
  end
end

-- redis.call(cmd, key, values...) in CHUNK-sized calls (none when `values` is empty).
local function call_chunked(cmd, key, values)
  for i = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
end

-- HMGET of any number of fields, in CHUNK-sized calls; no call for no fields.
local function hmget(key, fields)
  if #fields == 0 then return {} end
  if #fields <= CHUNK then return redis.call('HMGET', key, unpack(fields)) end
  local out = {}
  for i = 1, #fields, CHUNK do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
    for j = 1, #part do out[i + j - 1] = part[j] end
  end
  return out
end

-- Remove up to `most` of the `expired` tombstones of `key` (done), counted before any
-- write, once at least TRIM_BATCH have expired: the lowest ranks are the earliest
-- expiries. A removal is a write Redis allows at its memory limit, and after it the
-- script's other writes are allowed too (tests/test_operations.py pins this down).
local function trim_done(key, expired, most)
  if expired >= TRIM_BATCH then
    redis.call('ZREMRANGEBYRANK', key, 0, math.min(expired, most) - 1)
  end
end

-- Tombstone acked ids in `key` (done; ack.lua). Trim the `expired` lowest ranks first: ZADD may re-rank them.
local function bury(key, ids, expired, now_ms, keep_done_ms)
  trim_done(key, expired, #ids + TRIM_BATCH)
  local kept_until = now_ms + keep_done_ms
  if keep_done_ms == 0 then
    return
  elseif #ids == 1 then
    redis.call('ZADD', key, kept_until, ids[1])
  else
    local args = {}
    for i, id in ipairs(ids) do args[2 * i - 1], args[2 * i] = kept_until, id end
    call_chunked('ZADD', key, args)
  end
end
-- The current lease of job `id`: a ZSCAN of `key` (leased) for receipts ending in
-- '|<id>'. MATCH narrows the scan (the id's glob characters escaped); the exact parse
-- decides, since another id may end with this one after a '|'. Goes on from `cursor`
-- ('0' to start) for at most `max_pages` pages of 1000: callers pass a constant, so the
-- work is bounded. Returns the receipt and its deadline (nil if not found), and the
-- cursor to go on from ('0': LEASED was scanned to its end).
local function find_lease(key, id, cursor, max_pages)
  local pattern = '*|' .. string.gsub(id, '([%*%?%[%]\\])', '\\%1')
  local pages = 0
  repeat
    pages = pages + 1
    local page = redis.call('ZSCAN', key, cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = page[1]
    local entries = page[2]
    for i = 1, #entries, 2 do
      if receipt_id(entries[i]) == id then return entries[i], tonumber(entries[i + 1]), cursor end
    end
  until cursor == '0' or pages == max_pages
  return nil, nil, cursor
end
-- <<< pyqueue prelude

local jobs_key, ready_key, dead_key, errors_key, counters_key, wake_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local contract_error = contract('dead_replay', 6, 2, 1 + MAX_BATCH)
if contract_error then return redis.error_reply(contract_error) end

-- 1. Validate.
local now_ms, err = now_arg(ARGV[1])
if err then return redis.error_reply(err) end
if #ARGV < 2 or #ARGV > 1 + MAX_BATCH then return redis.error_reply('PQ_BADARG 1..1000 ids per call') end
now_ms = now_ms or server_now_ms()

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
  local records = hmget(jobs_key, ids)
  for i, id in ipairs(ids) do
    local _, max_attempts, _, payload_at = parse_record(records[i] or '')
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
