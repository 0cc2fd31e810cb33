--[[ service_register: register a new service (a worker process) in a namespace.

Allocates the next id (INCR of the namespace's counter), asserts that id's key does not
exist, writes it, expires it after expire_ms (renewals push this back), and lists the id.
The client also names a random registration token that never changes while this
registration lives: the service's lease owner is `<namespace>.<id>.<registration>`, and
renewal, stop, deregistration and scrub act only on the registration they name. So if
the id counter starts again (a Redis emptied by a restart without persistence), a new
service that gets an old id shares neither its leases nor its fate with the old one.
The id's key must be passed in KEYS, so the client names the id it expects (the
counter + 1): if another service registered first, the answer is {'retry', next_id}
and nothing is written. Also forgets, from the ids list only, up to gc_limit of the
oldest listed ids whose service expired (the expiry zset keeps them for scrubbing).

KEYS (5), all <prefix>:{<namespace>}:service:<role>
  1 seq       string  the last allocated id
  2 ids       list    ids, newest first (LPUSH), trimmed to capacity
  3 expiry    zset    id -> expires_ms; kept after the key expires, until the service
                      is deregistered or scrubbed
  4 queues    hash    id -> "<registration> <queues>": its registration token, a space,
                      and the queues it serves, comma-separated
  5 service   hash    <prefix>:{<namespace>}:service:<id>, the service's own key:
                      host, pid, started, renewed (ms, server clock), renewal (token),
                      registration, queues; stop (ms) once a remote stop asked it to
                      stop (service_stop.lua); expires after expire_ms

ARGV (10)
  1  now_ms       '' (use the server clock) or integer >= 0; tests only
  2  id           integer >= 1, the id the client expects (counter + 1)
  3  host         1..255 bytes
  4  pid          integer 0..2^31
  5  queues       comma-separated queue names, 1..4096 bytes
  6  expire_ms    integer 1000..86400000
  7  capacity     integer 1..100000, longest the ids list may grow
  8  gc_limit     integer 0..1000, most expired ids forgotten from the list per call
  9  renewal      1..64 bytes of [A-Za-z0-9_.:-]: token the first renewal must show
 10  registration 1..16 bytes of [A-Za-z0-9]: random, fixed for this registration

Returns  {'ok', id, started_ms} or {'retry', next_id}.
Errors   PQ_BADARG, PQ_EXISTS (the new id's key already exists: another program writes
         in this namespace), WRONGTYPE; nothing is written on any error.
Replay   a re-sent call finds the id taken and answers {'retry', id + 1}; the first
         run's registration stands (the driver, seeing its own renewal token on the key
         of the id it asked for, takes it as registered).
]]

local seq_key, ids_key, expiry_key, queues_key, service_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local function int_arg(value, name, lo, hi)
  if type(value) ~= 'string' or not string.match(value, '^%-?%d+$') then
    return nil, 'PQ_BADARG ' .. name .. ' must be an integer, got ' .. string.format('%q', tostring(value))
  end
  local n = tonumber(value)
  if n < lo or n > hi then
    return nil, string.format('PQ_BADARG %s must be in [%d, %d], got %s', name, lo, hi, value)
  end
  return n
end

local function expect_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'WRONGTYPE ' .. key .. ' holds a ' .. got .. ', expected a ' .. want
  end
end

-- 1. Validate.
local err, now_ms, id, pid, expire_ms, capacity, gc_limit
if ARGV[1] ~= '' then
  now_ms, err = int_arg(ARGV[1], 'now_ms', 0, 2 ^ 53)
  if err then return redis.error_reply(err) end
end
id, err = int_arg(ARGV[2], 'id', 1, 2 ^ 53)
if err then return redis.error_reply(err) end
local host, queues, renewal, registration = ARGV[3], ARGV[5], ARGV[9], ARGV[10]
if #host < 1 or #host > 255 then return redis.error_reply('PQ_BADARG host must be 1..255 bytes') end
pid, err = int_arg(ARGV[4], 'pid', 0, 2 ^ 31)
if err then return redis.error_reply(err) end
if #queues < 1 or #queues > 4096 then return redis.error_reply('PQ_BADARG queues must be 1..4096 bytes') end
expire_ms, err = int_arg(ARGV[6], 'expire_ms', 1000, 86400000)
if err then return redis.error_reply(err) end
capacity, err = int_arg(ARGV[7], 'capacity', 1, 100000)
if err then return redis.error_reply(err) end
gc_limit, err = int_arg(ARGV[8], 'gc_limit', 0, 1000)
if err then return redis.error_reply(err) end
if not renewal or #renewal > 64 or not string.match(renewal, '^[%w_.:%-]+$') then
  return redis.error_reply('PQ_BADARG renewal must be 1..64 bytes of [A-Za-z0-9_.:-]')
end
if not registration or #registration > 16 or not string.match(registration, '^%w+$') then
  return redis.error_reply('PQ_BADARG registration must be 1..16 bytes of [A-Za-z0-9]')
end
if string.find(queues, ' ', 1, true) then return redis.error_reply('PQ_BADARG queues must not contain spaces') end
if string.sub(service_key, -(#ARGV[2] + 1)) ~= ':' .. ARGV[2] then
  return redis.error_reply('PQ_BADARG the service key must end with :<id>')
end

-- 2. Read.
local next_id = tonumber(redis.call('GET', seq_key) or '0') + 1
if next_id ~= id then return { 'retry', next_id } end
if redis.call('EXISTS', service_key) == 1 then
  return redis.error_reply('PQ_EXISTS ' .. service_key .. ' already exists: another program writes in this namespace')
end
if now_ms == nil then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local forget = {}
if gc_limit > 0 then
  local oldest = redis.call('LRANGE', ids_key, -gc_limit, -1)
  for _, listed in ipairs(oldest) do
    local expires_ms = redis.call('ZSCORE', expiry_key, listed)
    if not expires_ms or tonumber(expires_ms) <= now_ms then forget[#forget + 1] = listed end
  end
end
err = expect_type(ids_key, 'list') or expect_type(expiry_key, 'zset') or expect_type(queues_key, 'hash')
if err then return redis.error_reply(err) end

-- 3. Write. INCR first: if `seq` holds another type it fails before anything else.
redis.call('INCR', seq_key)
redis.call('HSET', service_key, 'host', host, 'pid', pid, 'started', now_ms, 'renewed', now_ms,
  'renewal', renewal, 'registration', registration, 'queues', queues)
redis.call('PEXPIRE', service_key, expire_ms)
for _, listed in ipairs(forget) do redis.call('LREM', ids_key, -1, listed) end
redis.call('LPUSH', ids_key, id)
redis.call('LTRIM', ids_key, 0, capacity - 1)
redis.call('ZADD', expiry_key, now_ms + expire_ms, id)
redis.call('HSET', queues_key, id, registration .. ' ' .. queues)
return { 'ok', id, now_ms }
