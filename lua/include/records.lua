-- Receipts ("<owner>|<call>|<fence>|<attempt>|<id>") and job records
-- ("<attempts>|<max_attempts>|<due_ms>:<enqueued_ms>|<payload>"), lua/README.md section 2.

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

-- "<attempts>|<max_attempts>|<due_ms>:<enqueued_ms>|<payload>" as attempts, max_attempts,
-- due_ms, the payload's index and enqueued_ms; or nil. A record written before contract
-- v5 has no ":<enqueued_ms>": its enqueued_ms is nil (the pattern cannot mistake a
-- payload for it, since the due field then ends at '|').
local function parse_record(record)
  local attempts, max_attempts, due_ms, sent, at = string.match(record, '^(%d+)|(%d+)|(%d+)(:?%d*)|()')
  if not attempts or sent == ':' then return nil end
  return tonumber(attempts), tonumber(max_attempts), tonumber(due_ms), at, tonumber(string.sub(sent, 2))
end

-- A record's fields before its payload. `enqueued_ms` is nil for a record written before
-- contract v5, which stays without one.
local function record_head(attempts, max_attempts, due_ms, enqueued_ms)
  if enqueued_ms then return string.format('%d|%d|%d:%d|', attempts, max_attempts, due_ms, enqueued_ms) end
  return string.format('%d|%d|%d|', attempts, max_attempts, due_ms)
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
