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
     once attempts reach max_attempts: a poison pill cannot loop forever); a call that
     acks nothing also trims up to 1000 expired tombstones once at least 10 have
     expired, so that a drained queue, which gets no acks, frees them (an idle worker
     calls lease at least every block_ms; acks trim as in ack.lua);
  4. pop up to `count` ids from the head of READY and lease them: fence = the queue's
     `leased` counter, deadline = now + lease_ms, receipt recorded in `leased` and
     `owners`.
A lease past its deadline stays valid until maintenance reclaims it.
Fair queues (section 2.1; `counters` has `fair`): acks and maintenance are written first
(ended jobs give their groups' slots back, moved ones go to `gready` or `ready` by their
meta), then step 4 is the fair pick (fair_pick, lua/include/groups.lua: round-robin
between groups, highest priority first, groups at their cap skipped; O((count +
skipped) log N)), after a few TYPE probes of the keys it may write; a PQ_CORRUPT record
found by the pick leaves the acks and maintenance done. Paused (pause.lua): step 4
leases nothing and next_due_ms is -1. Rate limited (limit.lua): step 4 leases at most
the permits due now (GCRA) and advances `rate_tat`; when every permit was used,
next_due_ms is when the next is due. Expiries (section 2.7; `counters` has `expiry`): a
job past its `expires` deadline at its first lease is expired instead (never run; its id
tombstoned like an acked one), and next_due_ms is now_ms. Rate keys (section 2.7;
`counters` has `rates`): a job whose key's GCRA has no permit due for it now is not
leased but scheduled at its slot, when its permits will be due (rate_read,
lua/include/control.lua), and next_due_ms is now_ms. Flags come with the counters read
anyway: a queue without these features pays nothing for them.

KEYS (23), all <prefix>:{<queue>}:<role>
  1 jobs       hash  id -> "<attempts>|<max_attempts>|<due_ms>:<enqueued_ms>|<payload>"
  2 ready      list  job ids, head = next to lease
  3 scheduled  zset  id -> due_ms
  4 leased     zset  receipt -> deadline_ms
  5 owners     zset  receipt -> 0 (lexicographic index: receipts by owner, then call)
  6 dead       zset  id -> dead_ms
  7 errors     hash  id -> last error text of a dead job
  8 counters   hash  counter name -> integer; also next_maintenance_ms, `paused`
                   (pause.lua) while the queue is paused, and `rate_limit` / `rate_tat`
                   (limit.lua) while it is rate limited
  9 wake       zset  the single member "wake" while workers should wake up
 10 done       zset  id -> ms until which an acked id stays a duplicate (tombstones)
 11 meta       hash  id -> "<priority>|<pos>|<group>" of jobs with a group or a priority
 12 gready     zset  "<group>|<rank>|<id>" -> 0: READY jobs with meta (lexicographic)
 13 ring       zset  group -> turn (>= 1) or -1 (parked at its cap)
 14 groups     hash  r:<group>, c:<group>, cap, turn, seq, uturn
 15 events     stream  the queue's events, when it has opted in (section 2.5): 'acked' per
                   receipt acked, 'retried' or 'dead' per lease reclaimed, 'leased' per
                   lease made (with attempt, owner and deadline_ms), 'expired' per job expired
 16 steps      hash  the jobs' step data (section 2.6): an acked job's is deleted, when
                   the queue has any (counters `steps`)
 17 waiting    zset  id -> until_ms, the jobs parked for a signal: an acked job leaves it
 18 expires    zset  id -> deadline_ms of a job sent with an expiry, until its first lease
 19 expired    zset  id -> ms it expired, the newest 10000 jobs expired
 20 keyed      hash  the sequences' heads and entries (section 2.7), when the queue has any
                   (counters `sequences`): an acked or expired head hands its key on, and
                   so does one of the policy skip that maintenance sends to DEAD; the
                   jobs' rate entries and the rate keys' state and limits (`rates`)
 21 sequenced  zset  "<key>\n<seq>\n<id>" -> 0: the jobs waiting behind their head
 22 windows    zset  "k:<key>" -> until when a rate key's state in `keyed` means something
 23 index      zset  "<kind>\n<value>\n<enqueued_ms>\n<id>" -> 0: the indexes (set_indexes.lua): an
                   ended job's members go, when the queue has any (counters `indexed`)

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
         LEASED (now_ms if maintenance stopped at its limit), -1 if neither; when the
         rate limit allowed fewer than count and all were leased, when the next permit
         is due; else -1.
         A replayed call answers -1 (wait at most one block period).
         job: 8 values: receipt, id, payload, fence, attempt, max_attempts, deadline_ms,
           enqueued_ms (when it was sent; -1 for a record written before contract v5).
Cost     plain case (count 1, one ready job, maintenance not due): 13 commands (ack one,
         lease one); 10 (lease one); in a queue with expiries, a call that leases jobs
         for the first time +1, +1 more if one was sent with an expiry, +3 more if one
         expired; in a queue with sequences, rate keys, sizes or indexed jobs, acks and
         expiries as ack.lua's acks; in a queue with rate keys +1, +4 more to lease a job
         with a rate key, +3 more to defer one instead (not leased: it pays none of a
         lease's 3 writes); with a tombstone limit (set_tombstone_limit.lua), a call that
         acks or expires jobs +1, +1 more when past it
Errors   PQ_BADARG (nothing written), PQ_CORRUPT (a record does not parse; nothing
         written), WRONGTYPE (a key holds another Redis type; nothing written).
Contract v6 (lua/README.md section 10): other counts of KEYS or ARGV than above answer
         PQ_CONTRACT, before anything is read or written.
]]

local jobs_key, ready_key, scheduled_key, leased_key, owners_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local dead_key, errors_key, counters_key, wake_key, done_key = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local events_key, steps_key, waiting_key, expires_key, expired_key = KEYS[15], KEYS[16], KEYS[17], KEYS[18], KEYS[19]
local keyed_key, sequenced_key, windows_key, index_key = KEYS[20], KEYS[21], KEYS[22], KEYS[23]

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
local function name_arg(value, name)
  if #value < 1 or #value > 64 or not string.find(value, '^[%w_.:%-]+$') then
    return 'PQ_BADARG ' .. name .. ' must be 1..64 bytes of [A-Za-z0-9_.:-]'
  end
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
local function parse_record(record)
  local attempts, max_attempts, due_ms, sent, at = string.match(record, '^(%d+)|(%d+)|(%d+)(:?%d*)|()')
  if not attempts or sent == ':' then return nil end
  return tonumber(attempts), tonumber(max_attempts), tonumber(due_ms), at, tonumber(string.sub(sent, 2))
end
local function record_head(attempts, max_attempts, due_ms, enqueued_ms)
  if enqueued_ms then return string.format('%d|%d|%d:%d|', attempts, max_attempts, due_ms, enqueued_ms) end
  return string.format('%d|%d|%d|', attempts, max_attempts, due_ms)
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
local function emit_failed(events_key, bound, leases, now_ms, why)
  if not bound then return end
  for _, lease in ipairs(leases) do
    if lease.max then
      local reason = string.format('%s on attempt %d of %d', why, lease.attempt, lease.max)
      if lease.attempt >= lease.max then
        emit(events_key, bound, 'dead', lease.id, now_ms, 'attempt', lease.attempt, 'error', reason)
      else
        emit(events_key, bound, 'retried', lease.id, now_ms, 'attempt', lease.attempt, 'due_ms',
          string.format('%d', now_ms), 'error', reason)
      end
    end
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
local EXPIRED_KEPT = 10000
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
local function sequence_dead_read(K, ids, flag)
  if not flag or #ids == 0 then return NONE end
  local ended, err = keyed_read(K, ids)
  if err then return nil, err end
  local skipping = NONE
  for _, e in ipairs(ended) do
    if e.policy == 's' then
      if skipping == NONE then skipping = {} end
      -- Its dead letter leaves the line but is still kept: its rate entry (a replay is
      -- limited too) and its size stay.
      e.kept = true
      skipping[#skipping + 1] = e
    end
  end
  return skipping
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
local function expire_jobs(K, ids, now_ms, keep_done_ms, bound)
  call_chunked('HDEL', K.jobs, ids)
  local args = {}
  for i, id in ipairs(ids) do args[2 * i - 1], args[2 * i] = now_ms, id end
  call_chunked('ZADD', K.expired, args)
  redis.call('ZREMRANGEBYRANK', K.expired, 0, -EXPIRED_KEPT - 1)
  redis.call('HINCRBY', K.counters, 'expired', #ids)
  bury(K.done, ids, 0, now_ms, keep_done_ms, K.done_most)
  for _, id in ipairs(ids) do emit(K.events, bound, 'expired', id, now_ms, 'reason', 'not started by its deadline') end
end
local function rate_state(value)
  local tat, slot, spacing = string.match(value or '0|0|0', '^([%d.]+)|([%d.]+)|([%d.]+)$')
  if not tat then return nil end
  return { tat = tonumber(tat), slot = tonumber(slot), spacing = tonumber(spacing) }
end
local function rate_respace(k, spacing, now_ms)
  -- (The state keeps the spacing to 6 decimals: a difference below that is no change.)
  if math.abs(k.spacing - spacing) > 1e-5 then
    if k.spacing > 0 then
      k.tat = now_ms + math.max(0, k.tat - now_ms) * spacing / k.spacing
      k.slot = now_ms + math.max(0, k.slot - now_ms) * spacing / k.spacing
    end
    k.spacing = spacing
  end
end
local function rate_read(K, ids, now_ms)
  if #ids == 0 then return NONE end
  local fields = {}
  for i, id in ipairs(ids) do fields[i] = 'r:' .. id end
  local entries = hmget(K.keyed, fields)
  local checked, keys, key_order, key_fields = {}, {}, {}, {}
  for i, entry in ipairs(entries) do
    if entry then
      local limit, cost, waited, key = string.match(entry, '^(%d+/%d+/%d+)/(%d+)|(w?)|(.+)$')
      if not limit then return nil, 'PQ_CORRUPT unparsable rate entry in ' .. K.keyed end
      checked[#checked + 1] = { id = ids[i], limit = limit, cost = tonumber(cost), key = key, waited = waited == 'w' }
      if not keys[key] then
        keys[key] = { at = #key_fields + 1 }
        key_order[#key_order + 1] = key
        key_fields[#key_fields + 1], key_fields[#key_fields + 2] = 'k:' .. key, 'l:' .. key
      end
    end
  end
  if #checked == 0 then return NONE end
  local state = hmget(K.keyed, key_fields)
  for _, key in ipairs(key_order) do
    local k = rate_state(state[keys[key].at])
    if not k then return nil, 'PQ_CORRUPT unparsable rate key state in ' .. K.keyed end
    k.override = state[keys[key].at + 1]
    keys[key] = k
  end
  local R = { deferred = {}, n_deferred = 0, keyed_args = {}, window_args = {}, scheduled_args = {} }
  for _, job in ipairs(checked) do
    local k = keys[job.key]
    local count, period_ms, burst = string.match(k.override or job.limit, '^(%d+)/(%d+)/(%d+)$')
    if not count then return nil, 'PQ_CORRUPT unparsable rate limit in ' .. K.keyed end
    count, burst = tonumber(count), tonumber(burst)
    if count > 0 then
      local spacing = tonumber(period_ms) / count
      rate_respace(k, spacing, now_ms)
      -- A job costing more than the burst (the limit was lowered since) takes the whole burst.
      local cost = math.min(job.cost, burst) * spacing
      local tat = math.max(k.tat, now_ms) + cost
      -- When its permits are due; the small epsilon keeps float rounding from deferring a due one.
      local due = tat - burst * spacing
      if due <= now_ms + 1e-6 then
        k.tat, k.changed = tat, true
        if job.waited then
          -- Its wait is over: a retry or a replay later queues behind the key's line.
          local n = #R.keyed_args
          R.keyed_args[n + 1] = 'r:' .. job.id
          R.keyed_args[n + 2] = job.limit .. '/' .. job.cost .. '||' .. job.key
        end
      else
        local at
        if job.waited then
          -- Its place in line again: when its permits are due, after the others of this
          -- call that waited before (k.again).
          at = math.max(due, k.again or due)
          k.again, k.slot = at + cost, math.max(k.slot, at + cost)
        else
          at = math.max(due, k.slot)
          k.slot = at + cost
          local n = #R.keyed_args
          R.keyed_args[n + 1] = 'r:' .. job.id
          R.keyed_args[n + 2] = job.limit .. '/' .. job.cost .. '|w|' .. job.key
        end
        k.changed = true
        local until_ms = math.ceil(at)
        R.deferred[job.id], R.n_deferred = until_ms, R.n_deferred + 1
        R.scheduled_args[#R.scheduled_args + 1] = until_ms
        R.scheduled_args[#R.scheduled_args + 1] = job.id
      end
    end
  end
  for _, key in ipairs(key_order) do
    local k = keys[key]
    if k.changed then
      local n = #R.keyed_args
      R.keyed_args[n + 1], R.keyed_args[n + 2] = 'k:' .. key, string.format('%.3f|%.3f|%.6f', k.tat, k.slot, k.spacing)
      R.window_args[#R.window_args + 1] = math.ceil(math.max(k.tat, k.slot))
      R.window_args[#R.window_args + 1] = 'k:' .. key
    end
  end
  return R
end
local function rate_write(K, R, now_ms, bound)
  if R == NONE then return end
  if #R.keyed_args > 0 then call_chunked('HSET', K.keyed, R.keyed_args) end
  if #R.window_args > 0 then call_chunked('ZADD', K.windows, R.window_args) end
  if R.n_deferred == 0 then return end
  call_chunked('ZADD', K.scheduled, R.scheduled_args)
  redis.call('HINCRBY', K.counters, 'deferred', R.n_deferred)
  if not bound then return end
  for k = 2, #R.scheduled_args, 2 do
    emit(K.events, bound, 'deferred', R.scheduled_args[k], now_ms, 'until_ms',
      string.format('%d', R.scheduled_args[k - 1]))
  end
end
-- lua/include/groups.lua (each helper's note is there)
local POS_MID = 5000000000000000
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
local function push_ready(ready_key, ids, head)
  if #ids > 0 and head then
    local reversed = {}
    for i = #ids, 1, -1 do reversed[#reversed + 1] = ids[i] end
    call_chunked('LPUSH', ready_key, reversed)
  elseif #ids > 0 then
    call_chunked('RPUSH', ready_key, ids)
  end
end
local function fair_member(group, priority, pos, id)
  return group .. '|' .. string.char(53 - priority) .. pos .. '|' .. id
end
local function fair_slots(F, group)
  local v = redis.call('HMGET', F.groups, 'r:' .. group, 'c:' .. group, 'cap')
  return tonumber(v[1] or '0') or 0, tonumber(v[2] or v[3] or '0') or 0
end
local function fair_activate(F, group)
  if redis.call('ZSCORE', F.ring, group) then return end
  local running, cap = fair_slots(F, group)
  if cap == 0 or running < cap then
    redis.call('ZADD', F.ring, redis.call('HINCRBY', F.groups, 'turn', 1), group)
  else
    redis.call('ZADD', F.ring, -1, group)
  end
end
local function fair_enter(F, ids, metas, head)
  local plain, fair = {}, {}
  for i, id in ipairs(ids) do
    if metas[i] then fair[#fair + 1] = i else plain[#plain + 1] = id end
  end
  if #fair == 0 then return plain end
  local last = redis.call('HINCRBY', F.groups, 'seq', #fair)
  local members, entries, activate = {}, {}, {}
  for k, i in ipairs(fair) do
    local meta, id = metas[i], ids[i]
    local seq = head and last - k + 1 or last - #fair + k
    local pos = string.format('%016.0f', head and POS_MID - seq or POS_MID + seq)
    members[2 * k - 1], members[2 * k] = 0, fair_member(meta.group, meta.priority, pos, id)
    entries[2 * k - 1], entries[2 * k] = id, meta.priority .. '|' .. pos .. '|' .. meta.group
    if meta.group ~= '' and not activate[meta.group] then
      activate[meta.group] = true
      activate[#activate + 1] = meta.group
    end
  end
  call_chunked('ZADD', F.gready, members)
  call_chunked('HSET', F.meta, entries)
  for _, g in ipairs(activate) do fair_activate(F, g) end
  return plain
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
local function fair_ready(ready_key, F, ids, metas, head)
  push_ready(ready_key, fair_enter(F, ids, metas, head), head)
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
local STALE_BUDGET = 100
local PICK_CHUNK = 8
local function pick_ring(F, P, n)
  n = math.min(n, P.budget - P.read)
  local rows = redis.call('ZRANGEBYSCORE', F.ring, '(0', '+inf', 'WITHSCORES', 'LIMIT', P.read, n + 1)
  local first, names = #P.entries, {}
  for i = 1, math.min(#rows, 2 * n), 2 do
    P.entries[#P.entries + 1] = { g = rows[i], turn = tonumber(rows[i + 1]) }
    names[#names + 1] = 'r:' .. rows[i]
    names[#names + 1] = 'c:' .. rows[i]
  end
  local slots = hmget(F.groups, names)
  for k = 1, #names / 2 do
    local cap = tonumber(slots[2 * k] or '') or P.default_cap
    P.state[P.entries[first + k].g] = { running = tonumber(slots[2 * k - 1] or '0') or 0, cap = cap, taken = 0 }
  end
  P.read = P.read + #names / 2
  P.more = #rows > 2 * n or P.read == P.budget and #rows == 2 * n
end
local function pick_read(F, ready_key, want)
  local fields = redis.call('HMGET', F.groups, 'turn', 'uturn', 'cap')
  -- entries: the ring's entries read, in turn order; again: the groups served again in
  -- this pick, in turn order (their new turns are above every turn in the ring, so
  -- they come after all of it).
  local P = { want = want, budget = want + STALE_BUDGET, entries = {}, again = {}, state = {}, picks = {}, read = 0 }
  P.turn, P.uturn = tonumber(fields[1] or '0') or 0, tonumber(fields[2] or '0') or 0
  P.default_cap = tonumber(fields[3] or '0') or 0
  pick_ring(F, P, want + PICK_CHUNK)
  P.plain = redis.call('LRANGE', ready_key, 0, want - 1)
  P.lane = redis.call('ZRANGEBYLEX', F.gready, '[|', '(}', 'LIMIT', 0, want)
  P.qi, P.ai, P.pi, P.li, P.steps = 1, 1, 1, 1, 0
  return P
end
local function pick_next(F, P)
  if P.qi > #P.entries and P.more and P.read < P.budget then pick_ring(F, P, PICK_CHUNK) end
  if P.qi <= #P.entries then return P.entries[P.qi] end
  return P.again[P.ai]
end
local function pick_from_group(F, P, e)
  local st = P.state[e.g]
  if st.cap ~= 0 and st.running >= st.cap then
    st.fate = 'park'
    return
  end
  if not st.cache or (#st.cache == PICK_CHUNK and st.taken + 2 > st.from + #st.cache) then
    st.cache = redis.call('ZRANGEBYLEX', F.gready, '[' .. e.g .. '|', '(' .. e.g .. '}', 'LIMIT', st.taken, PICK_CHUNK)
    st.from = st.taken
  end
  local member, after = st.cache[st.taken - st.from + 1], st.cache[st.taken - st.from + 2]
  if not member then
    st.fate = 'drop'
    return
  end
  st.taken = st.taken + 1
  st.running = st.running + 1
  P.turn = P.turn + 1
  P.picks[#P.picks + 1] = { id = string.sub(member, #e.g + 20), member = member, group = e.g }
  if not after then
    st.fate = 'drop'
  elseif st.cap ~= 0 and st.running >= st.cap then
    st.fate = 'park'
  else
    st.fate = 'turn'
    st.turn = P.turn
    P.again[#P.again + 1] = { g = e.g, turn = P.turn }
  end
end
local function pick_choose(F, P)
  while #P.picks < P.want and P.steps < P.budget do
    P.steps = P.steps + 1
    local e = pick_next(F, P)
    local ungrouped = P.pi <= #P.plain or P.li <= #P.lane
    if not e and not ungrouped then break end
    if ungrouped and (not e or P.uturn < e.turn) then
      -- A member of the '' range is "|<rank>|<id>": rank's first character below '5' is a
      -- priority above 0, which goes before the `ready` list (priority 0).
      local member = P.lane[P.li]
      if member and (string.byte(member, 2) < 53 or P.pi > #P.plain) then
        P.picks[#P.picks + 1] = { id = string.sub(member, 20), member = member }
        P.li = P.li + 1
      else
        P.picks[#P.picks + 1] = { id = P.plain[P.pi] }
        P.pi = P.pi + 1
      end
      P.turn = P.turn + 1
      P.uturn = P.turn
    else
      if P.qi <= #P.entries then P.qi = P.qi + 1 else P.ai = P.ai + 1 end
      pick_from_group(F, P, e)
    end
  end
end
local function pick_records(jobs_key, P)
  local ids = {}
  for i, pick in ipairs(P.picks) do ids[i] = pick.id end
  local records = hmget(jobs_key, ids)
  local kept = {}
  for i, pick in ipairs(P.picks) do
    if records[i] then
      if not parse_record(records[i]) then return nil, 'PQ_CORRUPT unparsable record for job in ' .. jobs_key end
      pick.record = records[i]
      kept[#kept + 1] = pick
    elseif pick.group then
      local st = P.state[pick.group]
      st.taken = st.taken - 1
      st.running = st.running - 1
      if st.fate == 'park' and st.running < st.cap then
        P.turn = P.turn + 1
        st.fate = 'turn'
        st.turn = P.turn
      end
    end
  end
  return kept
end
local function pick_write(F, ready_key, P)
  local members, seen = {}, {}
  for _, pick in ipairs(P.picks) do
    if pick.member then members[#members + 1] = pick.member end
  end
  if #members > 0 then call_chunked('ZREM', F.gready, members) end
  if P.pi > 1 then redis.call('LTRIM', ready_key, P.pi - 1, -1) end
  for _, e in ipairs(P.entries) do
    local st = P.state[e.g]
    if not seen[e.g] and st.fate then
      seen[e.g] = true
      if st.fate == 'turn' then
        redis.call('ZADD', F.ring, st.turn, e.g)
      elseif st.fate == 'park' then
        redis.call('ZADD', F.ring, -1, e.g)
      else
        redis.call('ZREM', F.ring, e.g)
      end
      if st.taken > 0 then
        redis.call('HINCRBY', F.groups, 'r:' .. e.g, st.taken)
      elseif st.fate == 'drop' and st.running <= 0 then
        -- Out of the ring with nothing running: its count (kept at 0 while it was in the
        -- ring, see fair_release) goes.
        redis.call('HDEL', F.groups, 'r:' .. e.g)
      end
    end
  end
  if P.steps > 0 then redis.call('HSET', F.groups, 'turn', P.turn, 'uturn', P.uturn) end
end
local function fair_pick(F, ready_key, jobs_key, want)
  local P = pick_read(F, ready_key, want)
  pick_choose(F, P)
  local kept, err = pick_records(jobs_key, P)
  if err then return nil, nil, nil, err end
  pick_write(F, ready_key, P)
  local left = P.qi <= #P.entries or P.ai <= #P.again or P.more or P.pi <= #P.plain or P.li <= #P.lane
    or #P.plain == want
  return kept, left, P.steps >= P.budget and #P.picks < want
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
-- lua/include/reclaim.lua (each helper's note is there)
local MAINTENANCE_INTERVAL_MS = 50
local function read_leases(jobs_key, source_key, receipts)
  local leases, ids = {}, {}
  for i, receipt in ipairs(receipts) do
    local lease = parse_receipt(receipt)
    if not lease then return nil, nil, 'PQ_CORRUPT malformed receipt in ' .. source_key end
    leases[i], ids[i] = lease, lease.id
  end
  local records = hmget(jobs_key, ids)
  for i, lease in ipairs(leases) do
    if records[i] then
      local _, max_attempts, _, at, enqueued_ms = parse_record(records[i])
      if not max_attempts then return nil, nil, 'PQ_CORRUPT unparsable record in ' .. jobs_key end
      lease.max, lease.record, lease.payload_at, lease.enqueued_ms = max_attempts, records[i], at, enqueued_ms
    end
  end
  return leases, ids
end
local function reclaim(K, F, fair, leases, metas, now_ms, why, counter, bound)
  local receipts, rewritten, dead_args, error_args, back, back_metas = {}, {}, {}, {}, {}, {}
  for i, lease in ipairs(leases) do
    receipts[i] = lease.receipt
    if lease.max then
      rewritten[#rewritten + 1] = lease.id
      rewritten[#rewritten + 1] = record_head(lease.attempt, lease.max, now_ms, lease.enqueued_ms)
        .. string.sub(lease.record, lease.payload_at)
      if lease.attempt >= lease.max then
        dead_args[#dead_args + 1], dead_args[#dead_args + 2] = now_ms, lease.id
        error_args[#error_args + 1] = lease.id
        error_args[#error_args + 1] = string.format('%s on attempt %d of %d', why, lease.attempt, lease.max)
      else
        back[#back + 1] = lease.id
        back_metas[#back] = fair and metas[i] or false
      end
    end
  end
  -- A removal first: at its memory limit Redis refuses a script only at a first write
  -- that may grow memory, so a full server still reclaims (and frees) what it moves.
  call_chunked('ZREM', K.leased, receipts)
  call_chunked('ZREM', K.owners, receipts)
  redis.call('HINCRBY', K.counters, counter, #receipts)
  if #rewritten > 0 then call_chunked('HSET', K.jobs, rewritten) end
  if #dead_args > 0 then
    call_chunked('ZADD', K.dead, dead_args)
    call_chunked('HSET', K.errors, error_args)
    redis.call('HINCRBY', K.counters, 'dead', #dead_args / 2)
  end
  local woke = fair and fair_release(F, metas)
  emit_failed(K.events, bound, leases, now_ms, why)
  return back, back_metas, woke
end
local function dead_sequences(K, leases, flag)
  if not flag then return NONE end
  local ids = {}
  for _, lease in ipairs(leases) do
    if lease.max and lease.attempt >= lease.max then ids[#ids + 1] = lease.id end
  end
  return sequence_dead_read(K, ids, flag)
end
local function earliest_due_ms(scheduled_key, leased_key)
  local due = -1
  local s = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
  local l = redis.call('ZRANGE', leased_key, 0, 0, 'WITHSCORES')
  if s[2] then due = tonumber(s[2]) end
  if l[2] and (due < 0 or tonumber(l[2]) < due) then due = tonumber(l[2]) end
  return due
end
-- <<< pyqueue includes

-- The call's keys, and its state: each field of C is set by the step named beside it and
-- read by the steps after it; no step before prove_types writes a key. The steps take C,
-- K and F as arguments, not as upvalues: Redis runs the whole script each call, so every
-- upvalue of every local function is bound again each time (about 40 ns each), and the
-- steps would name some 180 of them.
local F = fair_keys(11)
local K = { jobs = jobs_key, ready = ready_key, scheduled = scheduled_key, leased = leased_key }
K.owners, K.dead, K.errors, K.counters, K.wake = owners_key, dead_key, errors_key, counters_key, wake_key
K.done, K.events, K.steps, K.waiting = done_key, events_key, steps_key, waiting_key
K.expires, K.expired, K.keyed, K.sequenced, K.windows = expires_key, expired_key, keyed_key, sequenced_key, windows_key
K.index = index_key
-- One constructor with every field, so that the table is made at its size at once.
local C = {
  -- read_args: the arguments, and the job id of each receipt to ack.
  owner = false, call = false, count = 0, lease_ms = 0, limit = 0, keep_done_ms = 0, now_ms = false, n_acks = 0,
  ack_ids = {},
  -- ack_statuses: the receipts acked 'ok', their ids, and whether every receipt was.
  to_ack = {}, acked_ids = {}, all_acked = true,
  -- The reply, built as the steps go: {now_ms, next_due_ms, r, status_1 .. status_r, m,
  -- job_1 .. job_m}; add_lease puts each job's 8 values after the count m at index at0.
  reply = false, at0 = 0, m = 0,
  -- Which keys a read has proven to hold the right type: prove_types probes the others
  -- the call writes. The busy path reads every key it writes.
  jobs_read = false, ready_read = false, scheduled_read = false, leased_read = false, owners_read = false,
  -- The stream's bound (false: not opted in), whether the queue is fair, the acked jobs'
  -- meta, their step data to delete (false: the queue has none; steps_of), and the
  -- tombstones expired (counted before any write).
  bound = false, fair = false, ack_metas = NONE, forgot = false, expired_done = 0,
  -- Whether the queue has expiries (counters `expiry`), and the ids expire_read ended.
  expiry = false, expired = NONE, unlisted = NONE,
  -- Whether it has sequences (`sequences`), rate keys (`rates`) or sizes (`sized`), and
  -- the acked and the expired jobs' entries in `keyed` (forget_read, expire_read: keyed_read).
  sequences = false, rates = false, sized = false, indexed = false, ended = NONE, expired_ended = NONE, dead_ended = NONE,
  -- The rate check's plan (rate_read; NONE: nothing to write) and its deferred ids.
  rated = NONE, deferred = NONE,
  -- The plan: the counters read (fence0, paused, want; R from rate_cut), maintain_read,
  -- read_moved_metas (id -> meta of each job maintenance moves, in a fair queue), choose.
  fence0 = 0, paused = false, R = false, want = 0, deadline_ms = 0,
  ready_head = NONE, promoted = NONE, reclaimed = NONE, to_dead = NONE, stopped_at_limit = false,
  moved_metas = {}, order = NONE, back_leases = NONE, n_back = 0, take = 0,
  -- add_lease: the ZADD arguments of `leased` and `owners`.
  leased_args = {}, owner_args = {},
}

-- Validate every argument before touching a key. Answers nil or a PQ_BADARG text.
local function read_args(C)
  local err
  C.owner, C.call = ARGV[2], ARGV[3]
  err = name_arg(C.owner, 'owner') or name_arg(C.call, 'call')
  if err then return err end
  C.count, err = int_arg(ARGV[4], 'count', 0, MAX_BATCH)
  if err then return err end
  C.lease_ms, err = int_arg(ARGV[5], 'lease_ms', 1, 604800000)
  if err then return err end
  C.limit, err = int_arg(ARGV[6], 'limit', 1, MAX_BATCH)
  if err then return err end
  C.keep_done_ms, err = int_arg(ARGV[7], 'keep_done_ms', 0, 2 ^ 40)
  if err then return err end
  C.now_ms, err = now_arg(ARGV[1])
  if err then return err end
  C.n_acks = #ARGV - 7
  if C.n_acks > MAX_BATCH then return 'PQ_BADARG at most 1000 receipts per call' end
  for i = 1, C.n_acks do
    C.ack_ids[i] = receipt_id(ARGV[7 + i])
    if not C.ack_ids[i] then return 'PQ_BADARG malformed receipt ' .. string.format('%q', ARGV[7 + i]) end
  end
end

-- What the acks need: a receipt still in `leased` is the current lease. Each status
-- goes into the reply now. A receipt repeated in this call is acked once.
local function ack_statuses(C, K)
  local acking = C.n_acks > 1 and {} or nil
  C.leased_read = C.n_acks > 0
  for i = 1, C.n_acks do
    local receipt, status = ARGV[7 + i], 'gone'
    if acking and acking[receipt] then
      C.all_acked = false
    elseif redis.call('ZSCORE', K.leased, receipt) then
      status = 'ok'
      C.to_ack[#C.to_ack + 1], C.acked_ids[#C.acked_ids + 1] = receipt, C.ack_ids[i]
      if acking then acking[receipt] = true end
    else
      C.all_acked = false
      C.jobs_read = true
      if redis.call('HEXISTS', K.jobs, C.ack_ids[i]) == 1 then status = 'stale' end
    end
    C.reply[3 + i] = status
  end
end

-- One lease into the reply (its 8 values) and into the ZADD arguments that record it
-- (write_leases; a replay's are not written again). `sent` is the job's enqueued_ms, or
-- nil for a record written before contract v5 (answered as -1).
local function add_lease(C, receipt, id, payload, fence, attempt, max_attempts, deadline, sent)
  local o = C.at0 + 8 * C.m
  C.reply[o + 1], C.reply[o + 2], C.reply[o + 3], C.reply[o + 4] = receipt, id, payload, fence
  C.reply[o + 5], C.reply[o + 6], C.reply[o + 7], C.reply[o + 8] = attempt, max_attempts, deadline, sent or -1
  C.m = C.m + 1
  C.leased_args[2 * C.m - 1], C.leased_args[2 * C.m] = deadline, receipt
  C.owner_args[2 * C.m - 1], C.owner_args[2 * C.m] = 0, receipt
end

-- A new lease of job `id` (its record, where its payload starts, and when it was sent):
-- the next fence of the queue's `leased` counter, and the call's deadline.
local function new_lease(C, id, record, attempt, max_attempts, at, sent)
  local fence = C.fence0 + C.m + 1
  local receipt = string.format('%s|%s|%d|%d|', C.owner, C.call, fence, attempt) .. id
  add_lease(C, receipt, id, string.sub(record, at), fence, attempt, max_attempts, C.deadline_ms, sent)
end

-- The acked jobs' step data, when the queue has any (counters `steps`), and their
-- entries in `keyed`, when it has sequences or rate keys (`sequences`, `rates`); the
-- flags are read here when not given. Answers nil or an error text.
local function forget_read(C, K, steps_flag, keyed_flag)
  if steps_flag == nil then
    local flags = redis.call('HMGET', K.counters, 'steps', 'sequences', 'rates', 'sized', 'indexed')
    steps_flag, keyed_flag = flags[1], flags[2] or flags[3] or flags[4] or flags[5]
  end
  local err
  if steps_flag then
    C.forgot = {}
    C.forgot[1], C.forgot[2], err = steps_of(K.steps, K.waiting, C.acked_ids)
  end
  if not err and keyed_flag then C.ended, err = keyed_read(K, C.acked_ids) end
  return err
end

-- The acks' writes; ZREM on `owners` is their first (see prove_types).
local function write_acks(C, K, F)
  write_acked(K, F, C.to_ack, C.acked_ids, C.fair, C.ack_metas, C.expired_done, C.now_ms, C.keep_done_ms, C.bound,
    C.forgot, C.ended)
end

-- A replay: hand back the leases the first run of this (owner, call) made, unchanged,
-- and lease nothing more; the acks are written as usual. Every key written was read
-- (`owners` by the replay check), so its type is proven, but for the fair-scheduling
-- keys when an acked job has meta.
local function replay(C, K, F, prior)
  local ids, deadlines = {}, {}
  for i, receipt in ipairs(prior) do
    local lease = parse_receipt(receipt)
    if not lease then return 'PQ_CORRUPT malformed receipt in ' .. K.owners end
    prior[i], ids[i] = lease, lease.id
    deadlines[i] = redis.call('ZSCORE', K.leased, receipt)
  end
  local records = hmget(K.jobs, ids)
  for i, lease in ipairs(prior) do
    local attempts, max_attempts, _, at, sent = parse_record(records[i] or '')
    if not attempts or not deadlines[i] then
      return 'PQ_CORRUPT ' .. K.owners .. ' lists a lease without a valid job or deadline'
    end
    add_lease(C, lease.receipt, lease.id, string.sub(records[i], at), lease.fence, lease.attempt, max_attempts,
      tonumber(deadlines[i]), sent)
  end
  if #C.to_ack == 0 then return nil end
  local err
  C.ack_metas, err, C.fair = fair_meta(F, C.acked_ids)
  err = err or C.fair and (fair_types(F) or expect_type(K.wake, 'zset'))
  if not err then C.bound, err = events_bound(K.counters, K.events) end
  if not err then err = forget_read(C, K) end
  if err then return err end
  write_acks(C, K, F)
end

-- Under a rate limit (limit.lua's GCRA): a permit every `spacing` ms; `tat` is when the
-- next would be due if none were banked; up to `burst` are banked after a quiet spell.
-- Cuts `count` to the permits due now; answers the limit's state.
local function rate_cut(C, K, rate_limit, rate_tat)
  local per, period_ms, burst = string.match(rate_limit, '^(%d+)/(%d+)/(%d+)$')
  if not per then return nil, 'PQ_CORRUPT unparsable rate_limit in ' .. K.counters end
  local limited = { spacing = tonumber(period_ms) / tonumber(per) }
  limited.burst_ms = tonumber(burst) * limited.spacing
  limited.tat = math.max(tonumber(rate_tat or '0') or 0, C.now_ms)
  -- The small epsilon keeps float rounding from losing a whole permit.
  local permits = math.max(0, math.floor((C.now_ms + limited.burst_ms - limited.tat) / limited.spacing + 1e-9))
  if permits < C.count then C.count, limited.cut = permits, true end
  return limited
end

-- Maintenance's reads: due SCHEDULED jobs to promote, and expired leases to reclaim
-- (not those this call acks), each up to `limit`; a reclaimed lease at its last attempt
-- goes to DEAD.
local function maintain_read(C, K)
  C.reclaimed, C.to_dead = {}, {}
  -- Expired tombstones, trimmed below even when nothing is acked: an idle or drained
  -- queue gets no acks, and its tombstones must not hold memory for good.
  if #C.to_ack == 0 then C.expired_done = redis.call('ZCOUNT', K.done, '-inf', C.now_ms) end
  C.promoted = redis.call('ZRANGEBYSCORE', K.scheduled, '-inf', C.now_ms, 'LIMIT', 0, C.limit)
  local expired = redis.call('ZRANGEBYSCORE', K.leased, '-inf', C.now_ms, 'LIMIT', 0, C.limit + #C.to_ack)
  C.scheduled_read, C.leased_read = true, true
  C.stopped_at_limit = #C.promoted == C.limit
  local acked_now, candidates = {}, {}
  for _, receipt in ipairs(C.to_ack) do acked_now[receipt] = true end
  for _, receipt in ipairs(expired) do
    if not acked_now[receipt] and #candidates < C.limit then candidates[#candidates + 1] = receipt end
  end
  if #candidates == C.limit then C.stopped_at_limit = true end
  local leases, _, err = read_leases(K.jobs, K.leased, candidates)
  if err then return err end
  if #candidates > 0 then C.jobs_read = true end
  for _, lease in ipairs(leases) do
    if lease.max and lease.attempt >= lease.max then
      C.to_dead[#C.to_dead + 1] = lease
    else
      -- (A lease without a job record, its job removed by another program, is dropped.)
      C.reclaimed[#C.reclaimed + 1] = lease
    end
  end
  -- A head of a sequence with the policy skip that goes dead hands its key on.
  if #C.to_dead > 0 then C.dead_ended, err = dead_sequences(K, C.to_dead, C.sequences) end
  return err
end

-- In a fair queue: the meta of every job maintenance moves, read before any write.
local function read_moved_metas(C, F)
  local moved = {}
  for _, id in ipairs(C.promoted) do moved[#moved + 1] = id end
  for _, lease in ipairs(C.reclaimed) do moved[#moved + 1] = lease.id end
  for _, lease in ipairs(C.to_dead) do moved[#moved + 1] = lease.id end
  local metas, err = fair_meta(F, moved)
  if err then return err end
  for i, id in ipairs(moved) do C.moved_metas[id] = metas[i] end
end

-- What to lease: READY after maintenance reads reclaimed (earliest deadline first)
-- ++ READY's head ++ promoted, and the first `take` are leased. Items 1..n_back of
-- `order` are the reclaimed leases that go back (back_leases).
local function choose(C)
  C.order = C.ready_head
  if #C.reclaimed > 0 then
    C.back_leases = {}
    for _, lease in ipairs(C.reclaimed) do
      if lease.max then C.back_leases[#C.back_leases + 1] = lease end
    end
  end
  C.n_back = #C.back_leases
  if C.n_back + #C.promoted > 0 then
    C.order = {}
    for i, lease in ipairs(C.back_leases) do C.order[i] = lease.id end
    for _, id in ipairs(C.ready_head) do C.order[#C.order + 1] = id end
    for _, id in ipairs(C.promoted) do C.order[#C.order + 1] = id end
  end
  C.take = math.min(C.count, #C.order)
end

-- Of jobs about to be leased (`ids`, in a queue with expiries), those past their
-- deadline in `expires`: answers a set (id -> true) of them, listed in C.expired; every
-- id found in `expires` is listed in C.unlisted (its entry goes: it expires or starts).
-- A job leased before has no entry (its first lease removed it).
local function expire_read(C, K, ids)
  local deadlines = redis.call('ZMSCORE', K.expires, unpack(ids))
  local out = {}
  for i, id in ipairs(ids) do
    if deadlines[i] then
      if C.unlisted == NONE then C.unlisted, C.expired = {}, {} end
      C.unlisted[#C.unlisted + 1] = id
      if tonumber(deadlines[i]) <= C.now_ms then
        out[id] = true
        C.expired[#C.expired + 1] = id
      end
    end
  end
  -- The worker asks again at once for the jobs it did not get (next_due).
  if #C.expired > 0 then C.stopped_at_limit = true end
  -- An expired head hands its sequence's key on, and a rate entry goes (write_expired).
  if (C.sequences or C.rates or C.sized or C.indexed) and #C.expired > 0 then
    local err
    C.expired_ended, err = keyed_read(K, C.expired)
    if err then return nil, err end
  end
  return out
end

-- The `expires` entries read, and the expired jobs' end (expire_jobs).
local function write_expired(C, K)
  if C.unlisted == NONE then return end
  call_chunked('ZREM', K.expires, C.unlisted)
  if #C.expired > 0 then expire_jobs(K, C.expired, C.now_ms, C.keep_done_ms, C.bound) end
  if #C.expired_ended > 0 then keyed_end(K, C.expired_ended) end
end

-- The rate check (rate_read) of the jobs about to be leased, `plans` ({id, ...}), in
-- a queue with rate keys: sets C.rated and C.deferred. A deferred job keeps its expiry:
-- it has not started (its `expires` entry stays). Answers nil or an error text.
local function rate_check(C, K, plans)
  local ids = {}
  for i, p in ipairs(plans) do ids[i] = p.id end
  local R, err = rate_read(K, ids, C.now_ms)
  if err then return err end
  if R == NONE then return nil end
  C.rated, C.deferred = R, R.deferred
  if R.n_deferred == 0 then return nil end
  -- The worker asks again at once for the jobs it did not get (next_due).
  C.stopped_at_limit = true
  if C.unlisted ~= NONE then
    local kept = {}
    for _, id in ipairs(C.unlisted) do
      if not C.deferred[id] then kept[#kept + 1] = id end
    end
    C.unlisted = kept
  end
end

-- The leases of the chosen jobs, all decided before any write but the pop: a corrupt
-- record is an error while that is all there is to undo. Reads the records maintenance
-- has not, and, in a queue with expiries, the deadlines of the jobs not reclaimed; in a
-- queue with rate keys, checks the jobs left (rate_check).
local function plan_leases(C, K)
  local records, expired = NONE, NONE
  if C.take > C.n_back then
    local need = {}
    for i = C.n_back + 1, C.take do need[i - C.n_back] = C.order[i] end
    records = hmget(K.jobs, need)
    C.jobs_read = true
    if C.expiry then
      local err
      expired, err = expire_read(C, K, need)
      if err then return err end
    end
  end
  local plans = {}
  for i = 1, C.take do
    local record, attempt, max_attempts, at, sent, _
    if i <= C.n_back then
      -- The record is rewritten by reclaim with the expired lease's attempt.
      local lease = C.back_leases[i]
      record, attempt, max_attempts, at, sent = lease.record, lease.attempt + 1, lease.max, lease.payload_at,
        lease.enqueued_ms
    else
      record = records[i - C.n_back]
      local attempts
      attempts, max_attempts, _, at, sent = parse_record(record or '')
      if record and not attempts then return 'PQ_CORRUPT unparsable record for job in ' .. K.jobs end
      attempt = attempts and attempts + 1
    end
    -- An id in READY without a record (removed by another program) is popped and dropped;
    -- an expired one is popped and ends (write_expired).
    if attempt and not expired[C.order[i]] then
      plans[#plans + 1] = { id = C.order[i], record = record, attempt = attempt, max = max_attempts, at = at,
        sent = sent }
    end
  end
  local err = C.rates and rate_check(C, K, plans)
  if err then return err end
  for _, p in ipairs(plans) do
    -- A deferred job is popped and scheduled at its permit's time (write_rates).
    if not C.deferred[p.id] then new_lease(C, p.id, p.record, p.attempt, p.max, p.at, p.sent) end
  end
end

-- Prove the types of the keys the call writes (or reads after writing, `read_after`)
-- that no read has proven. `owners` needs no probe when this call acks: ZREM on it is
-- then the acks' first write, and if that key held another type, the error would come
-- before anything but the pop was written, which the caller undoes (one command less
-- per job).
local function prove_types(C, K, F, read_after)
  local write_jobs = #C.to_ack > 0 or #C.reclaimed + #C.to_dead > 0
  local write_ready = C.take > 0 or C.n_back + #C.promoted > 0
  local write_leased = #C.to_ack > 0 or C.m > 0 or #C.reclaimed + #C.to_dead > 0 or read_after
  local write_owners = #C.to_ack == 0 and (C.m > 0 or #C.reclaimed + #C.to_dead > 0)
  local err = write_jobs and not C.jobs_read and expect_type(K.jobs, 'hash')
    or write_ready and not C.ready_read and expect_type(K.ready, 'list')
    or write_leased and not C.leased_read and expect_type(K.leased, 'zset')
    or write_owners and not C.owners_read and expect_type(K.owners, 'zset')
    or read_after and not C.scheduled_read and expect_type(K.scheduled, 'zset')
    or #C.to_dead > 0 and (expect_type(K.dead, 'zset') or expect_type(K.errors, 'hash'))
    -- Expiries: the fair pick reads `expires` after the writes have begun, so a fair queue
    -- proves all three keys up front.
    or (#C.expired > 0 or C.expiry and C.fair) and (expect_type(K.expired, 'zset') or expect_type(K.done, 'zset'))
    or C.expiry and C.fair and expect_type(K.expires, 'zset')
    -- (and a fair pick's expired head hands its key on: keyed_read probes after writes)
    or C.expiry and C.fair and C.sequences and (expect_type(K.sequenced, 'zset') or expect_type(K.scheduled, 'zset')
      or expect_type(K.wake, 'zset'))
    or C.expiry and C.fair and C.indexed and expect_type(K.index, 'zset')
    -- Rate keys: the check's reads proved `keyed`; it writes `windows` and `scheduled`. A
    -- fair pick checks after the writes have begun, so a fair queue proves `keyed` and
    -- `windows` here (and `scheduled` below).
    or C.rated ~= NONE and (expect_type(K.windows, 'zset')
      or C.rated.n_deferred > 0 and not C.scheduled_read and expect_type(K.scheduled, 'zset'))
    or (C.rates or (C.sized or C.indexed) and C.expiry) and C.fair and (expect_type(K.keyed, 'hash')
      or C.rates and expect_type(K.windows, 'zset'))
    or nil
  -- A fair queue proves every key it may write, or read after writing, that no read
  -- above has proven (`ready`, `gready` and `leased` are; `meta` when acks read it;
  -- `owners` needs none when ZREM on it is the first write; `jobs` not twice): a few
  -- TYPE calls, paid only by queues with groups or priorities.
  return err or C.fair and ((#C.to_ack == 0 and expect_type(F.meta, 'hash')) or expect_type(F.ring, 'zset')
    or expect_type(F.groups, 'hash') or (not C.jobs_read and not write_jobs and expect_type(K.jobs, 'hash'))
    or (not C.scheduled_read and expect_type(K.scheduled, 'zset'))
    or (#C.to_ack == 0 and not C.owners_read and expect_type(K.owners, 'zset')) or expect_type(K.wake, 'zset'))
    or nil
end

-- Maintenance's writes (nothing when nothing is due: an idle call stays read-only):
-- promoted jobs leave SCHEDULED; reclaimed leases end, those at their last attempt to
-- DEAD (reclaim; what goes back to READY is put_back's); READY busy or not, the next
-- maintenance is due in MAINTENANCE_INTERVAL_MS, written only after another write (never
-- a growing first write).
local function write_maintenance(C, K, F, wrote)
  if #C.promoted > 0 then call_chunked('ZREM', K.scheduled, C.promoted) end
  local ended, ended_metas = {}, {}
  for _, lease in ipairs(C.reclaimed) do ended[#ended + 1] = lease end
  for _, lease in ipairs(C.to_dead) do ended[#ended + 1] = lease end
  if #ended > 0 then
    for i, lease in ipairs(ended) do ended_metas[i] = C.moved_metas[lease.id] or false end
    reclaim(K, F, C.fair, ended, ended_metas, C.now_ms, 'lease expired', 'reclaimed', C.bound)
    if #C.dead_ended > 0 then keyed_end(K, C.dead_ended) end
  end
  if #C.promoted > 0 then redis.call('HINCRBY', K.counters, 'promoted', #C.promoted) end
  if wrote or #C.promoted + #ended > 0 then
    redis.call('HSET', K.counters, 'next_maintenance_ms', C.now_ms + MAINTENANCE_INTERVAL_MS)
  end
end

-- The moved jobs this call does not lease go back to READY: reclaimed ones to its head
-- (earliest deadline first), promoted ones to its tail; in a fair queue a job with meta
-- goes to `gready` instead (fair_ready).
local function put_back(C, K, F)
  local head_back, tail_back, left = {}, {}, {}
  -- The popped ids not leased, in their order (maintenance's reclaimed jobs go first).
  for i = math.max(C.take, C.n_back) + 1, C.n_back + #C.ready_head do left[#left + 1] = C.order[i] end
  for i = C.take + 1, C.n_back do head_back[#head_back + 1] = C.order[i] end
  if #C.promoted > 0 then
    for i = math.max(C.take, C.n_back + #C.ready_head) + 1, #C.order do tail_back[#tail_back + 1] = C.order[i] end
  end
  if C.fair then
    local metas = {}
    for i, id in ipairs(head_back) do metas[i] = C.moved_metas[id] or false end
    fair_ready(K.ready, F, head_back, metas, true)
    metas = {}
    for i, id in ipairs(tail_back) do metas[i] = C.moved_metas[id] or false end
    fair_ready(K.ready, F, tail_back, metas, false)
  else
    push_ready(K.ready, left, true)
    push_ready(K.ready, head_back, true)
    push_ready(K.ready, tail_back, false)
  end
end

-- The fair pick (fair_pick), now that maintenance has made its jobs READY: leases up to
-- `want`, and wakes another worker when leasable work is left after a plain lease.
local function fair_lease(C, K, F)
  local picks, left, short, err = fair_pick(F, K.ready, K.jobs, C.want)
  if err then return err end
  local expired, gone, gone_metas = NONE, {}, {}
  if C.expiry and #picks > 0 then
    local ids = {}
    for k, pick in ipairs(picks) do ids[k] = pick.id end
    expired, err = expire_read(C, K, ids)
    if err then return err end
  end
  local plans, back_metas = {}, {}
  for _, pick in ipairs(picks) do
    if expired[pick.id] then
      -- Picked, so its group's slot was taken: an expired job gives it back (fair_finish).
      gone[#gone + 1], gone_metas[#gone + 1] = pick.id, pick.member and { group = pick.group or '' } or false
    else
      local attempts, max_attempts, _, at, sent = parse_record(pick.record)
      plans[#plans + 1] = { id = pick.id, record = pick.record, attempt = attempts + 1, max = max_attempts, at = at,
        sent = sent, meta = pick.member and { group = pick.group or '' } or false }
    end
  end
  if C.rates and #plans > 0 then
    err = rate_check(C, K, plans)
    if err then return err end
  end
  for _, p in ipairs(plans) do
    if C.deferred[p.id] then
      -- Deferred: its group's slot goes back, its meta stays (a scheduled job's).
      back_metas[#back_metas + 1] = p.meta
    else
      new_lease(C, p.id, p.record, p.attempt, p.max, p.at, p.sent)
    end
  end
  if #gone > 0 then fair_finish(F, gone, gone_metas, K.wake) end
  if #back_metas > 0 and fair_release(F, back_metas) then redis.call('ZADD', K.wake, 0, 'wake') end
  C.stopped_at_limit = C.stopped_at_limit or short
  if C.n_acks == 0 and left and not C.paused and not (C.R and C.R.cut) and not redis.call('ZSCORE', K.wake, 'wake') then
    redis.call('ZADD', K.wake, 0, 'wake')
  end
end

-- The leases' writes: the fence counter, `leased` and `owners`, their events.
local function write_leases(C, K)
  redis.call('HINCRBY', K.counters, 'leased', C.m)
  call_chunked('ZADD', K.leased, C.leased_args)
  call_chunked('ZADD', K.owners, C.owner_args)
  if not C.bound then return end
  for k = 1, C.m do
    local o = C.at0 + 8 * (k - 1)
    emit(K.events, C.bound, 'leased', C.reply[o + 2], C.now_ms, 'attempt', C.reply[o + 5], 'owner', C.owner,
      'deadline_ms', string.format('%d', C.deadline_ms))
  end
end

-- The reply's next_due_ms (see the header).
local function next_due(C, K)
  if C.R and C.R.cut and C.m == C.want then
    -- Every permit due was used: the next one is due when tat is within a burst of now.
    return math.ceil(C.R.tat + C.R.spacing - C.R.burst_ms)
  elseif C.m >= C.want then
    return -1
  elseif C.stopped_at_limit then
    return C.now_ms
  end
  return earliest_due_ms(K.scheduled, K.leased)
end

-- Steps 3 and 4 after the pop (see below): maintenance's reads, the plan, the proofs,
-- then the writes. Answers an error text, or nil once the reply is complete.
local function after_pop(C, K, F, maintenance_due, fair_short)
  local maintain = (C.count > 0 and #C.ready_head < C.count) or fair_short or C.now_ms >= maintenance_due
  local err
  if maintain then err = maintain_read(C, K) end
  if not err and C.fair and #C.promoted + #C.reclaimed + #C.to_dead > 0 then err = read_moved_metas(C, F) end
  if err then return err end
  choose(C)
  C.deadline_ms = C.now_ms + C.lease_ms
  err = plan_leases(C, K)
  if err then return err end
  -- Wake another worker when work is left over after a plain lease: the wake marker woke
  -- one worker only. A worker that acks and leases is busy and comes back by itself.
  -- (A pop that took all `count` asked for left READY holding more, or nothing.)
  local wake = C.n_acks == 0 and not C.paused and not (C.R and C.R.cut)
    and (#C.order > C.take or C.count > 0 and #C.ready_head == C.count and redis.call('LLEN', K.ready) > 0)
  -- next_due_ms is read from SCHEDULED and LEASED after the writes when fewer than count
  -- are leased, so those reads must be proven too.
  err = prove_types(C, K, F, C.m < C.count and not C.stopped_at_limit)
  if err then return err end
  -- The marker's read proves `wake` a zset, and spares the write when it is already up.
  wake = wake and not redis.call('ZSCORE', K.wake, 'wake')

  -- The writes: acks, maintenance, put back, the fair pick, the leases.
  if #C.to_ack > 0 then
    write_acks(C, K, F)
  elseif maintain then
    trim_done(K.done, C.expired_done, MAX_BATCH)
  end
  if maintain then write_maintenance(C, K, F, #C.to_ack + #C.ready_head > 0) end
  put_back(C, K, F)
  if C.fair and C.want > 0 then
    err = fair_lease(C, K, F)
    if err then return err end
  end
  write_expired(C, K)
  rate_write(K, C.rated, C.now_ms, C.bound)
  if C.m > 0 then write_leases(C, K) end
  if wake then redis.call('ZADD', K.wake, 0, 'wake') end
  -- Spend the permits. Written after the leases (never a growing first write).
  if C.R and C.m > 0 then
    C.R.tat = C.R.tat + C.m * C.R.spacing
    redis.call('HSET', K.counters, 'rate_tat', string.format('%.3f', C.R.tat))
  end
  C.reply[2] = next_due(C, K)
  C.reply[C.at0] = C.m
end

-- The call: the steps above, in order: read_args, ack_statuses, replay (2), rate_cut,
-- then step 4's pop from READY (LPOP: the first write), then after_pop: maintain_read,
-- choose, plan_leases, prove_types (nothing else is written before it has passed), then
-- the writes: write_acks (1), write_maintenance and put_back (3: with the popped ids not
-- leased), fair_lease, write_leases (4). An error after the pop, answered or raised by
-- Redis, pushes the popped ids back: no error leaves the queue changed but as Errors says.
local contract_error = contract('lease', 23, 7, 7 + MAX_BATCH)
if contract_error then return redis.error_reply(contract_error) end
local err = read_args(C)
if err then return redis.error_reply(err) end
C.reply, C.at0 = { 0, -1, C.n_acks }, 4 + C.n_acks
ack_statuses(C, K)
C.reply[C.at0] = 0 -- the count of jobs, set at the end; a placeholder keeps the reply one array

-- The replay check. A call whose acks all succeeded cannot be a replay (the first run
-- would have removed them), so the busy path skips this read.
local prior = NONE
if C.count > 0 and (C.n_acks == 0 or not C.all_acked) then
  local from = C.owner .. '|' .. C.call
  prior = redis.call('ZRANGEBYLEX', K.owners, '[' .. from .. '|', '(' .. from .. '}', 'LIMIT', 0, C.count)
  C.owners_read = true
end
C.now_ms = C.now_ms or server_now_ms()
C.reply[1] = C.now_ms
-- Expired tombstones, counted before any write (ZCOUNT also proves `done` is a zset).
C.expired_done = #C.to_ack > 0 and redis.call('ZCOUNT', K.done, '-inf', C.now_ms) or 0

if #prior > 0 then
  err = replay(C, K, F, prior)
  if err then return redis.error_reply(err) end
  C.reply[C.at0] = C.m
  return C.reply
end

-- The plan's first read: counters. `paused` (pause.lua), the rate limit's fields
-- (limit.lua), `fair` (set by enqueue.lua for a job with a group or a priority) and
-- `events` (the stream's bound) come with the fields read anyway: a queue without them
-- pays no command for their checks.
local counters = redis.call('HMGET', K.counters, 'leased', 'next_maintenance_ms', 'paused', 'rate_limit', 'rate_tat',
  'fair', 'events', 'steps', 'expiry', 'sequences', 'rates', 'sized', 'indexed', 'done_max')
C.bound, err = events_bound(K.counters, K.events, counters[7])
if err then return redis.error_reply(err) end
C.fence0 = tonumber(counters[1] or '0') or 0
local maintenance_due = tonumber(counters[2] or '0') or 0
-- Paused: lease nothing (acks, promotion and reclaim go on) and answer next_due_ms -1:
-- workers wait for the marker that resume.lua raises.
C.paused = counters[3] ~= false
if C.paused then C.count = 0 end
if counters[4] and C.count > 0 then
  C.R, err = rate_cut(C, K, counters[4], counters[5])
  if err then return redis.error_reply(err) end
end
-- A fair queue leases by fair_lease after maintenance is written: the steps below run
-- with count 0, and `want` is what the call asked for (after pause and rate limit).
C.fair, C.want = counters[6] ~= false, C.count
C.expiry, C.sequences, C.rates = counters[9] ~= false, counters[10] ~= false, counters[11] ~= false
C.sized, C.indexed = counters[12] ~= false, counters[13] ~= false
-- The tombstone limit (set_tombstone_limit.lua), kept by the acks' and expiries' bury.
K.done_most = tonumber(counters[14] or '')
if #C.to_ack > 0 then
  err = forget_read(C, K, counters[8], C.sequences or C.rates or C.sized or C.indexed)
  if err then return redis.error_reply(err) end
end
local fair_short = false
if C.fair then
  if #C.to_ack > 0 then
    C.ack_metas, err = fair_meta(F, C.acked_ids)
    if err then return redis.error_reply(err) end
  end
  -- Maintenance also when a lease has expired: a group at its cap gets its slot back
  -- only when the lease is reclaimed, which must not wait for the maintenance timer.
  -- (These reads also prove `ready`, `gready` and `leased`.)
  local waiting = redis.call('LLEN', K.ready) + redis.call('ZCARD', F.gready)
  local expired_now = redis.call('ZCOUNT', K.leased, '-inf', C.now_ms)
  C.ready_read, C.leased_read = true, true
  fair_short = C.want > 0 and (waiting < C.want or expired_now > 0)
  C.count = 0
end
-- Step 4's pop from READY: LPOP removes, so Redis allows it at its memory limit, and it
-- is the call's first write. Everything after it runs under pcall: an error, answered
-- or raised by Redis (a key of another type), puts the popped ids back at READY's head,
-- so it still leaves the queue as it was.
if C.count > 0 then
  C.ready_head = redis.call('LPOP', K.ready, C.count) or NONE
  C.ready_read = true
end
local ok
ok, err = pcall(after_pop, C, K, F, maintenance_due, fair_short)
if not ok or err then
  push_ready(K.ready, C.ready_head, true)
  return redis.error_reply(tostring(err))
end
return C.reply
