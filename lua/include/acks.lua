-- Acking: the writes that end current leases as done. ack.lua, ack_result.lua and
-- lease.lua (its acks before it leases) all ack through this helper.

-- End the current leases `receipts` of the jobs `ids` as acked. The caller has found
-- each receipt in `leased` and proven the type of every key written here, so nothing
-- here fails: the leases and the records go, the ids become tombstones kept
-- keep_done_ms (after trimming `expired` old ones), a fair job's group gets its slot
-- back (with `fair`: `metas` holds each job's meta or false), and each job gets its
-- 'acked' event when the queue has opted in (`bound`), and their step data goes
-- (`forgot`, from ack_settings: nil when the queue has none), and a sequence's head
-- hands its key on and rate entries go (`ended`, from ack_settings: NONE when the queue
-- has neither sequences nor rate keys).
-- K holds the keys jobs, leased, owners, done, wake, events, steps and waiting, and
-- scheduled, keyed and sequenced. ZREM on `owners` is the first
-- write: it removes something, so at its memory limit Redis still runs the call (it
-- refuses only a growing first write), and a full server keeps draining.
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

-- What an ack needs of the queue's settings, in one read of `counters`: the event
-- stream's bound; the meta of the acked jobs `ids` only when the queue is fair (`fair`:
-- set by enqueue.lua for a job with a group or a priority, and by set_group_limit.lua;
-- lease.lua decides so too); and their step data to delete only when the queue has
-- any (`steps`: set by step.lua, park.lua and signal.lua; K.steps and K.waiting), and
-- their entries in `keyed` only when it has sequences, rate keys, sizes or index
-- entries (`sequences`, `rates`, `sized`, `indexed`: set by enqueue.lua).
-- A plain queue reads none of them. The same read answers ack_result.lua's results
-- budget (`result_budget`, `result_bytes`, `rsized`: set_result_budget.lua), as
-- `settings` 8..10, and sets K.done_most, the tombstone limit (`done_max`:
-- set_tombstone_limit.lua) that write_acked keeps. Answers bound, metas, fair, nil,
-- forgot, ended (for write_acked), settings; or nil, nil, false and an error text.
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
