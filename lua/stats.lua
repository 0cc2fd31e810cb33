--[[ stats: counts per state, lag, and the counters the scripts keep. Read only.

KEYS (7), all <prefix>:{<queue>}:<role>
  1 jobs       hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
  2 ready      list  job ids
  3 scheduled  zset  id -> due_ms
  4 leased     zset  receipt -> deadline_ms
  5 dead       zset  id -> dead_ms
  6 counters   hash  counter name -> integer
  7 done       zset  id -> ms until which an acked id stays a duplicate (tombstones)

ARGV (1)
  1  now_ms   '' (use the server clock) or integer >= 0; tests only

Returns  a flat list of name, integer pairs, in this order:
  now_ms, ready, scheduled, due (scheduled jobs already due), leased, expired (leases
  past their deadline, not yet reclaimed), dead, done (acked ids enqueue still treats as
  duplicates: tombstones not yet expired), lag_ms (how long the job at the head of
  READY, or the earliest due scheduled job, whichever is older, has been due; 0 if
  none), then the counters: enqueued, duplicates, leased_total (the `leased` counter),
  acked, nacked, promoted, reclaimed, scrubbed, released, dead_total (the `dead`
  counter), replayed, purged. `acked` is derived:
  leased - nacked - reclaimed - scrubbed - released - (leases outstanding), because every
  lease ends in exactly one of those ways.
Errors   PQ_BADARG, WRONGTYPE. Writes nothing.
]]

local jobs_key, ready_key, scheduled_key, leased_key, dead_key, counters_key, done_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

local now_ms
if ARGV[1] ~= '' then
  if not string.match(ARGV[1] or '', '^%d+$') or tonumber(ARGV[1]) > 2 ^ 53 then
    return redis.error_reply('PQ_BADARG now_ms must be in [0, 2^53], got ' .. string.format('%q', tostring(ARGV[1])))
  end
  now_ms = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local ready = redis.call('LLEN', ready_key)
local scheduled = redis.call('ZCARD', scheduled_key)
local due = redis.call('ZCOUNT', scheduled_key, '-inf', now_ms)
local leased = redis.call('ZCARD', leased_key)
local expired = redis.call('ZCOUNT', leased_key, '-inf', now_ms)
local dead = redis.call('ZCARD', dead_key)
local done = redis.call('ZCOUNT', done_key, '(' .. now_ms, '+inf')

local oldest_due_ms
local head = redis.call('LINDEX', ready_key, 0)
if head then
  local record = redis.call('HGET', jobs_key, head)
  local due_ms = record and string.match(record, '^%d+|%d+|(%d+)|')
  if due_ms then oldest_due_ms = tonumber(due_ms) end
end
local first = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
if first[2] and tonumber(first[2]) <= now_ms and (not oldest_due_ms or tonumber(first[2]) < oldest_due_ms) then
  oldest_due_ms = tonumber(first[2])
end
local lag_ms = oldest_due_ms and math.max(0, now_ms - oldest_due_ms) or 0

local names = { 'enqueued', 'duplicates', 'leased', 'nacked', 'promoted', 'reclaimed', 'scrubbed', 'released',
  'dead', 'replayed', 'purged' }
local values = redis.call('HMGET', counters_key, unpack(names))
local c = {}
for i, name in ipairs(names) do c[name] = tonumber(values[i] or '0') or 0 end
local acked = c.leased - c.nacked - c.reclaimed - c.scrubbed - c.released - leased

return { 'now_ms', now_ms, 'ready', ready, 'scheduled', scheduled, 'due', due, 'leased', leased,
  'expired', expired, 'dead', dead, 'done', done, 'lag_ms', lag_ms,
  'enqueued', c.enqueued, 'duplicates', c.duplicates, 'leased_total', c.leased, 'acked', acked,
  'nacked', c.nacked, 'promoted', c.promoted, 'reclaimed', c.reclaimed, 'scrubbed', c.scrubbed,
  'released', c.released, 'dead_total', c.dead, 'replayed', c.replayed, 'purged', c.purged }
