--[[ service_deregister: remove a service from its namespace.

Two uses: a service stopping cleanly (after releasing its leases) removes itself; a
live service that has scrubbed every queue of a dead service forgets it. With
require_expired set, nothing happens unless the service's expiry has passed, so a
reaper can never forget a service that renewed in the meantime.

KEYS (5), all <prefix>:{<namespace>}:service:<role>
  1 service   hash  <prefix>:{<namespace>}:service:<id>
  2 ids       list  listed ids
  3 expiry    zset  id -> expires_ms
  4 queues    hash  id -> the queues the service serves
  5 wake      zset  <prefix>:{<namespace>}:service:<id>:wake, the service's private wake
                    marker (raised to interrupt its blocking wait on a stop)

ARGV (3)
  1  now_ms            '' (use the server clock) or integer >= 0; tests only
  2  id                the service id
  3  require_expired   '0' (the service itself) or '1' (a reaper)

Returns  {deleted, removed}: whether the key was deleted (0 if it had expired), and
         how many entries of the ids list were removed (LREM from the tail); {-1, 0}
         when require_expired and the service is still alive (nothing written).
Errors   PQ_BADARG, WRONGTYPE (nothing written).
Replay   a re-sent call finds nothing left to remove.
]]

local service_key, ids_key, expiry_key, queues_key, wake_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

-- 1. Validate.
local now_ms
if ARGV[1] ~= '' then
  if not string.match(ARGV[1] or '', '^%d+$') then return redis.error_reply('PQ_BADARG now_ms must be an integer >= 0') end
  now_ms = tonumber(ARGV[1])
end
local id, require_expired = ARGV[2], ARGV[3]
if not id or not string.match(id, '^%d+$') then return redis.error_reply('PQ_BADARG id must be an integer') end
if require_expired ~= '0' and require_expired ~= '1' then
  return redis.error_reply('PQ_BADARG require_expired must be 0 or 1')
end
if string.sub(service_key, -(#id + 1)) ~= ':' .. id then
  return redis.error_reply('PQ_BADARG the service key must end with :<id>')
end
if now_ms == nil then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 2. Read.
local expires_ms = redis.call('ZSCORE', expiry_key, id)
if require_expired == '1' and (redis.call('EXISTS', service_key) == 1 or (expires_ms and tonumber(expires_ms) > now_ms)) then
  return { -1, 0 }
end
for key, want in pairs({ [service_key] = 'hash', [ids_key] = 'list', [queues_key] = 'hash', [wake_key] = 'zset' }) do
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. got) end
end

-- 3. Write.
local deleted = redis.call('DEL', service_key)
local removed = redis.call('LREM', ids_key, -1, id)
redis.call('ZREM', expiry_key, id)
redis.call('HDEL', queues_key, id)
redis.call('DEL', wake_key)
return { deleted, removed }
