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
-- A job sent with an expiry has an entry in `expires` (zset id -> deadline_ms) until its
-- first lease: lease.lua reads it (a queue whose `counters` has `expiry`) and moves a job
-- past its deadline to `expired` (zset id -> ms it expired) instead of leasing it.

-- The modes a key may have, and the prefix of their fields in `keyed` and `windows`
local KEY_MODES = { debounce = 'd:', throttle = 't:' }

-- Most expired ids kept in `expired` (the newest); older ones are forgotten
local EXPIRED_KEPT = 10000

-- Stale key fields removed per keyed enqueue call, at most
local KEY_TRIM = 10

-- A job's key argument: '' (none) or "<mode>|<window_ms>|<key>", mode debounce or
-- throttle, window_ms 1..2^40, key 1..256 bytes without control characters. Answers
-- nil (none), or {mode, window_ms, field}; or nil and a PQ_BADARG text.
local function key_arg(value)
  if value == '' then return nil end
  local mode, window, key = string.match(value, '^(%l+)|([^|]*)|(.*)$')
  if not mode or not KEY_MODES[mode] then
    return nil, 'PQ_BADARG key must be "debounce|<window_ms>|<key>" or "throttle|<window_ms>|<key>", got '
      .. string.format('%q', value)
  end
  local window_ms, err = int_arg(window, mode .. ' window_ms', 1, 2 ^ 40)
  if err then return nil, err end
  if #key < 1 or #key > 256 or string.find(key, '%c') then
    return nil, 'PQ_BADARG key must be 1..256 bytes without control characters'
  end
  return { mode = mode, window_ms = window_ms, field = KEY_MODES[mode] .. key }
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
