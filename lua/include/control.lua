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

-- The modes a key may have, and the prefix of their fields in `keyed` and `windows`
local KEY_MODES = { debounce = 'd:', throttle = 't:', sequence = 's:' }

-- Most expired ids kept in `expired` (the newest); older ones are forgotten
local EXPIRED_KEPT = 10000

-- Stale key fields removed per keyed enqueue call, at most
local KEY_TRIM = 10

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

-- The sequence entries of jobs `ids` that end (section 2.7; K holds keyed, sequenced,
-- scheduled and wake), read before any write: one HMGET of `keyed` (which proves it a
-- hash), and when any has one, TYPE probes of the keys sequence_end writes. Answers the
-- entries ({id, seq, policy, key}; NONE when none), or nil and an error text.
local function sequence_read(K, ids)
  if #ids == 0 then return NONE end
  local fields = {}
  for i, id in ipairs(ids) do fields[i] = 'j:' .. id end
  local values = hmget(K.keyed, fields)
  local out = NONE
  for i, value in ipairs(ids) do
    local entry = values[i]
    if entry then
      local seq, policy, key = string.match(entry, '^(%d+)|%d+|([bs])|(.+)$')
      if not seq then return nil, 'PQ_CORRUPT unparsable sequence entry in ' .. K.keyed end
      if out == NONE then out = {} end
      out[#out + 1] = { id = value, seq = seq, policy = policy, key = key }
    end
  end
  if out ~= NONE then
    local err = expect_type(K.sequenced, 'zset') or expect_type(K.scheduled, 'zset') or expect_type(K.wake, 'zset')
    if err then return nil, err end
  end
  return out
end

-- Of jobs `ids` that go dead, the sequence entries whose policy is 'skip': their key goes
-- on (sequence_end, after the writes), while a 'block' head keeps it. Read before any
-- write, only when the queue has sequences (`flag`, counters `sequences`). Answers the
-- entries (NONE when none), or nil and an error text.
local function sequence_dead_read(K, ids, flag)
  if not flag or #ids == 0 then return NONE end
  local ended, err = sequence_read(K, ids)
  if err then return nil, err end
  local skipping = NONE
  for _, e in ipairs(ended) do
    if e.policy == 's' then
      if skipping == NONE then skipping = {} end
      skipping[#skipping + 1] = e
    end
  end
  return skipping
end

-- The jobs of `ended` (from sequence_read) ended for good: a head hands its key to the
-- next job of the sequence, which is scheduled at its due time (a worker is woken), or
-- frees it; any other leaves the line. Every read comes before the first write (a user
-- whose ACL lacks a command is refused before anything changes). Answers the ids
-- handed a key.
local function sequence_end(K, ended)
  local plans, handed = {}, {}
  for i, e in ipairs(ended) do
    local p = { head = redis.call('HGET', K.keyed, 's:' .. e.key) == e.id }
    if p.head then
      p.next = redis.call('ZRANGEBYLEX', K.sequenced, '[' .. e.key .. '\n', '(' .. e.key .. '\011', 'LIMIT', 0, 1)[1]
      if p.next then
        p.id = string.sub(p.next, #e.key + 19)
        p.due = tonumber(string.match(redis.call('HGET', K.keyed, 'j:' .. p.id) or '', '^%d+|(%d+)|') or '0')
      end
    end
    plans[i] = p
  end
  for i, e in ipairs(ended) do
    local p = plans[i]
    redis.call('HDEL', K.keyed, 'j:' .. e.id)
    if p.next then
      redis.call('ZREM', K.sequenced, p.next)
      redis.call('HSET', K.keyed, 's:' .. e.key, p.id)
      redis.call('ZADD', K.scheduled, p.due, p.id)
      handed[#handed + 1] = p.id
    elseif p.head then
      redis.call('HDEL', K.keyed, 's:' .. e.key)
    else
      redis.call('ZREM', K.sequenced, e.key .. '\n' .. e.seq .. '\n' .. e.id)
    end
  end
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
  bury(K.done, ids, 0, now_ms, keep_done_ms)
  for _, id in ipairs(ids) do emit(K.events, bound, 'expired', id, now_ms, 'reason', 'not started by its deadline') end
end
