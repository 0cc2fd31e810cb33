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
Fair queues (section 2.1: `counters` has `fair`, set by enqueue.lua for a job with a
group or a priority, and by set_group_limit.lua): acks and maintenance are written
first, the jobs they end give their groups' slots back and those they move go to
`gready` or `ready` by their meta; then step 4 is the fair pick instead (fair_pick
below: round-robin between groups, highest priority first, groups at their cap skipped
without moving a job; O((count + skipped) log N)). Such a call also proves the type of
every key it may write first (a few TYPE calls), and a PQ_CORRUPT record found by the
pick leaves the acks and maintenance done (they are whole transitions of their own).
A queue that is not fair pays nothing for this: `fair` comes with the counters read anyway.
While the queue is paused (pause.lua), step 4 leases nothing: acks, the replay check and
maintenance run as usual, and next_due_ms is -1 (resume.lua wakes the workers).
Under a rate limit (limit.lua), step 4 leases at most the permits due now (GCRA: one per
period_ms/count, up to `burst` at once) and advances `rate_tat` by the jobs leased; when
the limit cut the count and every permit was used, next_due_ms is when the next is due.

KEYS (15), all <prefix>:{<queue>}:<role>
  1 jobs       hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
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
                   lease made (with attempt, owner and deadline_ms)

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
         job: 7 values: receipt, id, payload, fence, attempt, max_attempts, deadline_ms.
Errors   PQ_BADARG (nothing written), PQ_CORRUPT (a record does not parse; nothing
         written), WRONGTYPE (a key holds another Redis type; nothing written).
Contract v4 (lua/README.md section 10): other counts of KEYS or ARGV than above answer
         PQ_CONTRACT, before anything is read or written.
]]

local jobs_key, ready_key, scheduled_key, leased_key, owners_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local dead_key, errors_key, counters_key, wake_key, done_key = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local events_key = KEYS[15]

-- >>> pyqueue includes: generated by `python lua/build.py` from lua/include/ (validate, calls, records, tombstones, events, groups, reclaim); do not edit
-- Per call at most this many jobs, receipts or ids; also the most count/limit
local MAX_BATCH = 1000

-- An empty list to read from; never written to, so no call allocates its own
local NONE = {}

-- Of the KEYS and ARGV the headers list; lua/README.md section 10
local CONTRACT_VERSION = 4

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

-- A WRONGTYPE text if `key` exists with another type than `want`; else nil. One TYPE call.
local function expect_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'WRONGTYPE ' .. key .. ' holds a ' .. got .. ', expected a ' .. want
  end
end

-- Values per unpack(); keeps every redis.call well under Lua's C stack limit
local CHUNK = 500

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

-- Expired tombstones are trimmed this many at a time, at least
local TRIM_BATCH = 10

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

-- The `gready` member of job `id` at position `pos` (16 digits).
local function fair_member(group, priority, pos, id)
  return group .. '|' .. string.char(53 - priority) .. pos .. '|' .. id
end

-- Leases running and the cap (0: none) of `group`.
local function fair_slots(F, group)
  local v = redis.call('HMGET', F.groups, 'r:' .. group, 'c:' .. group, 'cap')
  return tonumber(v[1] or '0') or 0, tonumber(v[2] or v[3] or '0') or 0
end

-- Give `group`, which has ready jobs, a place in `ring` unless it has one: at the
-- back (a new turn) with a free slot, else parked.
local function fair_activate(F, group)
  if redis.call('ZSCORE', F.ring, group) then return end
  local running, cap = fair_slots(F, group)
  if cap == 0 or running < cap then
    redis.call('ZADD', F.ring, redis.call('HINCRBY', F.groups, 'turn', 1), group)
  else
    redis.call('ZADD', F.ring, -1, group)
  end
end

-- Put the jobs of `ids` whose metas[i] is an entry in `gready`, at the head (`head`,
-- in the order given) or the tail of their priority in their group, and give their
-- groups a place in `ring`. Returns the other ids, which belong in the `ready` list.
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

-- A type error text if any fair-scheduling key holds another Redis type, else nil.
local function fair_types(F)
  return expect_type(F.meta, 'hash') or expect_type(F.gready, 'zset') or expect_type(F.ring, 'zset')
    or expect_type(F.groups, 'hash')
end

-- Give back one slot per entry of `metas` with a group (their leases ended), one
-- HINCRBY per group: a parked group with a free slot again goes to the back of
-- `ring`, in the order the groups first appear in `metas`. Returns whether one did,
-- so that the caller raises the wake marker.
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

-- Make `ids` READY (metas from fair_meta): those with meta by L.enter, the others to
-- the head of the `ready` list (`head`, in the order given) or its tail.
local function fair_ready(ready_key, F, ids, metas, head)
  push_ready(ready_key, fair_enter(F, ids, metas, head), head)
end

-- Forget the meta of jobs that ended for good (acked, cancelled) and give back their
-- slots; raise the wake marker if a parked group got one. metas[i] belongs to ids[i].
local function fair_finish(F, ids, metas, wake_key)
  local gone = {}
  for i, meta in ipairs(metas) do
    if meta then gone[#gone + 1] = ids[i] end
  end
  if #gone == 0 then return end
  call_chunked('HDEL', F.meta, gone)
  if fair_release(F, metas) then redis.call('ZADD', wake_key, 0, 'wake') end
end

-- A fair pick may also drop or park this many ring entries that had nothing to give
local STALE_BUDGET = 100

-- A fair pick reads a group's READY members this many at a time
local PICK_CHUNK = 8

-- Read the front of `ring`, the ungrouped lane and the slots of the groups read.
local function pick_read(F, ready_key, want)
  local fields = redis.call('HMGET', F.groups, 'turn', 'uturn', 'cap')
  local P = { want = want, budget = want + STALE_BUDGET, entries = {}, state = {}, picks = {} }
  P.turn, P.uturn = tonumber(fields[1] or '0') or 0, tonumber(fields[2] or '0') or 0
  local default_cap = tonumber(fields[3] or '0') or 0
  P.front = redis.call('ZRANGEBYSCORE', F.ring, '(0', '+inf', 'WITHSCORES', 'LIMIT', 0, P.budget)
  P.plain = redis.call('LRANGE', ready_key, 0, want - 1)
  P.lane = redis.call('ZRANGEBYLEX', F.gready, '[|', '(}', 'LIMIT', 0, want)
  -- Ring entries in turn order: those read, then groups served again (their new turns
  -- are above every turn in the ring, so the list stays in turn order).
  local names = {}
  for i = 1, #P.front, 2 do
    P.entries[#P.entries + 1] = { g = P.front[i], turn = tonumber(P.front[i + 1]) }
    names[#names + 1] = 'r:' .. P.front[i]
    names[#names + 1] = 'c:' .. P.front[i]
  end
  local slots = hmget(F.groups, names)
  for k, e in ipairs(P.entries) do
    local cap = tonumber(slots[2 * k] or '') or default_cap
    P.state[e.g] = { running = tonumber(slots[2 * k - 1] or '0') or 0, cap = cap, taken = 0 }
  end
  P.qi, P.pi, P.li, P.steps = 1, 1, 1, 0
  return P
end

-- Serve group entry `e` once: its next member, or its fate (park at its cap, drop when
-- it has nothing ready). This group's next member and whether another follows are read
-- PICK_CHUNK at a time (O(log N + PICK_CHUNK)): a group served several times in one
-- call is read once.
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
    P.entries[#P.entries + 1] = { g = e.g, turn = P.turn }
  end
end

-- Choose the picks, turn by turn, within the budget of steps.
local function pick_choose(F, P)
  while #P.picks < P.want and P.steps < P.budget do
    P.steps = P.steps + 1
    local e = P.entries[P.qi]
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
      P.qi = P.qi + 1
      pick_from_group(F, P, e)
    end
  end
end

-- The records of the picks, before any write: a corrupt one is an error with nothing of
-- the pick written. An id without a record (removed by another program) is popped and
-- dropped, and its slot is not taken. Returns the picks kept, or nil and an error.
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

-- Write the pick: its members out of READY, each group's new place in `ring` and its
-- running count, and the turns.
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

-- Returns the picks ({id, record}), whether leasable work is left, and whether the pick
-- stopped at its budget short of `want`; or nil, nil, nil and a PQ_CORRUPT text.
local function fair_pick(F, ready_key, jobs_key, want)
  local P = pick_read(F, ready_key, want)
  pick_choose(F, P)
  local kept, err = pick_records(jobs_key, P)
  if err then return nil, nil, nil, err end
  pick_write(F, ready_key, P)
  local left = P.qi <= #P.entries or P.pi <= #P.plain or P.li <= #P.lane or #P.plain == want
    or #P.front == 2 * P.budget
  return kept, left, P.steps >= P.budget and #P.picks < want
end

-- While READY is busy, maintenance still runs this often
local MAINTENANCE_INTERVAL_MS = 50

-- The leases of `receipts` (members of `source_key`, leased or owners) as parse_receipt
-- tables, each with its job's `max`, `record` and `payload_at` (where the payload
-- starts) when the job has a record; and their job ids. Or nil, nil and a PQ_CORRUPT
-- text. One HMGET of `jobs_key` (none for no receipts).
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
      local _, max_attempts, _, at = parse_record(records[i])
      if not max_attempts then return nil, nil, 'PQ_CORRUPT unparsable record in ' .. jobs_key end
      lease.max, lease.record, lease.payload_at = max_attempts, records[i], at
    end
  end
  return leases, ids
end

-- Reclaim `leases` (from read_leases; metas[i], from fair_meta, is the meta of
-- leases[i], or metas is nil when `fair` is false). Each lease ends (out of `leased`
-- and `owners`, counted under `counter`); its failed attempt is kept in its record
-- (due_ms = now) and its group's slot given back. A job whose attempts are used up
-- goes to DEAD with the error "<why> on attempt N of M" (a poison pill cannot loop
-- forever); a lease whose job has no record (removed by another program) is dropped.
-- Events: 'retried' or 'dead' per lease, in order. K: the keys jobs, leased, owners,
-- dead, errors, counters and events; the caller has proven the type of each it writes.
-- Returns the ids to make READY (at the head, in order: the caller does it, since
-- lease.lua may hand some out again at once), their metas, and whether a parked group
-- got a free slot (then raise the wake marker).
local function reclaim(K, F, fair, leases, metas, now_ms, why, counter, bound)
  local receipts, rewritten, dead_args, error_args, back, back_metas = {}, {}, {}, {}, {}, {}
  for i, lease in ipairs(leases) do
    receipts[i] = lease.receipt
    if lease.max then
      rewritten[#rewritten + 1] = lease.id
      rewritten[#rewritten + 1] = string.format('%d|%d|%d|', lease.attempt, lease.max, now_ms)
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
-- <<< pyqueue includes

local contract_error = contract('lease', 15, 7, 7 + MAX_BATCH)
if contract_error then return redis.error_reply(contract_error) end

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
local n_acks = #ARGV - 7
if n_acks > MAX_BATCH then return redis.error_reply('PQ_BADARG at most 1000 receipts per call') end
local ack_ids = {}
for i = 1, n_acks do
  ack_ids[i] = receipt_id(ARGV[7 + i])
  if not ack_ids[i] then
    return redis.error_reply('PQ_BADARG malformed receipt ' .. string.format('%q', ARGV[7 + i]))
  end
end

local F = fair_keys(11)

-- Which keys a read has proven to hold the right type; a key written but not read is
-- probed before the first write (6). The busy path reads every key it writes.
local jobs_read, ready_read, scheduled_read, leased_read, owners_read = false, false, false, n_acks > 0, false

-- 2. Read what the acks need: a receipt still in `leased` is the current lease. The
-- reply is built as we go: statuses now, jobs at the end.
local reply = { 0, -1, n_acks }
local to_ack, acked_ids, all_acked = {}, {}, true -- receipts acked 'ok', and their ids
local acking = n_acks > 1 and {} or nil -- a receipt repeated in this call is acked once
for i = 1, n_acks do
  local receipt, status = ARGV[7 + i], 'gone'
  if acking and acking[receipt] then
    all_acked = false
  elseif redis.call('ZSCORE', leased_key, receipt) then
    status = 'ok'
    to_ack[#to_ack + 1], acked_ids[#acked_ids + 1] = receipt, ack_ids[i]
    if acking then acking[receipt] = true end
  else
    all_acked = false
    jobs_read = true
    if redis.call('HEXISTS', jobs_key, ack_ids[i]) == 1 then status = 'stale' end
  end
  reply[3 + i] = status
end
reply[4 + n_acks] = 0 -- the count of jobs, set at the end; a placeholder keeps the reply one array

-- 3. Replay check. A call whose acks all succeeded cannot be a replay (the first run would
-- have removed them), so the busy path skips this read.
local prior = NONE
if count > 0 and (n_acks == 0 or not all_acked) then
  prior = redis.call('ZRANGEBYLEX', owners_key, '[' .. owner .. '|' .. call .. '|', '(' .. owner .. '|' .. call .. '}', 'LIMIT', 0, count)
  owners_read = true
end

now_ms = now_ms or server_now_ms()
reply[1] = now_ms
-- Expired tombstones, counted before any write (ZCOUNT also proves `done` is a zset).
local expired_done = #to_ack > 0 and redis.call('ZCOUNT', done_key, '-inf', now_ms) or 0

local m = 0 -- jobs leased (or handed back again by a replay)
-- Their 7 values each go straight into the reply, after the count m at index 4 + n_acks:
-- receipt, id, payload, fence, attempt, max_attempts, deadline_ms.
local at0 = 4 + n_acks

-- The meta of the acked jobs (queues with groups or priorities, section 2.1), read
-- before any write: the replay path reads it always, the other path when `counters`
-- says the queue is fair.
local ack_metas, fair = NONE, false

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
    local o = at0 + 7 * m
    reply[o + 1], reply[o + 2], reply[o + 3] = lease.receipt, lease.id, string.sub(records[i], at)
    reply[o + 4], reply[o + 5], reply[o + 6], reply[o + 7] = lease.fence, lease.attempt, max_attempts,
      tonumber(deadlines[i])
    m = m + 1
  end
  -- Every key written below was read above (`owners` by the replay check), so its type
  -- is proven, but for the fair-scheduling keys when an acked job has meta.
  if #to_ack > 0 then
    local bound
    ack_metas, err, fair = fair_meta(F, acked_ids)
    err = err or fair and (fair_types(F) or expect_type(wake_key, 'zset'))
    if not err then bound, err = events_bound(counters_key, events_key) end
    if err then return redis.error_reply(err) end
    call_chunked('ZREM', owners_key, to_ack)
    call_chunked('ZREM', leased_key, to_ack)
    call_chunked('HDEL', jobs_key, acked_ids)
    bury(done_key, acked_ids, expired_done, now_ms, keep_done_ms)
    if fair then fair_finish(F, acked_ids, ack_metas, wake_key) end
    emit_acked(events_key, bound, to_ack, acked_ids, now_ms)
  end
else
  -- 4. Read the rest of the plan: counters, the head of READY, maintenance candidates.
  -- `paused` (pause.lua) comes with the fields read anyway: an unpaused queue pays for
  -- the pause check with no command of its own.
  -- So are the rate limit's fields: an unlimited queue pays nothing more either.
  -- So is `fair` (enqueue.lua sets it when a job has a group or a priority): a queue
  -- without either takes the path below unchanged, at the cost of no command.
  -- So is `events` (the event stream's bound, section 2.5): a queue that has not opted in
  -- pays nothing more for it either.
  local counters = redis.call('HMGET', counters_key, 'leased', 'next_maintenance_ms', 'paused', 'rate_limit', 'rate_tat',
    'fair', 'events')
  local bound
  bound, err = events_bound(counters_key, events_key, counters[7])
  if err then return redis.error_reply(err) end
  local fence0 = tonumber(counters[1] or '0') or 0
  local maintenance_due = tonumber(counters[2] or '0') or 0
  local paused = counters[3] ~= false
  -- Paused: lease nothing (acks, promotion and reclaim go on) and answer next_due_ms -1:
  -- workers wait for the marker that resume.lua raises.
  if paused then count = 0 end
  -- Rate limited (GCRA): a permit every `spacing` ms; `tat` is when the next would be
  -- due if none were banked; up to `burst` are banked after a quiet spell.
  local spacing, tat, burst_ms, rate_cut
  if counters[4] and count > 0 then
    local per, period_ms, burst = string.match(counters[4], '^(%d+)/(%d+)/(%d+)$')
    if not per then return redis.error_reply('PQ_CORRUPT unparsable rate_limit in ' .. counters_key) end
    spacing = tonumber(period_ms) / tonumber(per)
    burst_ms = tonumber(burst) * spacing
    tat = math.max(tonumber(counters[5] or '0') or 0, now_ms)
    -- The small epsilon keeps float rounding from losing a whole permit.
    local permits = math.max(0, math.floor((now_ms + burst_ms - tat) / spacing + 1e-9))
    if permits < count then count, rate_cut = permits, true end
  end
  -- A fair queue leases by fair_pick after maintenance is written: the steps below run
  -- with count 0, and `want` is what the call asked for (after pause and rate limit).
  fair = counters[6] ~= false
  local want = count
  local fair_short = false
  if fair then
    if #to_ack > 0 then
      ack_metas, err = fair_meta(F, acked_ids)
      if err then return redis.error_reply(err) end
    end
    -- Maintenance also when a lease has expired: a group at its cap gets its slot back
    -- only when the lease is reclaimed, which must not wait for the maintenance timer.
    -- (These reads also prove `ready`, `gready` and `leased`; see 6.)
    local waiting = redis.call('LLEN', ready_key) + redis.call('ZCARD', F.gready)
    local expired_now = redis.call('ZCOUNT', leased_key, '-inf', now_ms)
    ready_read, leased_read = true, true
    fair_short = want > 0 and (waiting < want or expired_now > 0)
    count = 0
  end
  local ready_head = NONE
  if count > 0 then
    ready_head = redis.call('LRANGE', ready_key, 0, count) -- one extra: is more work waiting?
    ready_read = true
  end

  local promoted, reclaimed, to_dead, stopped_at_limit = NONE, NONE, NONE, false
  local maintain = (count > 0 and #ready_head < count) or fair_short or now_ms >= maintenance_due
  if maintain then
    reclaimed, to_dead = {}, {}
    -- Expired tombstones, trimmed below even when nothing is acked: an idle or drained
    -- queue gets no acks, and its tombstones must not hold memory for good.
    if #to_ack == 0 then expired_done = redis.call('ZCOUNT', done_key, '-inf', now_ms) end
    promoted = redis.call('ZRANGEBYSCORE', scheduled_key, '-inf', now_ms, 'LIMIT', 0, limit)
    scheduled_read = true
    local expired = redis.call('ZRANGEBYSCORE', leased_key, '-inf', now_ms, 'LIMIT', 0, limit + #to_ack)
    leased_read = true
    stopped_at_limit = #promoted == limit
    local acked_now = {}
    for _, receipt in ipairs(to_ack) do acked_now[receipt] = true end
    local candidates = {}
    for _, receipt in ipairs(expired) do
      if not acked_now[receipt] and #candidates < limit then candidates[#candidates + 1] = receipt end
    end
    if #candidates == limit then stopped_at_limit = true end
    local leases, _
    leases, _, err = read_leases(jobs_key, leased_key, candidates)
    if err then return redis.error_reply(err) end
    if #candidates > 0 then jobs_read = true end
    for _, lease in ipairs(leases) do
      if lease.max and lease.attempt >= lease.max then
        to_dead[#to_dead + 1] = lease
      else
        -- (A lease without a job record, its job removed by another program, is dropped.)
        reclaimed[#reclaimed + 1] = lease
      end
    end
  end

  -- In a fair queue: the meta of every job maintenance moves, read before any write.
  local moved_metas = {}
  if fair and #promoted + #reclaimed + #to_dead > 0 then
    local moved = {}
    for _, id in ipairs(promoted) do moved[#moved + 1] = id end
    for _, lease in ipairs(reclaimed) do moved[#moved + 1] = lease.id end
    for _, lease in ipairs(to_dead) do moved[#moved + 1] = lease.id end
    local metas
    metas, err = fair_meta(F, moved)
    if err then return redis.error_reply(err) end
    for i, id in ipairs(moved) do moved_metas[id] = metas[i] end
  end

  -- 5. Choose what to lease: READY after maintenance would read
  -- reclaimed (earliest deadline first) ++ current READY ++ promoted.
  -- Items 1..n_back are reclaimed leases (back_leases), then READY's head, then promoted.
  local order, back_leases = ready_head, NONE
  if #reclaimed > 0 then
    back_leases = {}
    for _, lease in ipairs(reclaimed) do
      if lease.max then back_leases[#back_leases + 1] = lease end
    end
  end
  local n_back = #back_leases
  if n_back + #promoted > 0 then
    order = {}
    for i, lease in ipairs(back_leases) do order[i] = lease.id end
    for _, id in ipairs(ready_head) do order[#order + 1] = id end
    for _, id in ipairs(promoted) do order[#order + 1] = id end
  end
  local take = math.min(count, #order)
  -- Records of the jobs to lease that maintenance has not read already.
  local records = NONE
  if take > n_back then
    local need = {}
    for i = n_back + 1, take do need[i - n_back] = order[i] end
    records = hmget(jobs_key, need)
    jobs_read = true
  end
  -- Receipts and reply values of the leases, all decided before the first write: a
  -- corrupt record is an error while nothing is written yet.
  local deadline_ms = now_ms + lease_ms
  local leased_args, owner_args = {}, {}
  for i = 1, take do
    local id, record, attempt, max_attempts, at, _ = order[i]
    if i <= n_back then
      -- The record is rewritten below with the expired lease's attempt.
      local lease = back_leases[i]
      record, attempt, max_attempts, at = lease.record, lease.attempt + 1, lease.max, lease.payload_at
    else
      record = records[i - n_back]
      local attempts
      attempts, max_attempts, _, at = parse_record(record or '')
      if record and not attempts then
        return redis.error_reply('PQ_CORRUPT unparsable record for job in ' .. jobs_key)
      end
      attempt = attempts and attempts + 1
    end
    -- An id in READY without a record (removed by another program) is popped and dropped.
    if attempt then
      m = m + 1
      local fence = fence0 + m
      local receipt = string.format('%s|%s|%d|%d|', owner, call, fence, attempt) .. id
      local o = at0 + 7 * (m - 1)
      reply[o + 1], reply[o + 2], reply[o + 3] = receipt, id, string.sub(record, at)
      reply[o + 4], reply[o + 5], reply[o + 6], reply[o + 7] = fence, attempt, max_attempts, deadline_ms
      leased_args[2 * m - 1], leased_args[2 * m] = deadline_ms, receipt
      owner_args[2 * m - 1], owner_args[2 * m] = 0, receipt
    end
  end
  -- Wake another worker when work is left over after a plain lease: the wake marker woke
  -- one worker only. A worker that acks and leases is busy and comes back by itself.
  local wake = n_acks == 0 and #order > take and not paused and not rate_cut
  -- next_due_ms is read from SCHEDULED and LEASED after the writes when fewer than count
  -- are leased, so those reads must be proven too.
  local read_after = m < count and not stopped_at_limit

  -- 6. Prove the types of keys we will write (or read after writing) but have not read.
  -- `owners` needs no probe when this call acks: ZREM on it is then the first write, and
  -- if that key held another type, the error would come before anything was written
  -- (one command less per job).
  local write_jobs = #to_ack > 0 or #reclaimed + #to_dead > 0
  local write_ready = take > 0 or n_back + #promoted > 0
  local write_leased = #to_ack > 0 or m > 0 or #reclaimed + #to_dead > 0 or read_after
  local write_owners = #to_ack == 0 and (m > 0 or #reclaimed + #to_dead > 0)
  err = write_jobs and not jobs_read and expect_type(jobs_key, 'hash')
    or write_ready and not ready_read and expect_type(ready_key, 'list')
    or write_leased and not leased_read and expect_type(leased_key, 'zset')
    or write_owners and not owners_read and expect_type(owners_key, 'zset')
    or read_after and not scheduled_read and expect_type(scheduled_key, 'zset')
    or #to_dead > 0 and (expect_type(dead_key, 'zset') or expect_type(errors_key, 'hash'))
    or nil
  -- A fair queue proves every key it may write, or read after writing, that no read
  -- above has proven (`ready`, `gready` and `leased` are; `meta` when acks read it;
  -- `owners` needs none when ZREM on it is the first write; `jobs` not twice): a few
  -- TYPE calls, paid only by queues with groups or priorities.
  err = err or fair and ((#to_ack == 0 and expect_type(F.meta, 'hash')) or expect_type(F.ring, 'zset')
    or expect_type(F.groups, 'hash') or (not jobs_read and not write_jobs and expect_type(jobs_key, 'hash'))
    or (not scheduled_read and expect_type(scheduled_key, 'zset'))
    or (#to_ack == 0 and not owners_read and expect_type(owners_key, 'zset')) or expect_type(wake_key, 'zset'))
  if err then return redis.error_reply(err) end
  -- The marker's read proves `wake` a zset, and spares the write when it is already up.
  wake = wake and not redis.call('ZSCORE', wake_key, 'wake')

  -- Which READY ids this call pops, and which maintenance moves go back to READY.
  local from_ready = math.max(0, math.min(take, n_back + #ready_head) - n_back)
  local head_back, tail_back = NONE, NONE
  if take < n_back then
    head_back = {}
    for i = take + 1, n_back do head_back[#head_back + 1] = order[i] end
  end
  if #promoted > 0 and #order > math.max(take, n_back + #ready_head) then
    tail_back = {}
    for i = math.max(take, n_back + #ready_head) + 1, #order do tail_back[#tail_back + 1] = order[i] end
  end

  -- 7. Write: the acks, then the pop from READY. ZREM on `owners` is the first write
  -- (see 6). It removes something, so at its memory limit Redis still runs the call (it
  -- refuses only a growing first write): a full server keeps draining.
  if #to_ack > 0 then
    call_chunked('ZREM', owners_key, to_ack)
    call_chunked('ZREM', leased_key, to_ack)
    call_chunked('HDEL', jobs_key, acked_ids)
    bury(done_key, acked_ids, expired_done, now_ms, keep_done_ms)
    if fair then fair_finish(F, acked_ids, ack_metas, wake_key) end
    emit_acked(events_key, bound, to_ack, acked_ids, now_ms)
  elseif maintain then
    trim_done(done_key, expired_done, MAX_BATCH)
  end
  if from_ready > 0 then redis.call('LTRIM', ready_key, from_ready, -1) end

  -- Maintenance. With nothing due it writes nothing (an idle call stays read-only).
  if maintain and #promoted + #reclaimed + #to_dead > 0 then
    if #promoted > 0 then call_chunked('ZREM', scheduled_key, promoted) end
    -- Reclaimed leases, then those whose attempts are used up (their events in that order).
    local ended, ended_metas = {}, {}
    for _, lease in ipairs(reclaimed) do ended[#ended + 1] = lease end
    for _, lease in ipairs(to_dead) do ended[#ended + 1] = lease end
    if #ended > 0 then
      for i, lease in ipairs(ended) do ended_metas[i] = moved_metas[lease.id] or false end
      local K = { jobs = jobs_key, leased = leased_key, owners = owners_key, dead = dead_key }
      K.errors, K.counters, K.events = errors_key, counters_key, events_key
      -- What goes back to READY is decided by step 5 (some are leased again at once).
      reclaim(K, F, fair, ended, ended_metas, now_ms, 'lease expired', 'reclaimed', bound)
    end
    if #promoted > 0 then redis.call('HINCRBY', counters_key, 'promoted', #promoted) end
  end
  -- Rate-limit maintenance while READY is busy. Written only when this call wrote
  -- something else first, so it is never a growing first write (see above).
  if maintain and (#promoted + #reclaimed + #to_dead + #to_ack + from_ready > 0) then
    redis.call('HSET', counters_key, 'next_maintenance_ms', now_ms + MAINTENANCE_INTERVAL_MS)
  end

  -- Unleased reclaimed jobs go to the head (earliest deadline first), unleased promoted
  -- jobs to the tail.
  -- In a fair queue, a job with meta goes to `gready` instead (fair_ready).
  if fair then
    local metas = {}
    for i, id in ipairs(head_back) do metas[i] = moved_metas[id] or false end
    fair_ready(ready_key, F, head_back, metas, true)
    metas = {}
    for i, id in ipairs(tail_back) do metas[i] = moved_metas[id] or false end
    fair_ready(ready_key, F, tail_back, metas, false)
  elseif #head_back > 0 then
    local reversed = {}
    for i = #head_back, 1, -1 do reversed[#reversed + 1] = head_back[i] end
    call_chunked('LPUSH', ready_key, reversed)
  end
  if not fair and #tail_back > 0 then call_chunked('RPUSH', ready_key, tail_back) end

  -- The fair pick, now that maintenance has made its jobs READY.
  if fair and want > 0 then
    local picks, left, short
    picks, left, short, err = fair_pick(F, ready_key, jobs_key, want)
    if err then return redis.error_reply(err) end
    for _, pick in ipairs(picks) do
      local attempts, max_attempts, _, at = parse_record(pick.record)
      m = m + 1
      local fence, attempt = fence0 + m, attempts + 1
      local receipt = string.format('%s|%s|%d|%d|', owner, call, fence, attempt) .. pick.id
      local o = at0 + 7 * (m - 1)
      reply[o + 1], reply[o + 2], reply[o + 3] = receipt, pick.id, string.sub(pick.record, at)
      reply[o + 4], reply[o + 5], reply[o + 6], reply[o + 7] = fence, attempt, max_attempts, deadline_ms
      leased_args[2 * m - 1], leased_args[2 * m] = deadline_ms, receipt
      owner_args[2 * m - 1], owner_args[2 * m] = 0, receipt
    end
    stopped_at_limit = stopped_at_limit or short
    -- Wake another worker when leasable work is left after a plain lease.
    if n_acks == 0 and left and not paused and not rate_cut and not redis.call('ZSCORE', wake_key, 'wake') then
      redis.call('ZADD', wake_key, 0, 'wake')
    end
  end

  -- Lease.
  if m > 0 then
    redis.call('HINCRBY', counters_key, 'leased', m)
    call_chunked('ZADD', leased_key, leased_args)
    call_chunked('ZADD', owners_key, owner_args)
    if bound then
      for k = 1, m do
        local o = at0 + 7 * (k - 1)
        emit(events_key, bound, 'leased', reply[o + 2], now_ms, 'attempt', reply[o + 5], 'owner', owner, 'deadline_ms',
          string.format('%d', deadline_ms))
      end
    end
  end

  if wake then redis.call('ZADD', wake_key, 0, 'wake') end
  -- Spend the permits. Written after the leases (never a growing first write).
  if spacing and m > 0 then
    tat = tat + m * spacing
    redis.call('HSET', counters_key, 'rate_tat', string.format('%.3f', tat))
  end

  if rate_cut and m == want then
    -- Every permit due was used: the next one is due when tat is within a burst of now.
    reply[2] = math.ceil(tat + spacing - burst_ms)
  elseif m < want then
    if stopped_at_limit then
      reply[2] = now_ms
    else
      local next_due_ms = -1
      local s = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
      local l = redis.call('ZRANGE', leased_key, 0, 0, 'WITHSCORES')
      if s[2] then next_due_ms = tonumber(s[2]) end
      if l[2] and (next_due_ms < 0 or tonumber(l[2]) < next_due_ms) then next_due_ms = tonumber(l[2]) end
      reply[2] = next_due_ms
    end
  end
end

reply[at0] = m
return reply
