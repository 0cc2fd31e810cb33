-- Maintenance and reclaim: a lease that ended without an ack or a nack (its deadline
-- passed, or its worker died) back to READY, or to DEAD once its attempts are used up.
-- lease.lua, promote.lua and scrub.lua all reclaim through these two helpers.

-- While READY is busy, maintenance still runs this often
local MAINTENANCE_INTERVAL_MS = 50

-- The leases of `receipts` (members of `source_key`, leased or owners) as parse_receipt
-- tables, each with its job's `max`, `record`, `payload_at` (where the payload starts)
-- and `enqueued_ms` when the job has a record; and their job ids. Or nil, nil and a PQ_CORRUPT
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
      local _, max_attempts, _, at, enqueued_ms = parse_record(records[i])
      if not max_attempts then return nil, nil, 'PQ_CORRUPT unparsable record in ' .. jobs_key end
      lease.max, lease.record, lease.payload_at, lease.enqueued_ms = max_attempts, records[i], at, enqueued_ms
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

-- The sequence entries (policy skip) of the leases in `leases` that go dead (attempts
-- used up), read before any write when the queue has sequences (`flag`): their keys go
-- on after the writes (keyed_end). K holds keyed, sequenced, scheduled and wake.
local function dead_sequences(K, leases, flag)
  if not flag then return NONE end
  local ids = {}
  for _, lease in ipairs(leases) do
    if lease.max and lease.attempt >= lease.max then ids[#ids + 1] = lease.id end
  end
  return sequence_dead_read(K, ids, flag)
end

-- Make `ids` READY at the head (`head`, in the order given) or the tail: a job with
-- meta (metas[i], from fair_meta) into its group's place in `gready`, the others into
-- the `ready` list.
local function make_ready(ready_key, F, fair, ids, metas, head)
  if fair then
    fair_ready(ready_key, F, ids, metas, head)
  else
    push_ready(ready_key, ids, head)
  end
end

-- When a worker that found nothing to lease should look again: the earliest due_ms in
-- SCHEDULED or deadline in LEASED, or -1 when both are empty.
local function earliest_due_ms(scheduled_key, leased_key)
  local due = -1
  local s = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
  local l = redis.call('ZRANGE', leased_key, 0, 0, 'WITHSCORES')
  if s[2] then due = tonumber(s[2]) end
  if l[2] and (due < 0 or tonumber(l[2]) < due) then due = tonumber(l[2]) end
  return due
end
