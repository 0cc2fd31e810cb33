-- Calls over many values, in chunks that keep every redis.call under Lua's C stack limit.

-- Values per unpack(); keeps every redis.call well under Lua's C stack limit
local CHUNK = 500

-- redis.call(cmd, key, values...) in CHUNK-sized calls (none when `values` is empty).
local function call_chunked(cmd, key, values)
  for i = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
end

-- HMGET of any number of fields, in CHUNK-sized calls; no call for no fields.
local function hmget(key, fields)
  if #fields == 0 then return {} end
  if #fields <= CHUNK then return redis.call('HMGET', key, unpack(fields)) end
  local out = {}
  for i = 1, #fields, CHUNK do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
    for j = 1, #part do out[i + j - 1] = part[j] end
  end
  return out
end

-- A call's first write, as call_chunked(cmd, key, values) (`values` not empty), that
-- proves `key` holds a `want` itself instead of a TYPE probe before it: a key of another
-- type fails the first chunk, before anything is written, and the call answers the
-- WRONGTYPE text expect_type would (Redis's own names no key). Answers nil when written,
-- or the error text (any other error, such as OOM, as Redis gave it).
local function first_write(cmd, key, values, want)
  local reply = redis.pcall(cmd, key, unpack(values, 1, math.min(CHUNK, #values)))
  if type(reply) == 'table' and reply.err then
    -- tostring: fakeredis's Lua hands the error text over as a userdata.
    local text = tostring(reply.err)
    if string.find(text, 'WRONGTYPE', 1, true) then
      return 'WRONGTYPE ' .. key .. ' holds a ' .. redis.call('TYPE', key).ok .. ', expected a ' .. want
    end
    return text
  end
  for i = CHUNK + 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
end
