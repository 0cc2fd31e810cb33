-- Durable steps (lua/README.md section 2.6): what a job committed of its run, in the
-- queue's `steps` hash, and the `waiting` index of the jobs parked for a signal.
-- Fields of `steps`: "<id>" -> the job's index, "\n<entry>\n<entry>\n...", and
-- "<id>\n<entry>" -> that entry's value. An entry is "s:<name>" (a step's result; for a
-- wait, its signal's payload, or "t" when it timed out), "p:<name>" (a sleep or a wait:
-- "<until_ms>|sleep" or "<until_ms>|wait") or "g:<name>" (a signal's payload). Ids hold
-- no control character, so the newline separates them from entries.

-- The most entries (steps, parks and signals together) one job keeps
local MAX_STEP_ENTRIES = 1000

-- A PQ_BADARG text unless `value` is a step's or signal's name: 1..200 bytes without
-- control characters.
local function step_name_arg(value)
  if type(value) ~= 'string' or #value < 1 or #value > 200 or string.find(value, '%c') then
    return 'PQ_BADARG a step or signal name must be 1..200 bytes without control characters, got '
      .. string.format('%q', tostring(value))
  end
end

-- Whether the job's index `index` (false or nil: the job has none) holds `entry`.
local function has_entry(index, entry)
  return index and string.find(index, '\n' .. entry .. '\n', 1, true) ~= nil or false
end

-- A PQ_BADARG text when the job `id`, whose index is `index`, can keep no more entries.
local function entries_full(index, id)
  if not index then return nil end
  local _, n = string.gsub(index, '\n', '')
  if n > MAX_STEP_ENTRIES then
    return 'PQ_BADARG job ' .. id .. ' keeps ' .. MAX_STEP_ENTRIES .. ' steps, parks and signals, the most a job may'
  end
end

-- Write entry `entry` = `value` of job `id` (its index `index`, false for none): the
-- index gains the entry unless it has it. One HSET.
local function put_entry(steps_key, id, index, entry, value)
  if has_entry(index, entry) then
    redis.call('HSET', steps_key, id .. '\n' .. entry, value)
  else
    redis.call('HSET', steps_key, id, (index or '\n') .. entry .. '\n', id .. '\n' .. entry, value)
  end
end

-- What forget_steps deletes for the jobs `ids`: the fields of those that have step data,
-- and those jobs' ids. One HMGET (which proves `steps` a hash), and a TYPE probe of
-- `waiting` when any has. Answers fields, ids; or nil, nil and an error text.
local function steps_of(steps_key, waiting_key, ids)
  local indexes = hmget(steps_key, ids)
  local fields, stepped = {}, {}
  for i = 1, #ids do
    if indexes[i] then
      stepped[#stepped + 1] = ids[i]
      fields[#fields + 1] = ids[i]
      for entry in string.gmatch(indexes[i], '[^\n]+') do fields[#fields + 1] = ids[i] .. '\n' .. entry end
    end
  end
  if #stepped > 0 then
    local err = expect_type(waiting_key, 'zset')
    if err then return nil, nil, err end
  end
  return fields, stepped
end

-- Delete what steps_of found (`forgot`: {fields, ids}; nil: nothing): the jobs ended.
local function forget_steps(steps_key, waiting_key, forgot)
  if not forgot or #forgot[2] == 0 then return end
  call_chunked('HDEL', steps_key, forgot[1])
  call_chunked('ZREM', waiting_key, forgot[2])
end
