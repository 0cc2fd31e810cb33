--[[ lease: optionally ack jobs first, run bounded maintenance, then lease up to `count`
ready jobs, each with a new fence and a deadline on the server clock.

Order inside the call:
  1. ack every receipt in ARGV[8..] that is still current (as ack.lua does, tombstones
     included), so a busy worker acks one job and leases the next in one round trip;
  2. replay check: if this (owner, call) already leased jobs, return those jobs again
     instead of leasing more (a retried call has the effect of one call);
  3. maintenance, when READY holds fewer than `count` jobs or next_maintenance_ms has
     passed: promote up to `limit` due SCHEDULED jobs to the tail of READY, and reclaim up
     to `limit` expired leases to the head of READY with the attempt counted (to DEAD
     once attempts reach max_attempts: a poison pill cannot loop forever);
  4. pop up to `count` ids from the head of READY and lease them: fence = the queue's
     `leased` counter, deadline = now + lease_ms, receipt recorded in `leased` and
     `owners`.
A lease past its deadline stays valid until maintenance reclaims it.

KEYS (10), all <prefix>:{<queue>}:<role>
  1 jobs       hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
  2 ready      list  job ids, head = next to lease
  3 scheduled  zset  id -> due_ms
  4 leased     zset  receipt -> deadline_ms
  5 owners     zset  receipt -> 0 (lexicographic index: receipts by owner, then call)
  6 dead       zset  id -> dead_ms
  7 errors     hash  id -> last error text of a dead job
  8 counters   hash  counter name -> integer; also next_maintenance_ms
  9 wake       zset  the single member "wake" while workers should wake up
 10 done       zset  id -> ms until which an acked id stays a duplicate (tombstones)

ARGV (7 + r)
  1  now_ms      '' (use the server clock) or integer >= 0; tests only
  2  owner       1..64 bytes of [A-Za-z0-9_.:-]: who holds the leases (a service id)
  3  call        1..64 bytes of [A-Za-z0-9_.:-]: unique per call, chosen by the client
  4  count       integer 0..1000, jobs to lease
  5  lease_ms    integer 1..604800000
  6  limit       integer 1..1000, most jobs promoted and most leases reclaimed per call
  7  keep_done_ms  integer 0..2^40: how long an acked id stays a duplicate (0: not at all)
  8.. receipts   0..1000 receipts to ack before leasing

Receipt  "<owner>|<call>|<fence>|<attempt>|<id>", returned by this script; it names one
         lease of one job and is its fencing token.

Returns  {now_ms, next_due_ms, r, ack_status_1 .. ack_status_r, m, job_1 .. job_m}
         ack_status: 'ok' (acked), 'stale' (the job exists under another lease or in
         another state), 'gone' (no such job: acked before, purged, or never enqueued).
         next_due_ms: when m < count, the earliest due_ms in SCHEDULED or deadline in
         LEASED (now_ms if maintenance stopped at its limit), -1 if neither; else -1.
         A replayed call answers -1 (wait at most one block period).
         job: 7 values: receipt, id, payload, fence, attempt, max_attempts, deadline_ms.
Errors   PQ_BADARG (nothing written), PQ_CORRUPT (a record does not parse; nothing
         written), WRONGTYPE (a key holds another Redis type; nothing written).
]]

-- >>> pyqueue prelude: the same in every script; source tests/lua_prelude.lua, copied by tests/lua_prelude.py
-- Edit tests/lua_prelude.lua, then run `python tests/lua_prelude.py --write`; never edit a copy.
-- Every helper is in every script; an unused one is harmless and calls nothing.

local MAX_BATCH = 1000 -- per call at most this many jobs, receipts or ids; also the most count/limit
local CHUNK = 500 -- values per unpack(); keeps every redis.call well under Lua's C stack limit
local TRIM_BATCH = 10 -- expired tombstones are trimmed this many at a time, at least
local MAINTENANCE_INTERVAL_MS = 50 -- while READY is busy, maintenance still runs this often

-- An integer argument in [lo, hi] ('^-?%d+$'), or nil and a PQ_BADARG text naming it.
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

-- A PQ_BADARG text unless `value` (a string) is 1..64 bytes of [A-Za-z0-9_.:-]; else nil.
local function name_arg(value, name)
  if #value < 1 or #value > 64 or not string.match(value, '^[%w_.:%-]+$') then
    return 'PQ_BADARG ' .. name .. ' must be 1..64 bytes of [A-Za-z0-9_.:-]'
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
  local out = {}
  if #fields == 0 then return out end
  for i = 1, #fields, CHUNK do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
    for j = 1, #part do out[i + j - 1] = part[j] end
  end
  return out
end

-- Tombstone acked ids in `key` (done; ack.lua). Trim the `expired` lowest ranks first: ZADD may re-rank them.
local function bury(key, ids, expired, now_ms, keep_done_ms)
  if expired >= TRIM_BATCH then
    redis.call('ZREMRANGEBYRANK', key, 0, math.min(expired, #ids + TRIM_BATCH) - 1)
  end
  if keep_done_ms > 0 then
    local args = {}
    for i, id in ipairs(ids) do args[2 * i - 1], args[2 * i] = now_ms + keep_done_ms, id end
    call_chunked('ZADD', key, args)
  end
end
-- <<< pyqueue prelude

local jobs_key, ready_key, scheduled_key, leased_key, owners_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local dead_key, errors_key, counters_key, wake_key, done_key = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]

-- 1. Validate every argument before touching a key.
local err
local owner, call = ARGV[2], ARGV[3]
err = name_arg(owner, 'owner') or name_arg(call, 'call')
if err then return redis.error_reply(err) end
local count, lease_ms, limit, keep_done_ms, now_ms
count, err = int_arg(ARGV[4], 'count', 0, MAX_BATCH)
if err then return redis.error_reply(err) end
lease_ms, err = int_arg(ARGV[5], 'lease_ms', 1, 604800000)
if err then return redis.error_reply(err) end
limit, err = int_arg(ARGV[6], 'limit', 1, MAX_BATCH)
if err then return redis.error_reply(err) end
keep_done_ms, err = int_arg(ARGV[7], 'keep_done_ms', 0, 2 ^ 40)
if err then return redis.error_reply(err) end
now_ms, err = now_arg(ARGV[1])
if err then return redis.error_reply(err) end
if #ARGV - 7 > MAX_BATCH then return redis.error_reply('PQ_BADARG at most 1000 receipts per call') end
local acks = {}
for i = 8, #ARGV do
  local lease = parse_receipt(ARGV[i])
  if not lease then return redis.error_reply('PQ_BADARG malformed receipt ' .. string.format('%q', ARGV[i])) end
  acks[#acks + 1] = lease
end

-- Keys proven to hold the right type by a read; others are probed before the first write.
local verified = {}

-- 2. Read what the acks need: a receipt still in `leased` is the current lease.
local ack_status, to_ack, all_acked = {}, {}, true
local acking = {}
for i, lease in ipairs(acks) do
  local current = redis.call('ZSCORE', leased_key, lease.receipt)
  verified[leased_key] = true
  if current and not acking[lease.receipt] then
    ack_status[i] = 'ok'
    acking[lease.receipt] = true
    to_ack[#to_ack + 1] = lease
  else
    all_acked = false
    verified[jobs_key] = true
    ack_status[i] = (redis.call('HEXISTS', jobs_key, lease.id) == 1 and not acking[lease.receipt]) and 'stale' or 'gone'
  end
end

-- 3. Replay check. A call whose acks all succeeded cannot be a replay (the first run would
-- have removed them), so the busy path skips this read.
local prior = {}
if count > 0 and not all_acked or #acks == 0 and count > 0 then
  prior = redis.call('ZRANGEBYLEX', owners_key, '[' .. owner .. '|' .. call .. '|', '(' .. owner .. '|' .. call .. '}', 'LIMIT', 0, count)
  verified[owners_key] = true
end

now_ms = now_ms or server_now_ms()
-- Expired tombstones, counted before any write (ZCOUNT also proves `done` is a zset).
local expired_done = #to_ack > 0 and redis.call('ZCOUNT', done_key, '-inf', now_ms) or 0

local leased = {} -- leases to hand out: {receipt, id, payload, fence, attempt, max, deadline}
local next_due_ms = -1

if #prior > 0 then
  -- A replay: hand back the leases the first run made, unchanged.
  local ids, deadlines = {}, {}
  for i, receipt in ipairs(prior) do
    local lease = parse_receipt(receipt)
    if not lease then return redis.error_reply('PQ_CORRUPT malformed receipt in ' .. owners_key) end
    prior[i] = lease
    ids[i] = lease.id
    deadlines[i] = redis.call('ZSCORE', leased_key, receipt)
  end
  local records = hmget(jobs_key, ids)
  for i, lease in ipairs(prior) do
    local attempts, max_attempts, _, at = parse_record(records[i] or '')
    if not attempts or not deadlines[i] then
      return redis.error_reply('PQ_CORRUPT ' .. owners_key .. ' lists a lease without a valid job or deadline')
    end
    leased[#leased + 1] = { lease.receipt, lease.id, string.sub(records[i], at), lease.fence, lease.attempt,
      max_attempts, tonumber(deadlines[i]) }
  end
  -- Every key written below was read above, so its type is proven.
  if #to_ack > 0 then
    local receipts, job_ids = {}, {}
    for i, lease in ipairs(to_ack) do receipts[i], job_ids[i] = lease.receipt, lease.id end
    call_chunked('ZREM', owners_key, receipts)
    call_chunked('ZREM', leased_key, receipts)
    call_chunked('HDEL', jobs_key, job_ids)
    bury(done_key, job_ids, expired_done, now_ms, keep_done_ms)
  end
else
  -- 4. Read the rest of the plan: counters, the head of READY, maintenance candidates.
  local counters = redis.call('HMGET', counters_key, 'leased', 'next_maintenance_ms')
  verified[counters_key] = true
  local fence0 = tonumber(counters[1] or '0') or 0
  local maintenance_due = tonumber(counters[2] or '0') or 0
  local ready_head = {}
  if count > 0 then
    ready_head = redis.call('LRANGE', ready_key, 0, count) -- one extra: is more work waiting?
    verified[ready_key] = true
  end

  local promoted, reclaimed, to_dead, stopped_at_limit = {}, {}, {}, false
  local maintain = (count > 0 and #ready_head < count) or now_ms >= maintenance_due
  if maintain then
    promoted = redis.call('ZRANGEBYSCORE', scheduled_key, '-inf', now_ms, 'LIMIT', 0, limit)
    verified[scheduled_key] = true
    local expired = redis.call('ZRANGEBYSCORE', leased_key, '-inf', now_ms, 'LIMIT', 0, limit + #to_ack)
    verified[leased_key] = true
    stopped_at_limit = #promoted == limit
    local candidates, ids = {}, {}
    for _, receipt in ipairs(expired) do
      if not acking[receipt] and #candidates < limit then
        local lease = parse_receipt(receipt)
        if not lease then return redis.error_reply('PQ_CORRUPT malformed receipt in ' .. leased_key) end
        candidates[#candidates + 1] = lease
        ids[#ids + 1] = lease.id
      end
    end
    if #candidates == limit then stopped_at_limit = true end
    local records = hmget(jobs_key, ids)
    if #ids > 0 then verified[jobs_key] = true end
    for i, lease in ipairs(candidates) do
      local attempts, max_attempts, _, at = parse_record(records[i] or '')
      lease.record = records[i]
      if attempts and lease.attempt >= max_attempts then
        lease.payload_at, lease.max = at, max_attempts
        to_dead[#to_dead + 1] = lease
      elseif attempts then
        lease.payload_at, lease.max = at, max_attempts
        reclaimed[#reclaimed + 1] = lease
      else
        -- A lease without a job record: the job was removed by another program. Drop the lease.
        lease.orphan = true
        reclaimed[#reclaimed + 1] = lease
      end
    end
  end

  -- 5. Choose what to lease: READY after maintenance would read
  -- reclaimed (earliest deadline first) ++ current READY ++ promoted.
  local order = {}
  for _, lease in ipairs(reclaimed) do
    if not lease.orphan then order[#order + 1] = { id = lease.id, from = 'reclaimed', lease = lease } end
  end
  for _, id in ipairs(ready_head) do order[#order + 1] = { id = id, from = 'ready' } end
  for _, id in ipairs(promoted) do order[#order + 1] = { id = id, from = 'promoted' } end
  local take = math.min(count, #order)
  local need_ids, need_at = {}, {}
  for i = 1, take do
    if order[i].from ~= 'reclaimed' then
      need_ids[#need_ids + 1] = order[i].id
      need_at[#need_ids] = i
    end
  end
  if #need_ids > 0 then
    local records = hmget(jobs_key, need_ids)
    verified[jobs_key] = true
    for j, record in ipairs(need_ids) do order[need_at[j]].record = records[j] end
  end
  for i = 1, take do
    local item = order[i]
    local record = item.lease and item.lease.record or item.record
    local attempts, max_attempts, _, at = parse_record(record or '')
    if item.from ~= 'reclaimed' and not attempts and record then
      return redis.error_reply('PQ_CORRUPT unparsable record for job in ' .. jobs_key)
    end
    item.attempts, item.max, item.at = attempts, max_attempts, at
    -- A reclaimed job's record is rewritten below with the expired lease's attempt.
    if item.from == 'reclaimed' then item.attempts = item.lease.attempt end
  end
  -- Wake another worker when work is left over after a plain lease: the wake marker woke
  -- one worker only. A worker that acks and leases is busy and comes back by itself.
  local wake = #acks == 0 and #order > take
  -- next_due_ms is read from SCHEDULED after the writes when fewer than count are leased.
  local read_scheduled_after = take < count and not stopped_at_limit

  -- 6. Prove the types of keys we will write but have not read. When this call acks,
  -- its first write is ZREM on `owners`: if that key held another type, the error would
  -- come before anything was written, so it needs no probe (one command less per job).
  local writes = { [jobs_key] = 'hash', [ready_key] = 'list', [leased_key] = 'zset', [owners_key] = 'zset' }
  if #to_ack > 0 then writes[owners_key] = nil end
  if #to_dead > 0 then writes[dead_key] = 'zset'; writes[errors_key] = 'hash' end
  if wake then writes[wake_key] = 'zset' end
  if read_scheduled_after then writes[scheduled_key] = 'zset' end
  for key, want in pairs(writes) do
    if not verified[key] then
      err = expect_type(key, want)
      if err then return redis.error_reply(err) end
    end
  end

  -- Which READY ids this call pops, and which maintenance moves go back to READY.
  local from_ready, head_back, tail_back = 0, {}, {}
  for i, item in ipairs(order) do
    if i <= take then
      if item.from == 'ready' then from_ready = from_ready + 1 end
    elseif item.from == 'reclaimed' then
      head_back[#head_back + 1] = item.id
    elseif item.from == 'promoted' then
      tail_back[#tail_back + 1] = item.id
    end
  end

  -- 7. Write: acks (first ZREM on `owners`, see 6), then the pop from READY. The first
  -- write removes something, so at its memory limit Redis still runs the call (it
  -- refuses only a growing first write): a full server keeps draining.
  if #to_ack > 0 then
    local receipts, job_ids = {}, {}
    for i, lease in ipairs(to_ack) do receipts[i], job_ids[i] = lease.receipt, lease.id end
    call_chunked('ZREM', owners_key, receipts)
    call_chunked('ZREM', leased_key, receipts)
    call_chunked('HDEL', jobs_key, job_ids)
    bury(done_key, job_ids, expired_done, now_ms, keep_done_ms)
  end
  if from_ready > 0 then redis.call('LTRIM', ready_key, from_ready, -1) end

  -- Maintenance. With nothing due it writes nothing (an idle call stays read-only).
  if maintain and #promoted + #reclaimed + #to_dead > 0 then
    if #promoted > 0 then call_chunked('ZREM', scheduled_key, promoted) end
    local ended, rewritten = {}, {}
    for _, lease in ipairs(reclaimed) do ended[#ended + 1] = lease.receipt end
    for _, lease in ipairs(to_dead) do ended[#ended + 1] = lease.receipt end
    if #ended > 0 then
      call_chunked('ZREM', leased_key, ended)
      call_chunked('ZREM', owners_key, ended)
    end
    -- The lease counted as an attempt: persist it in the record (due_ms = now: ready again).
    for _, lease in ipairs(reclaimed) do
      if not lease.orphan then
        rewritten[#rewritten + 1] = lease.id
        rewritten[#rewritten + 1] = string.format('%d|%d|%d|', lease.attempt, lease.max, now_ms) .. string.sub(lease.record, lease.payload_at)
      end
    end
    if #to_dead > 0 then
      local dead_args, error_args = {}, {}
      for _, lease in ipairs(to_dead) do
        rewritten[#rewritten + 1] = lease.id
        rewritten[#rewritten + 1] = string.format('%d|%d|%d|', lease.attempt, lease.max, now_ms) .. string.sub(lease.record, lease.payload_at)
        dead_args[#dead_args + 1] = now_ms
        dead_args[#dead_args + 1] = lease.id
        error_args[#error_args + 1] = lease.id
        error_args[#error_args + 1] = string.format('lease expired on attempt %d of %d', lease.attempt, lease.max)
      end
      call_chunked('ZADD', dead_key, dead_args)
      call_chunked('HSET', errors_key, error_args)
      redis.call('HINCRBY', counters_key, 'dead', #to_dead)
    end
    if #rewritten > 0 then call_chunked('HSET', jobs_key, rewritten) end
    if #ended > 0 then redis.call('HINCRBY', counters_key, 'reclaimed', #ended) end
    if #promoted > 0 then redis.call('HINCRBY', counters_key, 'promoted', #promoted) end
  end
  -- Rate-limit maintenance while READY is busy. Written only when this call wrote
  -- something else first, so it is never a growing first write (see above).
  if maintain and (#promoted + #reclaimed + #to_dead + #to_ack + from_ready > 0) then
    redis.call('HSET', counters_key, 'next_maintenance_ms', now_ms + MAINTENANCE_INTERVAL_MS)
  end

  -- Unleased reclaimed jobs go to the head (earliest deadline first), unleased promoted
  -- jobs to the tail.
  if #head_back > 0 then
    local reversed = {}
    for i = #head_back, 1, -1 do reversed[#reversed + 1] = head_back[i] end
    call_chunked('LPUSH', ready_key, reversed)
  end
  if #tail_back > 0 then call_chunked('RPUSH', ready_key, tail_back) end

  -- Lease.
  local deadline_ms = now_ms + lease_ms
  local leased_args, owner_args, fence = {}, {}, fence0
  for i = 1, take do
    local item = order[i]
    if item.at then
      fence = fence + 1
      local attempt = item.attempts + 1
      local receipt = string.format('%s|%s|%d|%d|', owner, call, fence, attempt) .. item.id
      local record = item.lease and item.lease.record or item.record
      leased[#leased + 1] = { receipt, item.id, string.sub(record, item.at), fence, attempt, item.max, deadline_ms }
      leased_args[#leased_args + 1] = deadline_ms
      leased_args[#leased_args + 1] = receipt
      owner_args[#owner_args + 1] = 0
      owner_args[#owner_args + 1] = receipt
    end
    -- An id in READY without a record (removed by another program) is popped and dropped.
  end
  if #leased > 0 then
    redis.call('HINCRBY', counters_key, 'leased', #leased)
    call_chunked('ZADD', leased_key, leased_args)
    call_chunked('ZADD', owners_key, owner_args)
  end

  if wake then redis.call('ZADD', wake_key, 0, 'wake') end

  if #leased < count then
    if stopped_at_limit then
      next_due_ms = now_ms
    else
      local s = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
      local l = redis.call('ZRANGE', leased_key, 0, 0, 'WITHSCORES')
      if s[2] then next_due_ms = tonumber(s[2]) end
      if l[2] and (next_due_ms < 0 or tonumber(l[2]) < next_due_ms) then next_due_ms = tonumber(l[2]) end
    end
  end
end

local reply = { now_ms, next_due_ms, #acks }
for i = 1, #acks do reply[#reply + 1] = ack_status[i] end
reply[#reply + 1] = #leased
for _, job in ipairs(leased) do
  for _, v in ipairs(job) do reply[#reply + 1] = v end
end
return reply
