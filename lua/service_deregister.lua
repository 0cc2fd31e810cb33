--[[ service_deregister: remove one registration of a service from its namespace.

Two uses: a service stopping cleanly (after releasing its leases) removes itself; a
live service that has scrubbed every queue of a dead service forgets it. With
require_expired set, nothing happens unless the service's expiry has passed, so a
reaper can never forget a service that renewed in the meantime.

Fenced by the registration token: the service key, its wake marker and the namespace
entries are removed only while they belong to the named registration. After Redis lost
its data, the id counter starts again and a new service may get an old service's id;
the old service's deregistration then changes nothing of the new one.

KEYS (5), all <prefix>:{<namespace>}:service:<role>
  1 service   hash  <prefix>:{<namespace>}:service:<id>
  2 ids       list  listed ids
  3 expiry    zset  id -> expires_ms
  4 queues    hash  id -> "<registration> <queues>"
  5 wake      zset  <prefix>:{<namespace>}:service:<id>:wake, the service's private wake
                    marker (raised to interrupt its blocking wait on a stop)

ARGV (4)
  1  now_ms            '' (use the server clock) or integer >= 0; tests only
  2  id                the service id
  3  require_expired   '0' (the service itself) or '1' (a reaper)
  4  registration      the registration token (1..16 bytes of [A-Za-z0-9]), as given
                       to service_register or reported dead by service_renew

Returns  {deleted, removed}: whether the key was deleted (0 if it had expired), and
         how many entries of the ids list were removed (LREM from the tail);
         {-1, 0} and nothing written when the id belongs to another registration, or
         (require_expired) when the service is still alive.
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
local id, require_expired, registration = ARGV[2], ARGV[3], ARGV[4]
if not id or not string.match(id, '^%d+$') then return redis.error_reply('PQ_BADARG id must be an integer') end
if require_expired ~= '0' and require_expired ~= '1' then
  return redis.error_reply('PQ_BADARG require_expired must be 0 or 1')
end
if not registration or #registration > 16 or not string.match(registration, '^%w+$') then
  return redis.error_reply('PQ_BADARG registration must be 1..16 bytes of [A-Za-z0-9]')
end
if string.sub(service_key, -(#id + 1)) ~= ':' .. id then
  return redis.error_reply('PQ_BADARG the service key must end with :<id>')
end
if now_ms == nil then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 2. Read. Whose is this id now? The key names its registration while it lives; the
-- queues entry outlives the key (for scrubbing) and names it too.
local expires_ms = redis.call('ZSCORE', expiry_key, id)
local alive = redis.call('EXISTS', service_key) == 1
local entry = redis.call('HGET', queues_key, id)
if alive and redis.call('HGET', service_key, 'registration') ~= registration
    or entry and string.match(entry, '^(%w*) ') ~= registration then
  return { -1, 0 }
end
if require_expired == '1' and (alive or (expires_ms and tonumber(expires_ms) > now_ms)) then
  return { -1, 0 }
end
for key, want in pairs({ [ids_key] = 'list', [wake_key] = 'zset' }) do
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
