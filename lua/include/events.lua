-- The queue's event stream, for queues that opted in (lua/README.md section 2.5).

-- An error text in an event is cut to this many bytes (section 2.5)
local EVENT_TEXT_BYTES = 1024

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
