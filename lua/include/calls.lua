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
