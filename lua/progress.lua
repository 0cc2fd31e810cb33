--[[ progress: store a small progress value on a running job, under its current lease.

Fenced: only the job's current lease may write (its receipt still in `leased`), so a
zombie (a worker whose lease ended: acked, failed, expired, scrubbed or cancelled)
cannot. The value is opaque here (the task layer writes JSON); the latest one wins.
`progress_show.lua` reads it, and shows it only while the lease that wrote it runs: a
job leased again starts without progress.

Nothing else deletes an entry: the scripts that end leases do not take these keys. So
each call first looks at up to TRIM_BATCH + 1 entries, those looked at longest ago
(lowest `progress_at`): one whose lease has ended goes, one whose lease still runs gets
`progress_at` = now (so the next calls look at others). Every entry is looked at within
ceil(entries / 11) calls made in distinct milliseconds (entries of the same ms tie, and
ZRANGE orders ties by id): a queue whose jobs report progress keeps about one entry per
running job that reported, plus those left since the last calls (fewer than 11 more
than the running ones); when calls stop, what is left (at most the jobs that ran then)
stays until the next call. Cost: O(log n) per entry looked at, at most 11 + 1.

KEYS (5), all <prefix>:{<queue>}:<role>
  1 leased       zset  receipt -> deadline_ms (read only)
  2 progress     hash  id -> "<written_ms>|<bytes of receipt>|<receipt><value>"
  3 progress_at  zset  id -> ms it was written or last looked at by a trim
  4 counters     hash  read only: `events`, the event stream's bound (section 2.5)
  5 events       stream  the queue's events, when it has opted in: 'progress', with the
                     attempt and the value, when the value differs from the one this
                     lease stored last

ARGV (3)
  1  now_ms   '' (use the server clock) or integer >= 0; tests only
  2  receipt  the lease's "<owner>|<call>|<fence>|<attempt>|<id>" from lease
  3  value    0..4096 bytes

Returns  'ok' (stored: the receipt is the job's current lease), or 'stale' (it is not:
         nothing written, not even the trim).
Errors   PQ_BADARG (nothing written), WRONGTYPE (a key holds another Redis type;
         nothing written).
Replay   a re-sent call stores the same value again ('ok'), or answers 'stale' if the
         lease ended meanwhile: one effect either way.
Contract v4 (lua/README.md section 10): other counts of KEYS or ARGV than above answer
         PQ_CONTRACT, before anything is read or written.
]]

local leased_key, progress_key, progress_at_key = KEYS[1], KEYS[2], KEYS[3]

-- >>> pyqueue prelude: the same in every script; source tests/lua_prelude.lua, copied by tests/lua_prelude.py
-- Edit tests/lua_prelude.lua, then run `python tests/lua_prelude.py --write`; never edit a copy.
-- Every helper is in every script; an unused one is harmless and calls nothing.

local MAX_BATCH = 1000 -- per call at most this many jobs, receipts or ids; also the most count/limit
local CHUNK = 500 -- values per unpack(); keeps every redis.call well under Lua's C stack limit
local TRIM_BATCH = 10 -- expired tombstones are trimmed this many at a time, at least
local MAINTENANCE_INTERVAL_MS = 50 -- while READY is busy, maintenance still runs this often
local NONE = {} -- an empty list to read from; never written to, so no call allocates its own
local CONTRACT_VERSION = 4 -- of the KEYS and ARGV the headers list; lua/README.md section 10
local EVENT_TEXT_BYTES = 1024 -- an error text in an event is cut to this many bytes (section 2.5)
local WAIT_DUE_MS = 1125899906842624 -- 2^50: the due time of a job waiting for others (flow_wait.lua)

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

-- The queue's event stream (lua/README.md section 2.5): a queue opts in with the `events`
-- field of `counters`, the stream's length bound (set_events.lua). Returns the bound, or
-- nil when the queue has not opted in; or nil and a WRONGTYPE text when the stream key
-- holds another type. Called before any write. `value`: the field, when an HMGET of
-- `counters` read it already (false: absent); nil reads it here (one HGET).
local function events_bound(counters_key, events_key, value)
  if value == nil then value = redis.call('HGET', counters_key, 'events') end
  local bound = value and tonumber(value)
  if not bound or bound < 1 then return nil end
  local err = expect_type(events_key, 'stream')
  if err then return nil, err end
  return bound
end

-- Append one event when `bound` is set (section 2.5). Its ID is 0-<n>, n one more than
-- the last event's (Redis makes it), so a reader counts the events trimming took from it.
-- `...`: more field, value pairs (strings: a number of 15 digits or more must be passed
-- formatted with %d, see ack_result.lua). Called after the script's first write (never a
-- growing first write at the memory limit).
local function emit(events_key, bound, kind, id, now_ms, ...)
  if bound then
    redis.call('XADD', events_key, 'MAXLEN', bound, '0-*', 'type', kind, 'id', id, 'ms', string.format('%d', now_ms), ...)
  end
end

-- The 'acked' events of the `receipts` acked (`ids`: their jobs), in their order.
local function emit_acked(events_key, bound, receipts, ids, now_ms)
  if not bound then return end
  for i, receipt in ipairs(receipts) do
    emit(events_key, bound, 'acked', ids[i], now_ms, 'attempt', parse_receipt(receipt).attempt)
  end
end

-- The events of leases that ended in failure at now_ms: 'retried' (ready again now) or
-- 'dead' (attempts used up), with the error "<why> on attempt N of M", as the scripts
-- write it in `errors`: leases reclaimed at their deadline (lease.lua, promote.lua) and
-- scrubbed (scrub.lua). A lease without `max` (its job record was gone) has no event.
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
-- Fair scheduling (lua/README.md section 2.1). A job enqueued with a group or with a
-- priority other than 0 keeps a `meta` entry "<priority>|<pos>|<group>" for its whole
-- life (group '' = none). While READY it is not in the `ready` list but in `gready`, a
-- lexicographic zset of members "<group>|<rank>|<id>": rank is one character for the
-- priority ('0' for 5 .. ':' for -5, so higher first) and its 16-digit position `pos`
-- (tail: POS_MID + seq, head: POS_MID - seq). `ring` holds the groups with ready jobs:
-- score = turn (>= 1, lowest is served next) while one is believed to have a free
-- slot, -1 (parked) while it is at its cap. `groups` holds r:<group> (its leases
-- running), c:<group> (its own cap), cap (the default cap; 0 or absent: none), and the
-- counters turn, seq and uturn (the ungrouped jobs' last turn).
-- Only fair_keys, fair_meta and push_ready are made on every call; the other helpers
-- are made at their first use in a call (fair_lib, fair_enter_lib), so that a queue
-- without groups or priorities does not pay for making their closures.
local PRIORITY_MIN, PRIORITY_MAX = -5, 5
local POS_MID = 5000000000000000

-- The four fair-scheduling keys, from KEYS[first] on: the scripts that take them take them last.
local function fair_keys(first)
  return { meta = KEYS[first], gready = KEYS[first + 1], ring = KEYS[first + 2], groups = KEYS[first + 3] }
end

-- The meta of each of `ids` (one HMGET, which also proves `meta` a hash): {priority,
-- pos, group} per id, false for an id without one, and whether any id has one; or nil
-- and a PQ_CORRUPT text.
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

-- Push `ids` to the head of the `ready` list (`head`, in the order given) or its tail.
local function push_ready(ready_key, ids, head)
  if #ids > 0 and head then
    local reversed = {}
    for i = #ids, 1, -1 do reversed[#reversed + 1] = ids[i] end
    call_chunked('LPUSH', ready_key, reversed)
  elseif #ids > 0 then
    call_chunked('RPUSH', ready_key, ids)
  end
end

-- What a producer needs (enqueue.lua): arg, member, slots, activate, enter, types.
local fair_enter_made
local function fair_enter_lib()
  if fair_enter_made then return fair_enter_made end
  local L = {}

  -- A job's priority ('' = 0) as a number, or nil and a PQ_BADARG text; likewise for
  -- its group ('' = none; else 1..128 bytes without '|' or control characters).
  function L.arg(priority, group)
    local p, err = 0, nil
    if priority ~= '' then
      p, err = int_arg(priority, 'priority', PRIORITY_MIN, PRIORITY_MAX)
      if err then return nil, err end
    end
    if #group > 128 or string.find(group, '[%c|]') then
      return nil, 'PQ_BADARG group must be 1..128 bytes without | or control characters'
    end
    return p
  end

  -- The `gready` member of job `id` at position `pos` (16 digits).
  function L.member(group, priority, pos, id)
    return group .. '|' .. string.char(53 - priority) .. pos .. '|' .. id
  end

  -- Leases running and the cap (0: none) of `group`.
  function L.slots(F, group)
    local v = redis.call('HMGET', F.groups, 'r:' .. group, 'c:' .. group, 'cap')
    return tonumber(v[1] or '0') or 0, tonumber(v[2] or v[3] or '0') or 0
  end

  -- Give `group`, which has ready jobs, a place in `ring` unless it has one: at the
  -- back (a new turn) with a free slot, else parked.
  function L.activate(F, group)
    if redis.call('ZSCORE', F.ring, group) then return end
    local running, cap = L.slots(F, group)
    if cap == 0 or running < cap then
      redis.call('ZADD', F.ring, redis.call('HINCRBY', F.groups, 'turn', 1), group)
    else
      redis.call('ZADD', F.ring, -1, group)
    end
  end

  -- Put the jobs of `ids` whose metas[i] is an entry in `gready`, at the head (`head`,
  -- in the order given) or the tail of their priority in their group, and give their
  -- groups a place in `ring`. Returns the other ids, which belong in the `ready` list.
  function L.enter(F, ids, metas, head)
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
      members[2 * k - 1], members[2 * k] = 0, L.member(meta.group, meta.priority, pos, id)
      entries[2 * k - 1], entries[2 * k] = id, meta.priority .. '|' .. pos .. '|' .. meta.group
      if meta.group ~= '' and not activate[meta.group] then
        activate[meta.group] = true
        activate[#activate + 1] = meta.group
      end
    end
    call_chunked('ZADD', F.gready, members)
    call_chunked('HSET', F.meta, entries)
    for _, g in ipairs(activate) do L.activate(F, g) end
    return plain
  end

  -- A type error text if any fair-scheduling key holds another Redis type, else nil.
  function L.types(F)
    return expect_type(F.meta, 'hash') or expect_type(F.gready, 'zset') or expect_type(F.ring, 'zset')
      or expect_type(F.groups, 'hash')
  end

  fair_enter_made = L
  return L
end

-- Everything else (the scripts that end leases and move jobs), on top of fair_enter_lib.
local fair_made
local function fair_lib()
  if fair_made then return fair_made end
  local L = {}
  for name, fn in pairs(fair_enter_lib()) do L[name] = fn end

  -- Give back one slot per entry of `metas` with a group (their leases ended), one
  -- HINCRBY per group: a parked group with a free slot again goes to the back of
  -- `ring`, in the order the groups first appear in `metas`. Returns whether one did,
  -- so that the caller raises the wake marker.
  function L.release(F, metas)
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
        local _, cap = L.slots(F, g)
        if cap == 0 or running < cap then
          redis.call('ZADD', F.ring, redis.call('HINCRBY', F.groups, 'turn', 1), g)
          woke = true
        end
      end
    end
    return woke
  end

  -- Make `ids` READY (metas from fair_meta): those with meta by L.enter, the others to
  -- the head of the `ready` list (`head`, in the order given) or its tail.
  function L.ready(ready_key, F, ids, metas, head)
    push_ready(ready_key, L.enter(F, ids, metas, head), head)
  end

  -- Remove READY job `id` from `gready` if it is there (meta from fair_meta): 1 if it was.
  function L.unready(F, id, meta)
    if not meta or meta.pos == '' then return 0 end
    return redis.call('ZREM', F.gready, L.member(meta.group, meta.priority, meta.pos, id))
  end

  -- Forget the meta of jobs that ended for good (acked, cancelled) and give back their
  -- slots; raise the wake marker if a parked group got one. metas[i] belongs to ids[i].
  function L.finish(F, ids, metas, wake_key)
    local gone = {}
    for i, meta in ipairs(metas) do
      if meta then gone[#gone + 1] = ids[i] end
    end
    if #gone == 0 then return end
    call_chunked('HDEL', F.meta, gone)
    if L.release(F, metas) then redis.call('ZADD', wake_key, 0, 'wake') end
  end

  fair_made = L
  return L
end

-- <<< pyqueue prelude

local counters_key, events_key = KEYS[4], KEYS[5]
local contract_error = contract('progress', 5, 3, 3)
if contract_error then return redis.error_reply(contract_error) end

-- 1. Validate every argument before touching a key.
local now_ms, err = now_arg(ARGV[1])
if err then return redis.error_reply(err) end
local receipt, value = ARGV[2], ARGV[3]
local id = receipt_id(receipt)
if not id then return redis.error_reply('PQ_BADARG malformed receipt ' .. string.format('%q', receipt)) end
if #value > 4096 then return redis.error_reply('PQ_BADARG value must be 0..4096 bytes, got ' .. #value) end

-- 2. Read. ZSCORE proves `leased` a zset; the others are probed before any write.
if not redis.call('ZSCORE', leased_key, receipt) then return 'stale' end
err = expect_type(progress_key, 'hash') or expect_type(progress_at_key, 'zset')
local bound
if not err then bound, err = events_bound(counters_key, events_key) end
if err then return redis.error_reply(err) end
now_ms = now_ms or server_now_ms()

-- 3. The trim, then the value.
local looked = redis.call('ZRANGE', progress_at_key, 0, TRIM_BATCH)
for _, other in ipairs(looked) do
  local entry = redis.call('HGET', progress_key, other)
  local at, n = string.match(entry or '', '^%d+|(%d+)|()')
  local writer = at and string.sub(entry, n, n + tonumber(at) - 1)
  if writer and redis.call('ZSCORE', leased_key, writer) then
    redis.call('ZADD', progress_at_key, now_ms, other)
  else
    redis.call('HDEL', progress_key, other)
    redis.call('ZREM', progress_at_key, other)
  end
end
local entry = #receipt .. '|' .. receipt .. value
local previous = bound and redis.call('HGET', progress_key, id)
redis.call('HSET', progress_key, id, now_ms .. '|' .. entry)
redis.call('ZADD', progress_at_key, now_ms, id)
-- An event when the value changed (a re-sent call, or the same value reported again by
-- this lease, writes none).
if bound and string.match(previous or '', '^%d+|(.*)$') ~= entry then
  emit(events_key, bound, 'progress', id, now_ms, 'attempt', parse_receipt(receipt).attempt, 'value', value)
end
return 'ok'
