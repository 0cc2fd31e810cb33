-- Flow control at the edges of a job's life (lua/README.md section 2.7): debounce and
-- throttle keys, decided by enqueue.lua; expiry, decided by lease.lua.
--
-- A keyed job's key lives in `keyed` (hash) and `windows` (zset) under one field,
-- "d:<key>" (debounce) or "t:<key>" (throttle): `keyed` names the job that holds the key,
-- `windows` says until when (ms). A debounce key is held by its job while that job is
-- scheduled (until its due time); a throttle key for its window. A field whose time has
-- passed holds nothing: enqueue trims a few of them per keyed call, so ending scripts
-- never need to free a key.
--
-- A sequence key ("s:<key>" in `keyed`) names its head: the one job of the key that may
-- be ready, leased, retrying or dead. The others, in send order, wait in `sequenced`, a
-- lexicographic zset of members "<key>\n<seq>\n<id>" (seq: 16 digits of `keyed`'s
-- counter "seq"), in no other state. Every job of a sequence has "j:<id>" in `keyed`:
-- "<seq>|<due_ms>|<policy>|<key>", policy 'b' (block) or 's' (skip). When the head ends
-- (acked, cancelled, expired, purged, or its dead letter skipped by sequence_skip.lua)
-- the script that ends it hands the key to the next (scheduled at its due time) or frees
-- it. A head that goes dead keeps the key under 'block' (the key waits until the head is
-- replayed and acked, purged, or skipped), and hands it on at once under 'skip' (its
-- dead letter is then out of the sequence). The scripts that end jobs look for this only
-- in a queue whose `counters` has `sequences`.
--
-- A job sent with an expiry has an entry in `expires` (zset id -> deadline_ms) until its
-- first lease: lease.lua reads it (a queue whose `counters` has `expiry`) and moves a job
-- past its deadline to `expired` (zset id -> ms it expired) instead of leasing it.
--
-- A job sent with a rate key has "r:<id>" in `keyed` for its whole life:
-- "<count>/<period_ms>/<burst>/<cost>|<w>|<key>", w 'w' while it waits for a slot. A
-- key's limit is a GCRA, as limit.lua's for a whole queue: a permit every spacing =
-- period_ms / count ms, up to `burst` banked, kept as one number, tat (when the next
-- permit would be due with none banked, ms). lease.lua checks the jobs it is about to
-- lease (a queue whose `counters` has `rates`) against their key's GCRA, at the lease: a
-- job passes when its cost in permits is due now, and then spends them. A job that does
-- not pass is not leased but scheduled at the time its permits will be due: the first
-- free slot after the jobs deferred before it, so that a key's waiting jobs are spread
-- over its permits, not all due at the next one. The key's state, "k:<key>" in `keyed`,
-- is "<tat>|<slot>|<spacing>" (slot: where the next deferred job goes, at the earliest;
-- spacing: the limit's that wrote it: under another limit, the permits still owed are
-- counted at the new spacing, rate_state), listed in `windows` under the same field
-- until tat and slot have passed (then it means nothing, and enqueue trims it). A
-- deferred job is checked again when it comes due: the check is always made at the
-- lease, so no two leases of a key are closer than its limit allows, even after workers
-- were away while many jobs came due. A deferred job that, come due, must wait again
-- (a worker came late to the job before it, whose lease moved tat on) keeps its place:
-- it goes to the time its permits are due, not behind the key's line; its mark goes
-- when it passes. "l:<key>"
-- (set_rate_limit.lua) overrides the limit the jobs carry:
-- "<count>/<period_ms>/<burst>", count 0 for none. The scripts that end a job delete its
-- rate entry (keyed_read, keyed_end); a dead job keeps it, for a replay.

-- The modes a key may have, and the prefix of their fields in `keyed` and `windows`
local KEY_MODES = { debounce = 'd:', throttle = 't:', sequence = 's:' }

-- Most expired ids kept in `expired` (the newest); older ones are forgotten
local EXPIRED_KEPT = 10000

-- Stale key fields removed per keyed enqueue call, at most
local KEY_TRIM = 10

-- A rate limit's parts, "<count>/<period_ms>/<burst>" (as limit.lua's ARGV), checked:
-- count 0..1000000 (`zero` allows 0: no limit), period_ms 1..86400000, burst 1..1000000.
-- Answers count, period_ms, burst, or nil and a PQ_BADARG text.
local function rate_limit_arg(value, zero)
  local count, period, burst = string.match(value, '^(%d+)/(%d+)/(%d+)$')
  if not count then
    return nil, nil, nil, 'PQ_BADARG a rate limit is "<count>/<period_ms>/<burst>", got ' .. string.format('%q', value)
  end
  local c, p, b, err = tonumber(count), tonumber(period), tonumber(burst), nil
  if c < (zero and 0 or 1) or c > 1000000 then
    err = 'PQ_BADARG a rate limit\'s count must be in [' .. (zero and 0 or 1) .. ', 1000000], got ' .. count
  elseif p < 1 or p > 86400000 then
    err = 'PQ_BADARG a rate limit\'s period_ms must be in [1, 86400000], got ' .. period
  elseif b < 1 or b > 1000000 then
    err = 'PQ_BADARG a rate limit\'s burst must be in [1, 1000000], got ' .. burst
  end
  if err then return nil, nil, nil, err end
  return c, p, b
end

-- A job's rate argument, "rate|<count>/<period_ms>/<burst>/<cost>|<key>" (cost 1..burst:
-- a job costing more than the burst could never pass). Answers {limit, cost, key}, or
-- nil and a PQ_BADARG text.
local function rate_arg(value)
  local limit, cost, key = string.match(value, '^rate|(%d+/%d+/%d+)/(%d+)|(.*)$')
  if not limit then
    return nil, 'PQ_BADARG a rate key must be "rate|<count>/<period_ms>/<burst>/<cost>|<key>", got '
      .. string.format('%q', value)
  end
  local _, _, burst, err = rate_limit_arg(limit, false)
  if err then return nil, err end
  local c = tonumber(cost)
  if c < 1 or c > burst then
    return nil, 'PQ_BADARG a job\'s cost must be in [1, burst] (' .. burst .. '): more could never pass, got ' .. cost
  end
  if #key < 1 or #key > 256 or string.find(key, '%c') then
    return nil, 'PQ_BADARG key must be 1..256 bytes without control characters'
  end
  return { limit = limit, cost = c, key = key }
end

-- A job's key argument: '' (none), "<mode>|<window_ms>|<key>" (mode debounce or throttle,
-- window_ms 1..2^40) or "sequence|<block or skip>|<key>"; key 1..256 bytes without
-- control characters. Answers nil (none), or {mode, window_ms, policy, key, field}; or
-- nil and a PQ_BADARG text.
local function key_arg(value)
  if value == '' then return nil end
  local mode, window, key = string.match(value, '^(%l+)|([^|]*)|(.*)$')
  if not mode or not KEY_MODES[mode] then
    return nil, 'PQ_BADARG key must be "debounce|<window_ms>|<key>", "throttle|<window_ms>|<key>" or '
      .. '"sequence|<block or skip>|<key>", got ' .. string.format('%q', value)
  end
  local window_ms, err, policy = 0, nil, nil
  if mode == 'sequence' then
    if window ~= 'block' and window ~= 'skip' then
      return nil, 'PQ_BADARG a sequence\'s failure policy must be block or skip, got ' .. string.format('%q', window)
    end
    policy = string.sub(window, 1, 1)
  else
    window_ms, err = int_arg(window, mode .. ' window_ms', 1, 2 ^ 40)
    if err then return nil, err end
  end
  if #key < 1 or #key > 256 or string.find(key, '%c') then
    return nil, 'PQ_BADARG key must be 1..256 bytes without control characters'
  end
  return { mode = mode, window_ms = window_ms, policy = policy, key = key, field = KEY_MODES[mode] .. key }
end

-- A job's task name, "task|<name>" in its keys argument (indexes, set_indexes.lua):
-- 1..256 bytes without control characters. Answers the name, or nil and a PQ_BADARG text.
local function task_arg(value)
  local name = string.sub(value, 6)
  if #name < 1 or #name > 256 or string.find(name, '%c') then
    return nil, 'PQ_BADARG a task name must be "task|<name>", name 1..256 bytes without control characters, got '
      .. string.format('%q', value)
  end
  return name
end

-- A job's keys argument: '' (none), or lines joined by newlines, at most one of each
-- kind: a flow key (key_arg), a rate key ("rate|...", rate_arg), a task name
-- ("task|<name>", task_arg). Answers the flow key, the rate and the task name (each
-- false when absent); or nil, nil, nil and a PQ_BADARG text.
local function keys_arg(value)
  if value == '' then return false, false, false end
  local got, err = { key = false, rate = false, task = false }, nil
  for line in string.gmatch(value .. '\n', '([^\n]*)\n') do
    local kind = string.sub(line, 1, 5) == 'rate|' and 'rate' or string.sub(line, 1, 5) == 'task|' and 'task'
      or line ~= '' and 'key' or nil
    if not kind or got[kind] then
      err = 'PQ_BADARG a job\'s keys are lines joined by newlines, at most one each of a flow key, a rate key '
        .. '("rate|...") and a task name ("task|..."), got ' .. string.format('%q', value)
    elseif kind == 'rate' then
      got.rate, err = rate_arg(line)
    elseif kind == 'task' then
      got.task, err = task_arg(line)
    else
      got.key, err = key_arg(line)
    end
    if err then return nil, nil, nil, err end
  end
  return got.key, got.rate, got.task
end

-- A byte budget (set_budget.lua, section 2.7): the PQ_FULL text when adding `delta`
-- payload bytes to the `used` ones would take the queue past `budget`, else nil.
-- enqueue.lua and flow_wait.lua check it before any write.
local function budget_refusal(counters_key, budget, used, delta)
  if delta > 0 and used + delta > budget then
    return string.format('PQ_FULL the queue is at its byte budget: %d of %d bytes in use, this call adds %d (%s)',
      used, budget, delta, counters_key)
  end
end

-- Indexes (set_indexes.lua, lua/README.md section 2.8): in a queue whose `counters` has
-- `indexes`, each job sent with a task name or a group is listed in `index`, a
-- lexicographic zset (all scores 0) of members "<kind>\n<value>\n<enqueued_ms, 15
-- digits>\n<id>": kind 't' (task name) or 'g' (group). So one ZRANGEBYLEX answers a
-- task's or a group's jobs in send order, and a time range is a range of members. A
-- job's "x:<id>" in `keyed`, "<enqueued_ms>\n<group>\n<task>", names its members: the
-- scripts that end a job read it with its other entries (keyed_read) and remove both
-- (keyed_end). Its state is not in the index: it is read where it lives (search.lua).
-- A dead job keeps its members: it is still a job.

-- The index entry "x:<id>" of a job sent at `enqueued_ms` with `task` and `group`
-- ('' or false: none), or nil when it has neither.
local function index_entry(enqueued_ms, group, task)
  if (task or '') == '' and (group or '') == '' then return nil end
  return string.format('%d', enqueued_ms) .. '\n' .. (group or '') .. '\n' .. (task or '')
end

-- The `index` members of job `id` from its entry (index_entry), appended to `out`.
local function index_members(id, entry, out)
  local enqueued_ms, group, task = string.match(entry, '^(%d+)\n([^\n]*)\n(.*)$')
  if not enqueued_ms then return nil end
  local at = string.format('%015d', tonumber(enqueued_ms))
  if task ~= '' then out[#out + 1] = 't\n' .. task .. '\n' .. at .. '\n' .. id end
  if group ~= '' then out[#out + 1] = 'g\n' .. group .. '\n' .. at .. '\n' .. id end
  return out
end

-- The entries in `keyed` of jobs `ids` that end (section 2.7; K holds keyed, sequenced,
-- scheduled, wake, counters and index): their sequence entries "j:<id>", rate entries
-- "r:<id>", sizes "b:<id>" (byte budgets, set_budget.lua) and index entries "x:<id>"
-- (set_indexes.lua), read before any write: one HMGET of `keyed` (which proves it a
-- hash), and TYPE probes of the keys keyed_end writes when any job is in a sequence or
-- indexed (K.index: the scripts whose entries all stay, `kept` dead letters, pass none).
-- Called by the scripts that end jobs, in a queue whose `counters` has
-- `sequences`, `rates`, `sized` or `indexed`. Answers the entries of the jobs that have
-- any ({id, bytes: its size or 0; index: its index entry; and seq, policy, key of a
-- sequence's job}), NONE when none; or nil and an error text.
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

-- Of jobs `ids` that go dead, the sequence entries whose policy is 'skip': their key goes
-- on (keyed_end, after the writes), while a 'block' head keeps it. Read before any
-- write, only when the queue has sequences (`flag`, counters `sequences`). Answers the
-- entries (NONE when none), or nil and an error text.
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

-- The jobs of `ended` (from keyed_read) ended for good: their entries go (a job still
-- `kept`, a dead letter, keeps its rate entry, size and index members), so do their
-- members in `index`, and the queue's `bytes` less
-- their sizes; a head hands its key to the next job of the sequence, which is scheduled
-- at its due time (a worker is woken), or frees it; any other leaves the line. Every
-- read comes before the first write (a user whose ACL lacks a command is refused before
-- anything changes). Answers the ids handed a key.
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

-- End jobs that were not leased before their deadline (never leased: their records,
-- `ids`, are still attempt 0): their records go, they are listed in `expired` (the
-- newest EXPIRED_KEPT), tombstoned in `done` like acked ids (so a retried enqueue does
-- not bring one back), counted and reported. Their `expires` entries the caller removes.
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

-- A rate key's state ("<tat>|<slot>|<spacing>", or false: none) as {tat, slot, spacing};
-- or nil when it does not parse.
local function rate_state(value)
  local tat, slot, spacing = string.match(value or '0|0|0', '^([%d.]+)|([%d.]+)|([%d.]+)$')
  if not tat then return nil end
  return { tat = tonumber(tat), slot = tonumber(slot), spacing = tonumber(spacing) }
end

-- Key state `k` brought to a limit's `spacing` at now_ms: the permits still owed (tat and
-- slot ahead of now) are owed at the new spacing, so a change of limit neither forgives
-- them nor lets a burst through twice.
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

-- The rate check of jobs about to be leased (lease.lua, a queue with `rates`): `ids`,
-- in the order they would be leased. One HMGET of their rate entries; when any has one,
-- one more of their keys' state and limits. Decides each in order against its key's
-- GCRA: a job passes when its permits are due now; else it is deferred to its slot.
-- Answers the plan for rate_write (NONE: no job has a rate entry), whose `deferred` maps
-- each deferred id to its time; or nil and a PQ_CORRUPT text.
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

-- The rate check's writes (R from rate_read): the keys' new state (listed in `windows`
-- until it means nothing), the marks of the jobs that begin or end a wait, and each
-- deferred job's place in SCHEDULED at its slot, its count and its event. The caller
-- has proven `windows` and `scheduled` zsets.
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
