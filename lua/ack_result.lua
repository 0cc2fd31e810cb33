--[[ ack_result: ack current leases (as ack.lua does) and keep each job's result.

For each receipt still current: the job is acked exactly as ack.lua acks it (the lease
ends, the record is deleted, the id is tombstoned for keep_done_ms), and in the same
call its result is stored for result_ttl_ms: `results` id -> "<finished_ms>|<value>",
`result_expiry` id -> the ms it expires at, and the id is appended to the `finished`
stream (at most 1000 entries), which wait_result readers block on (XREAD BLOCK).
Memory is bounded: each call first deletes up to n + 10 results whose time is up, and
the oldest-expiring results beyond max_results, so at most max_results results are
kept, each at most 524288 bytes.

KEYS (7), all <prefix>:{<queue>}:<role>
  1 jobs           hash    id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
  2 leased         zset    receipt -> deadline_ms
  3 owners         zset    receipt -> 0
  4 done           zset    id -> ms until which an acked id stays a duplicate
  5 results        hash    id -> "<finished_ms>|<value>"
  6 result_expiry  zset    id -> ms at which its result is deleted
  7 finished       stream  one entry {id = <job id>} per result stored

ARGV (4 + 2n)
  1  now_ms          '' (use the server clock) or integer >= 0; tests only
  2  keep_done_ms    integer 0..2^40 (as ack.lua)
  3  result_ttl_ms   integer 1..2^40: how long the results of this call are kept
  4  max_results     integer 1..10000000: most results the queue keeps
  5.. receipt, value pairs: 1..1000 receipts from lease, each with its result (0..524288
     bytes, opaque to the script; pyqueue's encoding: lua/README.md section 4)

Returns  {status_1 .. status_n} as ack.lua: 'ok' (acked, result stored), 'stale' or
         'gone' (nothing written for it).
Errors   PQ_BADARG, WRONGTYPE (nothing written).
Replay   a re-sent call finds its receipts gone and writes nothing more: one effect.
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

local jobs_key, leased_key, owners_key, done_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local results_key, result_expiry_key, finished_key = KEYS[5], KEYS[6], KEYS[7]
local contract_error = contract('ack_result', 7, 6, 4 + 2 * MAX_BATCH, 2)
if contract_error then return redis.error_reply(contract_error) end
local MAX_RESULT_BYTES, STREAM_LENGTH = 524288, 1000

-- 1. Validate.
local now_ms, keep_done_ms, ttl_ms, max_results, err
now_ms, err = now_arg(ARGV[1])
if err then return redis.error_reply(err) end
keep_done_ms, err = int_arg(ARGV[2], 'keep_done_ms', 0, 2 ^ 40)
if err then return redis.error_reply(err) end
ttl_ms, err = int_arg(ARGV[3], 'result_ttl_ms', 1, 2 ^ 40)
if err then return redis.error_reply(err) end
max_results, err = int_arg(ARGV[4], 'max_results', 1, 10000000)
if err then return redis.error_reply(err) end
local n = (#ARGV - 4) / 2
if n < 1 or n > MAX_BATCH or n ~= math.floor(n) then
  return redis.error_reply('PQ_BADARG 1..1000 receipt, value pairs per call')
end
local ids = {}
for i = 1, n do
  local receipt, value = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  ids[i] = receipt_id(receipt)
  if not ids[i] then return redis.error_reply('PQ_BADARG malformed receipt ' .. string.format('%q', receipt)) end
  if #value > MAX_RESULT_BYTES then
    return redis.error_reply('PQ_BADARG a result may hold at most ' .. MAX_RESULT_BYTES .. ' bytes')
  end
end

-- 2. Read. A receipt still in `leased` is the job's current lease.
local status, receipts, acked_ids, stored = {}, {}, {}, {}
local acking = {} -- a receipt repeated in this call is acked once
local jobs_read = false
for i = 1, n do
  local receipt = ARGV[3 + 2 * i]
  if acking[receipt] then
    status[i] = 'gone'
  elseif redis.call('ZSCORE', leased_key, receipt) then
    acking[receipt] = true
    status[i] = 'ok'
    receipts[#receipts + 1], acked_ids[#acked_ids + 1] = receipt, ids[i]
    stored[#stored + 1] = { ids[i], ARGV[4 + 2 * i] }
  else
    jobs_read = true
    status[i] = redis.call('HEXISTS', jobs_key, ids[i]) == 1 and 'stale' or 'gone'
  end
end
if #receipts == 0 then return status end

-- 3. Prove the types of the keys written but not read, and choose what to trim: up to
-- n + 10 results whose time is up, then the oldest-expiring beyond max_results.
now_ms = now_ms or server_now_ms()
err = (not jobs_read and expect_type(jobs_key, 'hash')) or expect_type(results_key, 'hash')
  or expect_type(finished_key, 'stream')
if err then return redis.error_reply(err) end
local expired = redis.call('ZCOUNT', done_key, '-inf', now_ms)
local trim = redis.call('ZRANGEBYSCORE', result_expiry_key, '-inf', now_ms, 'LIMIT', 0, n + TRIM_BATCH)
local over = redis.call('ZCARD', result_expiry_key) - #trim + #stored - max_results
if over > 0 then
  -- The oldest-expiring after the expired ones (ranks #trim ..), at most n + 10 more.
  local oldest = redis.call('ZRANGE', result_expiry_key, #trim, #trim + math.min(over, n + TRIM_BATCH) - 1)
  for _, id in ipairs(oldest) do trim[#trim + 1] = id end
end

-- 4. Write: the acks (ZREM on `owners` first, as ack.lua), then the results.
call_chunked('ZREM', owners_key, receipts)
call_chunked('ZREM', leased_key, receipts)
call_chunked('HDEL', jobs_key, acked_ids)
bury(done_key, acked_ids, expired, now_ms, keep_done_ms)
if #trim > 0 then
  call_chunked('HDEL', results_key, trim)
  call_chunked('ZREM', result_expiry_key, trim)
end
local fields, expiries = {}, {}
for _, pair in ipairs(stored) do
  fields[#fields + 1], fields[#fields + 2] = pair[1], now_ms .. '|' .. pair[2]
  expiries[#expiries + 1], expiries[#expiries + 2] = now_ms + ttl_ms, pair[1]
  redis.call('XADD', finished_key, 'MAXLEN', STREAM_LENGTH, '*', 'id', pair[1])
end
call_chunked('HSET', results_key, fields)
call_chunked('ZADD', result_expiry_key, expiries)
return status
