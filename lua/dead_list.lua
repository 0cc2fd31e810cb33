--[[ dead_list: one page of DEAD jobs, oldest death first. Read only.

KEYS (3), all <prefix>:{<queue>}:<role>
  1 jobs     hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
  2 dead     zset  id -> dead_ms
  3 errors   hash  id -> last error text

ARGV (2)
  1  offset   integer 0..2^31, position in DEAD (oldest first) of the page's first job
  2  limit    integer 1..1000, page size

Returns  {total, job_1 .. job_k}, k <= limit; each job is 6 values:
         id, dead_ms, attempts, max_attempts, error, payload.
Errors   PQ_BADARG, PQ_CORRUPT, WRONGTYPE. Writes nothing.
]]

local jobs_key, dead_key, errors_key = KEYS[1], KEYS[2], KEYS[3]

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

local offset, limit, err
offset, err = int_arg(ARGV[1], 'offset', 0, 2 ^ 31)
if err then return redis.error_reply(err) end
limit, err = int_arg(ARGV[2], 'limit', 1, 1000)
if err then return redis.error_reply(err) end

local total = redis.call('ZCARD', dead_key)
local page = redis.call('ZRANGE', dead_key, offset, offset + limit - 1, 'WITHSCORES')
local reply = { total }
if #page == 0 then return reply end
local ids = {}
for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
local records = redis.call('HMGET', jobs_key, unpack(ids))
local errors = redis.call('HMGET', errors_key, unpack(ids))
for i, id in ipairs(ids) do
  local attempts, max_attempts, payload_at = string.match(records[i] or '', '^(%d+)|(%d+)|%d+|()')
  if not attempts then return redis.error_reply('PQ_CORRUPT no valid record for dead job in ' .. jobs_key) end
  reply[#reply + 1] = id
  reply[#reply + 1] = tonumber(page[2 * i])
  reply[#reply + 1] = tonumber(attempts)
  reply[#reply + 1] = tonumber(max_attempts)
  reply[#reply + 1] = errors[i] or ''
  reply[#reply + 1] = string.sub(records[i], payload_at)
end
return reply
