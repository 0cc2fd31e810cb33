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

-- Priorities: -5..5, higher leased sooner (lua/include/groups.lua has the whole scheme)
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

-- A job's priority ('' = 0) as a number, or nil and a PQ_BADARG text; likewise for
-- its group ('' = none; else 1..128 bytes without '|' or control characters).
local function fair_arg(priority, group)
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

-- Remove READY job `id` from `gready` if it is there (meta from fair_meta): 1 if it was.
local function fair_unready(F, id, meta)
  if not meta or meta.pos == '' then return 0 end
  return redis.call('ZREM', F.gready, fair_member(meta.group, meta.priority, meta.pos, id))
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

-- The fair pick (lease.lua, queues with groups or priorities, section 2.1): up to
-- `want` jobs, round-robin between the groups in `ring` (lowest turn first; a group
-- served goes to the back with a new turn) and the ungrouped lane (the `ready` list and
-- gready's '' range, which takes the turn `uturn`), the highest priority first within
-- each. A group at its cap is parked, one with nothing ready dropped from the ring:
-- neither consumes a pick, and no job moves. It reads everything, and every record,
-- before its first write. Cost: O((want + skipped) * log(N)) for N ready jobs, with
-- skipped at most STALE_BUDGET; a group leaves the ring at most once per time it
-- entered it. In four steps over one table P: pick_read, pick_choose, pick_records,
-- pick_write (fair_pick runs them).

-- Read the next `n` entries of `ring` (those with a free slot, in turn order; at most
-- up to the budget) and the slots of their groups: one ZRANGEBYSCORE and one HMGET.
-- The ring is read a chunk at a time, as the pick needs it, so a pick of one job from
-- a ring of many groups reads a few of them, not the whole budget. Nothing is written
-- before the pick ends, so an offset into the ring stays right between reads. Sets
-- P.more: the ring may hold entries not read (one read past the chunk tells, and
-- reaching the budget counts as more).
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

-- Read the front of `ring`, the ungrouped lane and the slots of the groups read.
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

-- The next group entry to serve, or nil: the ring's (read on when those read are
-- served), then the groups served again.
local function pick_next(F, P)
  if P.qi > #P.entries and P.more and P.read < P.budget then pick_ring(F, P, PICK_CHUNK) end
  if P.qi <= #P.entries then return P.entries[P.qi] end
  return P.again[P.ai]
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
    P.again[#P.again + 1] = { g = e.g, turn = P.turn }
  end
end

-- Choose the picks, turn by turn, within the budget of steps.
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
-- running count, and the turns. (Every group served was read from the ring: its entry
-- is in P.entries.)
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
  local left = P.qi <= #P.entries or P.ai <= #P.again or P.more or P.pi <= #P.plain or P.li <= #P.lane
    or #P.plain == want
  return kept, left, P.steps >= P.budget and #P.picks < want
end
