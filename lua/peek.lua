--[[ peek: does this queue have work for a worker, and when will it next? Read only.

A worker that serves several queues peeks at all of them in one pipelined round trip
and then leases from the first that has work, instead of one lease call per empty
higher-priority queue. An idle worker also peeks once per block period, so it learns
of lease deadlines set after it went to sleep and reclaims expired leases (through
`lease`) even when no wake marker is raised.

KEYS (3), all <prefix>:{<queue>}:<role>
  1 ready      list  job ids, head = next to lease
  2 scheduled  zset  id -> due_ms
  3 leased     zset  receipt -> deadline_ms

ARGV (1)
  1  now_ms   '' (use the server clock) or integer >= 0; tests only

Returns  {now_ms, ready, next_due_ms}: the length of READY, and the earliest due_ms in
         SCHEDULED or deadline in LEASED (-1 if neither). The queue has work for a
         `lease` call now when ready > 0 or 0 <= next_due_ms <= now_ms (a due job to
         promote or an expired lease to reclaim).
Errors   PQ_BADARG, WRONGTYPE. Writes nothing.
Replay   read only.
]]

local ready_key, scheduled_key, leased_key = KEYS[1], KEYS[2], KEYS[3]

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
local next_due_ms = -1
local s = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
local l = redis.call('ZRANGE', leased_key, 0, 0, 'WITHSCORES')
if s[2] then next_due_ms = tonumber(s[2]) end
if l[2] and (next_due_ms < 0 or tonumber(l[2]) < next_due_ms) then next_due_ms = tonumber(l[2]) end
return { now_ms, ready, next_due_ms }
