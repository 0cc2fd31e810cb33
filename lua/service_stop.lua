--[[ service_stop: remote shutdown. Asks a live service to stop cleanly: marks its key
and raises its private wake marker, so a worker blocked waiting for jobs wakes at once.

The key is marked (field `stop`), not deleted: the service keeps renewing while it
finishes or releases its running jobs, and deregisters itself at the end. So a stop
is told apart from a lost registration (the key expired or Redis lost its data): a
stopped worker exits 0, one that lost its registration exits non-zero, and a
supervisor that restarts on failure restarts only the second. A worker learns of the
stop from its renewal (answer 'stop'), and before each blocking wait from its key
(HMGET <service> renewal stop). The marker lives no longer than the registration.

KEYS (2), all <prefix>:{<namespace>}:service:<role>
  1 service   hash  <prefix>:{<namespace>}:service:<id>
  2 wake      zset  <prefix>:{<namespace>}:service:<id>:wake, the member "stop" while
                    the service should wake up to stop

ARGV (3)
  1  now_ms         '' (use the server clock) or integer >= 0; tests only
  2  id             the service id
  3  registration   '' (whichever registration holds the id) or its token (1..16
                    bytes of [A-Za-z0-9]): then only that registration is stopped

Returns  {stopped, registration}: 1 and the registration token when a live service
         was asked to stop (or had been: a stop is idempotent), 0 and '' when there
         is no such live service (nothing written).
Errors   PQ_BADARG, WRONGTYPE (nothing written).
Replay   a re-sent call finds the key marked and answers as the first did.
]]

local service_key, wake_key = KEYS[1], KEYS[2]

-- 1. Validate.
local now_ms
if ARGV[1] ~= '' then
  if not string.match(ARGV[1] or '', '^%d+$') then return redis.error_reply('PQ_BADARG now_ms must be an integer >= 0') end
  now_ms = tonumber(ARGV[1])
end
local id, registration = ARGV[2], ARGV[3]
if not id or not string.match(id, '^%d+$') then return redis.error_reply('PQ_BADARG id must be an integer') end
if not registration or #registration > 16 or not string.match(registration, '^%w*$') then
  return redis.error_reply('PQ_BADARG registration must be empty or 1..16 bytes of [A-Za-z0-9]')
end
if string.sub(service_key, -(#id + 1)) ~= ':' .. id then
  return redis.error_reply('PQ_BADARG the service key must end with :<id>')
end

-- 2. Read.
local fields = redis.call('HMGET', service_key, 'registration', 'stop')
local ttl_ms = redis.call('PTTL', service_key)
if ttl_ms == -2 or not fields[1] or (registration ~= '' and fields[1] ~= registration) then
  return { 0, '' }
end
local got = redis.call('TYPE', wake_key).ok
if got ~= 'none' and got ~= 'zset' then return redis.error_reply('WRONGTYPE ' .. wake_key .. ' holds a ' .. got) end
if now_ms == nil then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 3. Write. The first stop's time stands (a re-sent call changes nothing that matters).
if not fields[2] then redis.call('HSET', service_key, 'stop', now_ms) end
redis.call('ZADD', wake_key, 0, 'stop')
if ttl_ms > 0 then redis.call('PEXPIRE', wake_key, ttl_ms) end
return { 1, fields[1] }
