--[[ ack_result: ack current leases (as ack.lua does) and keep each job's result.

For each receipt still current: the job is acked exactly as ack.lua acks it (the lease
ends, the record is deleted, the id is tombstoned for keep_done_ms), and in the same
call its result is stored for result_ttl_ms: `results` id -> "<finished_ms>|<value>",
`result_expiry` id -> the ms it expires at, and the id is appended to the `finished`
stream (at most 1000 entries), which wait_result readers block on (XREAD BLOCK).
Memory is bounded: each call first deletes up to n + 10 results whose time is up, and
the oldest-expiring results beyond max_results, so at most max_results results are
kept, each at most 524288 bytes. A queue with a results budget (set_result_budget.lua;
`counters` has `result_budget`) also keeps the size of each result it stores, "rb:<id>"
in `keyed`, and their sum, `result_bytes` in `counters`; a call that would take the sum
past the budget deletes up to n + 10 more of the oldest-expiring results first (a
result stored while the queue had no budget has no size: it is deleted in its turn,
and counts for nothing).

KEYS (20), all <prefix>:{<queue>}:<role>
  1 jobs           hash    id -> "<attempts>|<max_attempts>|<due_ms>:<enqueued_ms>|<payload>"
  2 leased         zset    receipt -> deadline_ms
  3 owners         zset    receipt -> 0
  4 done           zset    id -> ms until which an acked id stays a duplicate
  5 results        hash    id -> "<finished_ms>|<value>"
  6 result_expiry  zset    id -> ms at which its result is deleted
  7 finished       stream  one entry {id = <job id>} per result stored
  8 wake           zset    the single member "wake" while workers should wake up
  9 meta           hash    id -> "<priority>|<pos>|<group>" of jobs with a group or a priority
 10 gready         zset    "<group>|<rank>|<id>" -> 0: READY jobs with meta (lexicographic)
 11 ring           zset    group -> turn (>= 1) or -1 (parked at its cap)
 12 groups         hash    r:<group>, c:<group>, cap, turn, seq, uturn
 13 counters       hash    read: `events`, the event stream's bound (section 2.5), `fair`, `steps`,
                           `sequences`, `result_budget`, `rsized`; written only under a results
                           budget: `result_bytes` (and `rsized`, once)
 14 events         stream  the queue's events, when it has opted in: 'acked' per job acked
 15 steps          hash    the jobs' step data (section 2.6): an acked job's is deleted,
                           when the queue has any (counters `steps`)
 16 waiting        zset    id -> until_ms, the jobs parked for a signal: an acked job leaves it
 17 scheduled      zset    id -> due_ms: where an acked head's next job goes (section 2.7)
 18 keyed          hash    the sequences' heads and entries (section 2.7), when the queue
                           has any (counters `sequences`): an acked head hands its key on;
                           "rb:<id>" -> the size of each result stored under a results budget
 19 sequenced      zset    "<key>\n<seq>\n<id>" -> 0: the jobs waiting behind their head
 20 index          zset    "<kind>\n<value>\n<enqueued_ms>\n<id>" -> 0: the indexes (set_indexes.lua): an
                   ended job's members go, when the queue has any (counters `indexed`)

ARGV (4 + 2n)
  1  now_ms          '' (use the server clock) or integer >= 0; tests only
  2  keep_done_ms    integer 0..2^40 (as ack.lua)
  3  result_ttl_ms   integer 1..2^40: how long the results of this call are kept
  4  max_results     integer 1..10000000: most results the queue keeps
  5.. receipt, value pairs: 1..1000 receipts from lease, each with its result (0..524288
     bytes, opaque to the script; pyqueue's encoding: lua/README.md section 4)

Returns  {status_1 .. status_n} as ack.lua: 'ok' (acked, result stored), 'stale' or
         'gone' (nothing written for it).
Cost     plain case (one current receipt, no expired result): 16 commands; in a queue with
         sequences, rate keys, sizes or indexed jobs +1, +12 when an acked head hands its
         key on, +1 when an acked job has a rate entry, a size or an index entry, +1 more
         for a size, +2 more for an index entry; under a results budget +3 (+1 in the call
         that first sizes a result), +5 more when it deletes results to stay within it;
         once the budget is lifted +2; with a tombstone limit (set_tombstone_limit.lua)
         +1, +1 more when past it
Errors   PQ_BADARG, PQ_CORRUPT (a job's `meta` or sequence entry, or a result's size or
         `result_bytes`, does not parse), WRONGTYPE (nothing written).
Replay   a re-sent call finds its receipts gone and writes nothing more: one effect.
Groups   as ack.lua: an acked job's group gets its slot back (section 2.1).
Contract v6 (lua/README.md section 10): other counts of KEYS or ARGV than above answer
         PQ_CONTRACT, before anything is read or written.
]]

local jobs_key, leased_key, owners_key, done_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local results_key, result_expiry_key, finished_key, wake_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local counters_key, events_key, steps_key, waiting_key = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local scheduled_key, keyed_key, sequenced_key = KEYS[17], KEYS[18], KEYS[19]

-- >>> pyqueue includes: generated by `python lua/build.py`; do not edit
-- lua/include/validate.lua (each helper's note is there)
local MAX_BATCH = 1000
local NONE = {}
local CONTRACT_VERSION = 6
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
local function now_arg(value)
  if value == '' then return nil end
  return int_arg(value, 'now_ms', 0, 2 ^ 53)
end
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function expect_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'WRONGTYPE ' .. key .. ' holds a ' .. got .. ', expected a ' .. want
  end
end
-- lua/include/calls.lua (each helper's note is there)
local CHUNK = 500
local function call_chunked(cmd, key, values)
  for i = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
end
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
-- lua/include/records.lua (each helper's note is there)
local function receipt_id(receipt)
  return string.match(receipt, '^[%w_.:%-]+|[%w_.:%-]+|%d+|%d+|(.+)$')
end
local function parse_receipt(receipt)
  local owner, call, fence, attempt, id = string.match(receipt, '^([%w_.:%-]+)|([%w_.:%-]+)|(%d+)|(%d+)|(.+)$')
  if not owner then return nil end
  return { receipt = receipt, id = id, fence = tonumber(fence), attempt = tonumber(attempt) }
end
-- lua/include/tombstones.lua (each helper's note is there)
local TRIM_BATCH = 10
local function trim_done(key, expired, most)
  if expired >= TRIM_BATCH then
    redis.call('ZREMRANGEBYRANK', key, 0, math.min(expired, most) - 1)
  end
end
local function bury(key, ids, expired, now_ms, keep_done_ms, most)
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
  if most then
    local over = redis.call('ZCARD', key) - most
    if over > 0 then redis.call('ZREMRANGEBYRANK', key, 0, math.min(over, #ids + TRIM_BATCH) - 1) end
  end
end
-- lua/include/events.lua (each helper's note is there)
local function events_bound(counters_key, events_key, value)
  if value == nil then value = redis.call('HGET', counters_key, 'events') end
  local bound = value and tonumber(value)
  if not bound or bound < 1 then return nil end
  local err = expect_type(events_key, 'stream')
  if err then return nil, err end
  return bound
end
local function emit(events_key, bound, kind, id, now_ms, ...)
  if bound then
    redis.call('XADD', events_key, 'MAXLEN', bound, '0-*', 'type', kind, 'id', id, 'ms', string.format('%d', now_ms), ...)
  end
end
local function emit_acked(events_key, bound, receipts, ids, now_ms)
  if not bound then return end
  for i, receipt in ipairs(receipts) do
    emit(events_key, bound, 'acked', ids[i], now_ms, 'attempt', parse_receipt(receipt).attempt)
  end
end
-- lua/include/steps.lua (each helper's note is there)
local function steps_of(steps_key, waiting_key, ids)
  local indexes = hmget(steps_key, ids)
  local fields, stepped = {}, {}
  for i = 1, #ids do
    if indexes[i] then
      stepped[#stepped + 1] = ids[i]
      fields[#fields + 1] = ids[i]
      for entry in string.gmatch(indexes[i], '[^\n]+') do fields[#fields + 1] = ids[i] .. '\n' .. entry end
    end
  end
  if #stepped > 0 then
    local err = expect_type(waiting_key, 'zset')
    if err then return nil, nil, err end
  end
  return fields, stepped
end
local function forget_steps(steps_key, waiting_key, forgot)
  if not forgot or #forgot[2] == 0 then return end
  call_chunked('HDEL', steps_key, forgot[1])
  call_chunked('ZREM', waiting_key, forgot[2])
end
-- lua/include/control.lua (each helper's note is there)
local function index_members(id, entry, out)
  local enqueued_ms, group, task = string.match(entry, '^(%d+)\n([^\n]*)\n(.*)$')
  if not enqueued_ms then return nil end
  local at = string.format('%015d', tonumber(enqueued_ms))
  if task ~= '' then out[#out + 1] = 't\n' .. task .. '\n' .. at .. '\n' .. id end
  if group ~= '' then out[#out + 1] = 'g\n' .. group .. '\n' .. at .. '\n' .. id end
  return out
end
local function keyed_read(K, ids)
  if #ids == 0 then return NONE end
  local fields = {}
  for i, id in ipairs(ids) do
    fields[4 * i - 3], fields[4 * i - 2], fields[4 * i - 1], fields[4 * i] = 'j:' .. id, 'r:' .. id, 'b:' .. id,
      'x:' .. id
  end
  local values = hmget(K.keyed, fields)
  local out, sequenced, indexed = NONE, false, false
  for i, id in ipairs(ids) do
    local entry, bytes, index = values[4 * i - 3], tonumber(values[4 * i - 1] or '0'), values[4 * i]
    if not bytes then return nil, 'PQ_CORRUPT unparsable job size in ' .. K.keyed end
    if entry or values[4 * i - 2] or bytes > 0 or index then
      local e = { id = id, bytes = bytes, index = index }
      if entry then
        e.seq, e.policy, e.key = string.match(entry, '^(%d+)|%d+|([bs])|(.+)$')
        if not e.seq then return nil, 'PQ_CORRUPT unparsable sequence entry in ' .. K.keyed end
        sequenced = true
      end
      if index then
        if not index_members(id, index, {}) then return nil, 'PQ_CORRUPT unparsable index entry in ' .. K.keyed end
        indexed = true
      end
      if out == NONE then out = {} end
      out[#out + 1] = e
    end
  end
  local err = sequenced and (expect_type(K.sequenced, 'zset') or expect_type(K.scheduled, 'zset')
    or expect_type(K.wake, 'zset')) or indexed and K.index and expect_type(K.index, 'zset') or nil
  if err then return nil, err end
  return out
end
local function keyed_end(K, ended)
  local plans, handed = {}, {}
  for i, e in ipairs(ended) do
    local p = { head = e.seq ~= nil and redis.call('HGET', K.keyed, 's:' .. e.key) == e.id }
    if p.head then
      p.next = redis.call('ZRANGEBYLEX', K.sequenced, '[' .. e.key .. '\n', '(' .. e.key .. '\011', 'LIMIT', 0, 1)[1]
      if p.next then
        p.id = string.sub(p.next, #e.key + 19)
        p.due = tonumber(string.match(redis.call('HGET', K.keyed, 'j:' .. p.id) or '', '^%d+|(%d+)|') or '0')
      end
    end
    plans[i] = p
  end
  -- The jobs' own fields, deleted together (a field a job has not is no matter to HDEL).
  local gone, bytes, unindexed = {}, 0, NONE
  for i, e in ipairs(ended) do
    local p = plans[i]
    gone[#gone + 1] = 'j:' .. e.id
    if not e.kept then
      gone[#gone + 1], gone[#gone + 2], gone[#gone + 3] = 'r:' .. e.id, 'b:' .. e.id, 'x:' .. e.id
      bytes = bytes + e.bytes
      if e.index then unindexed = index_members(e.id, e.index, unindexed == NONE and {} or unindexed) end
    end
    if p.next then
      redis.call('ZREM', K.sequenced, p.next)
      redis.call('HSET', K.keyed, 's:' .. e.key, p.id)
      redis.call('ZADD', K.scheduled, p.due, p.id)
      handed[#handed + 1] = p.id
    elseif p.head then
      redis.call('HDEL', K.keyed, 's:' .. e.key)
    elseif e.seq then
      redis.call('ZREM', K.sequenced, e.key .. '\n' .. e.seq .. '\n' .. e.id)
    end
  end
  call_chunked('HDEL', K.keyed, gone)
  if unindexed ~= NONE then call_chunked('ZREM', K.index, unindexed) end
  if bytes > 0 then redis.call('HINCRBY', K.counters, 'bytes', -bytes) end
  if #handed > 0 then redis.call('ZADD', K.wake, 0, 'wake') end
  return handed
end
-- lua/include/groups.lua (each helper's note is there)
local function fair_keys(first)
  return { meta = KEYS[first], gready = KEYS[first + 1], ring = KEYS[first + 2], groups = KEYS[first + 3] }
end
local function fair_meta(F, ids)
  local out, any = {}, false
  if #ids == 0 then return out, nil, false end
  local values = hmget(F.meta, ids)
  for i = 1, #ids do
    local value = values[i]
    if value then
      local p, pos, g = string.match(value, '^(%-?%d+)|(%d*)|(.*)$')
      if not p then return nil, 'PQ_CORRUPT unparsable entry in ' .. F.meta end
      out[i], any = { priority = tonumber(p), pos = pos, group = g }, true
    else
      out[i] = false
    end
  end
  return out, nil, any
end
local function fair_slots(F, group)
  local v = redis.call('HMGET', F.groups, 'r:' .. group, 'c:' .. group, 'cap')
  return tonumber(v[1] or '0') or 0, tonumber(v[2] or v[3] or '0') or 0
end
local function fair_types(F)
  return expect_type(F.meta, 'hash') or expect_type(F.gready, 'zset') or expect_type(F.ring, 'zset')
    or expect_type(F.groups, 'hash')
end
local function fair_release(F, metas)
  local counts, order = {}, {}
  for _, meta in ipairs(metas) do
    if meta and meta.group ~= '' then
      local g = meta.group
      if not counts[g] then
        counts[g] = 0
        order[#order + 1] = g
      end
      counts[g] = counts[g] + 1
    end
  end
  local woke = false
  for _, g in ipairs(order) do
    local running = redis.call('HINCRBY', F.groups, 'r:' .. g, -counts[g])
    local score = redis.call('ZSCORE', F.ring, g)
    -- At 0 the count goes, unless the group is in the ring: a lease is likely to count
    -- it up again soon, and lease deletes it when it drops the group from the ring.
    if running <= 0 and not score then redis.call('HDEL', F.groups, 'r:' .. g) end
    if tonumber(score or '0') < 0 then
      local _, cap = fair_slots(F, g)
      if cap == 0 or running < cap then
        redis.call('ZADD', F.ring, redis.call('HINCRBY', F.groups, 'turn', 1), g)
        woke = true
      end
    end
  end
  return woke
end
local function fair_finish(F, ids, metas, wake_key)
  local gone = {}
  for i, meta in ipairs(metas) do
    if meta then gone[#gone + 1] = ids[i] end
  end
  if #gone == 0 then return end
  call_chunked('HDEL', F.meta, gone)
  if fair_release(F, metas) then redis.call('ZADD', wake_key, 0, 'wake') end
end
-- lua/include/acks.lua (each helper's note is there)
local function write_acked(K, F, receipts, ids, fair, metas, expired, now_ms, keep_done_ms, bound, forgot, ended)
  call_chunked('ZREM', K.owners, receipts)
  call_chunked('ZREM', K.leased, receipts)
  call_chunked('HDEL', K.jobs, ids)
  bury(K.done, ids, expired, now_ms, keep_done_ms, K.done_most)
  if fair then fair_finish(F, ids, metas, K.wake) end
  forget_steps(K.steps, K.waiting, forgot)
  if #ended > 0 then keyed_end(K, ended) end
  emit_acked(K.events, bound, receipts, ids, now_ms)
end
local function ack_settings(counters_key, events_key, F, ids, K)
  local settings = redis.call('HMGET', counters_key, 'fair', 'events', 'steps', 'sequences', 'rates', 'sized',
    'indexed', 'result_budget', 'result_bytes', 'rsized', 'done_max')
  K.done_most = tonumber(settings[11] or '')
  local bound, err = events_bound(counters_key, events_key, settings[2])
  if err then return nil, nil, false, err end
  local forgot, ended = nil, NONE
  if settings[3] then
    forgot = {}
    forgot[1], forgot[2], err = steps_of(K.steps, K.waiting, ids)
    if err then return nil, nil, false, err end
  end
  if settings[4] or settings[5] or settings[6] or settings[7] then
    ended, err = keyed_read(K, ids)
    if err then return nil, nil, false, err end
  end
  if not settings[1] then return bound, NONE, false, nil, forgot, ended, settings end
  local metas, fair
  metas, err, fair = fair_meta(F, ids)
  return bound, metas, fair, err, forgot, ended, settings
end
-- <<< pyqueue includes

local contract_error = contract('ack_result', 20, 6, 4 + 2 * MAX_BATCH, 2)
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
-- The stream's bound and, in a fair queue, the acked jobs' meta (ack_settings).
local F = fair_keys(9)
local K = { jobs = jobs_key, leased = leased_key, owners = owners_key, done = done_key }
K.wake, K.events, K.steps, K.waiting = wake_key, events_key, steps_key, waiting_key
K.scheduled, K.keyed, K.sequenced, K.counters = scheduled_key, keyed_key, sequenced_key, counters_key
K.index = KEYS[20]
local bound, metas, fair, forgot, ended, settings
bound, metas, fair, err, forgot, ended, settings = ack_settings(counters_key, events_key, F, acked_ids, K)
err = err or (not jobs_read and expect_type(jobs_key, 'hash')) or expect_type(results_key, 'hash')
  or expect_type(finished_key, 'stream') or fair and (fair_types(F) or expect_type(wake_key, 'zset'))
if err then return redis.error_reply(err) end
local expired = redis.call('ZCOUNT', done_key, '-inf', now_ms)
local trim = redis.call('ZRANGEBYSCORE', result_expiry_key, '-inf', now_ms, 'LIMIT', 0, n + TRIM_BATCH)
local over = redis.call('ZCARD', result_expiry_key) - #trim + #stored - max_results
if over > 0 then
  -- The oldest-expiring after the expired ones (ranks #trim ..), at most n + 10 more.
  local oldest = redis.call('ZRANGE', result_expiry_key, #trim, #trim + math.min(over, n + TRIM_BATCH) - 1)
  for _, id in ipairs(oldest) do trim[#trim + 1] = id end
end
-- A results budget: the sizes of the results trimmed and of those stored again (the same
-- id: its old result is replaced), one read; then, past the budget, more of the oldest.
local R = NONE
if settings[8] or settings[10] then
  R = { budget = tonumber(settings[8] or ''), used = tonumber(settings[9] or '0'), gone = {}, sizes = {} }
  local fields, trimmed = {}, {}
  for k, id in ipairs(trim) do fields[k], trimmed[id] = 'rb:' .. id, true end
  for _, pair in ipairs(stored) do fields[#fields + 1] = 'rb:' .. pair[1] end
  local olds = hmget(keyed_key, fields)
  for k, field in ipairs(fields) do
    local size = olds[k] and tonumber(olds[k])
    if olds[k] and not size or not R.used then
      return redis.error_reply('PQ_CORRUPT unparsable result size in ' .. keyed_key .. ' or ' .. counters_key)
    end
    -- (a stored id whose old result is trimmed too is counted once)
    if size and (k <= #trim or not trimmed[string.sub(field, 4)]) then
      R.used, R.gone[#R.gone + 1] = R.used - size, field
    end
  end
  if R.budget then
    for _, pair in ipairs(stored) do
      local size = #string.format('%d|', now_ms) + #pair[2]
      R.sizes[#R.sizes + 1], R.sizes[#R.sizes + 2] = 'rb:' .. pair[1], size
      R.used = R.used + size
    end
    if R.used > R.budget then
      local storing = {}
      for _, pair in ipairs(stored) do storing[pair[1]] = true end
      local oldest = redis.call('ZRANGE', result_expiry_key, #trim, #trim + n + TRIM_BATCH - 1)
      local more = {}
      for _, id in ipairs(oldest) do
        if not storing[id] then more[#more + 1] = id end
      end
      for k, id in ipairs(more) do more[k] = 'rb:' .. id end
      local sizes = hmget(keyed_key, more)
      for k, field in ipairs(more) do
        if R.used <= R.budget then break end
        local size = sizes[k] and tonumber(sizes[k])
        if sizes[k] and not size then
          return redis.error_reply('PQ_CORRUPT unparsable result size in ' .. keyed_key .. ' or ' .. counters_key)
        end
        trim[#trim + 1] = string.sub(field, 4)
        if size then R.used, R.gone[#R.gone + 1] = R.used - size, field end
      end
    end
  end
end

-- 4. Write: the acks (ZREM on `owners` first, as ack.lua), then the results.
write_acked(K, F, receipts, acked_ids, fair, metas, expired, now_ms, keep_done_ms, bound, forgot, ended)
if #trim > 0 then
  call_chunked('HDEL', results_key, trim)
  call_chunked('ZREM', result_expiry_key, trim)
end
local fields, expiries = {}, {}
for _, pair in ipairs(stored) do
  -- %d, not `..`: a Lua built with LUA_NUMBER_FMT "%.14g" (fakeredis's; Redis's own uses
  -- "%.17g") writes a clock of 1e14 ms or more as "1.1258999068426e+15", which no reader parses.
  fields[#fields + 1], fields[#fields + 2] = pair[1], string.format('%d|', now_ms) .. pair[2]
  expiries[#expiries + 1], expiries[#expiries + 2] = now_ms + ttl_ms, pair[1]
  redis.call('XADD', finished_key, 'MAXLEN', STREAM_LENGTH, '*', 'id', pair[1])
end
call_chunked('HSET', results_key, fields)
call_chunked('ZADD', result_expiry_key, expiries)
if R ~= NONE then
  if #R.gone > 0 then call_chunked('HDEL', keyed_key, R.gone) end
  if #R.sizes > 0 then call_chunked('HSET', keyed_key, R.sizes) end
  redis.call('HSET', counters_key, 'result_bytes', string.format('%d', R.used))
  if R.budget and not settings[10] then redis.call('HSET', counters_key, 'rsized', 1) end
end
return status
