--[[ enqueue: add one or many jobs to a queue.

A job whose id already exists in any state (scheduled, ready, leased, dead), or was
acked less than the acker's keep_done_ms ago (its tombstone in `done` is still in the
future), is a duplicate: it is skipped and reported, nothing about the existing job
changes. An expired tombstone is ignored and left for acks to trim (so a producer needs
no command that removes anything).
Jobs with delay_ms = 0 go to the tail of READY; others to SCHEDULED at now + delay_ms.
A job with a group or a priority other than 0 gets a `meta` entry, and while READY it
waits in `gready` (its group gets a place in `ring`), not in `ready` (section 2.1).

A job may have an expiry (section 2.7): lease.lua ends it as `expired`, never run, if it
is not leased within expires_ms of this call. A job may have a key (section 2.7):
  debounce: the job is due window_ms after the send. While the key's job is scheduled
    and not yet due, a later send with that key (any id, or the key's job's own id)
    replaces its arguments (payload, max_attempts, priority, group, expiry) and pushes
    its due time to window_ms after this send: it runs once, with the last arguments.
    A send after the key's job became due (it is ready, running or retrying) adds a new
    job, which then holds the key: at most one job per key is pending at any time.
  throttle: the first send of a window adds a job and opens the key's window for
    window_ms; a send inside the window adds nothing (its flag names the window's job).
  sequence: the jobs of a key run one at a time, in send order. The first send while
    the key has no job is its head, enqueued as any job; a later one is added behind
    it, in `sequenced` only, until every job sent before it has ended (lease.lua,
    ack.lua, ack_result.lua, cancel.lua, dead_purge.lua and sequence_skip.lua hand the
    key on), or, under the policy skip, gone dead (nack.lua, lease.lua, promote.lua and
    scrub.lua hand it on). Its delay counts from its send.
  rate: the job gets a rate entry: lease.lua leases it no faster than its key's limit
    (section 2.7). A debounce merge takes the last send's rate key, or none.
A queue with a byte budget (set_budget.lua; `counters` has `budget`) keeps each added
job's payload size, "b:<id>" in `keyed`, and their sum, `bytes` in `counters` (a merge
the last send's size); a call that would take `bytes` past the budget is refused.
A queue that keeps indexes (set_indexes.lua; `counters` has `indexes`) lists each added
job with a task name or a group in `index`, "x:<id>" in `keyed` naming its members (a
merge takes its last send's).
  A duplicate id (above) is a duplicate before its key is looked at.

KEYS (16), all <prefix>:{<queue>}:<role>
  1 jobs       hash  id -> "<attempts>|<max_attempts>|<due_ms>:<enqueued_ms>|<payload>"
  2 ready      list  job ids, head = next to lease
  3 scheduled  zset  id -> due_ms
  4 counters   hash  counter name -> integer
  5 wake       zset  the single member "wake" while workers should wake up
  6 done       zset  id -> ms until which an acked id stays a duplicate (tombstones)
  7 meta       hash  id -> "<priority>|<pos>|<group>" of jobs with a group or a priority
  8 gready     zset  "<group>|<rank>|<id>" -> 0: READY jobs with meta (lexicographic)
  9 ring       zset  group -> turn (>= 1) or -1 (parked at its cap)
 10 groups     hash  r:<group>, c:<group>, cap, turn, seq, uturn
 11 events     stream  the queue's events, when it has opted in (section 2.5): 'enqueued'
                   per job added (not per duplicate), with due_ms when it is delayed;
                   'debounced' per send merged into a job, 'throttled' per send dropped
 12 keyed      hash  "d:<key>" / "t:<key>" -> the id of the job holding a debounce / throttle
                   key; "r:<id>" -> a job's rate entry (section 2.7); "s:", "j:": sequences;
                   "b:<id>" -> a job's payload size, under a byte budget
 13 windows    zset  "d:<key>" / "t:<key>" -> ms until which that job holds the key;
                   "k:<key>" -> until when a rate key's state means something (trimmed here)
 14 expires    zset  id -> deadline_ms of a job sent with an expiry, until its first lease
 15 sequenced  zset  "<key>\n<seq>\n<id>" -> 0: the jobs of sequences behind their head
 16 index      zset  "<kind>\n<value>\n<enqueued_ms>\n<id>" -> 0: the indexes (set_indexes.lua),
                   written when the queue keeps them (counters `indexes`)

ARGV (2 + 8n)
  1  now_ms        '' (use the server clock) or integer >= 0; tests only
  2  n             integer 1..1000, number of jobs
  then per job, 8 values:
     id            1..256 bytes, no control characters
     payload       bytes, may be empty
     delay_ms      integer 0..2^40
     max_attempts  integer 1..10000
     priority      '' (0) or integer -5..5: a higher level is leased sooner
     group         '' (none) or 1..128 bytes without | or control characters
     expires_ms    '' (none) or integer 1..2^40, more than delay_ms (and than a debounce
                   window): the job must be leased within this long of the send
     key           '' (none), "debounce|<window_ms>|<key>" (delay_ms must be 0),
                   "throttle|<window_ms>|<key>" or "sequence|<block or skip>|<key>": window_ms
                   1..2^40, key 1..256 bytes without control characters; or a rate key
                   "rate|<count>/<period_ms>/<burst>/<cost>|<key>" (count 1..1000000,
                   period_ms 1..86400000, burst 1..1000000, cost 1..burst); or both, the
                   flow key first, joined by a newline; and a task name "task|<name>" (name
                   1..256 bytes without control characters) on a line of its own: a queue
                   that keeps indexes (set_indexes.lua) lists the job under it (section 2.8)

Returns  {added, duplicates, flag_1 .. flag_n}; flag_i is 1 if job i was added,
         0 if it was a duplicate (of an existing job, of an acked or expired job whose
         tombstone is in force, or of an earlier job in this call), or the id of the
         job its key gave it to (debounced: that job runs with job i's arguments;
         throttled: job i was dropped). Such a send counts in neither total.
Cost     plain case (one job, a queue with no optional feature on): 8 commands;
         with an expiry +3; a keyed send that adds a job +5, one debounced into the
         key's pending job +6, one throttled +0; +2 per call that trims stale keys; a
         sequence's head +4, a job behind it +5; a job with a rate key +4; a call under
         a byte budget +3; a call that adds indexed jobs +4
Errors   PQ_BADARG (nothing written), PQ_FULL (the call would take the queue past its
         byte budget, set_budget.lua; nothing written), WRONGTYPE (a key holds another
         Redis type; nothing written).
Replay   re-sending the same call finds every job present, or acked and tombstoned,
         and adds nothing (an ack with keep_done_ms = 0 leaves no tombstone).
Contract v6 (lua/README.md section 10): other counts of KEYS or ARGV than above answer
         PQ_CONTRACT, before anything is read or written.
]]

local jobs_key, ready_key, scheduled_key, counters_key, wake_key, done_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local meta_key, events_key, keyed_key, windows_key, expires_key = KEYS[7], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local sequenced_key, index_key = KEYS[15], KEYS[16]

-- >>> pyqueue includes: generated by `python lua/build.py`; do not edit
-- lua/include/validate.lua (each helper's note is there)
local MAX_BATCH = 1000
local NONE = {}
local CONTRACT_VERSION = 6
local function contract(script, nkeys, lo, hi, step)
  local expected, got
  if #KEYS ~= nkeys then
    expected, got = nkeys .. (nkeys == 1 and ' key' or ' keys'), #KEYS
  elseif #ARGV < lo or #ARGV > hi or (#ARGV - lo) % (step or 1) ~= 0 then
    expected, got = lo .. (lo == 1 and ' argument' or ' arguments'), #ARGV
    if hi > lo then expected = lo .. '..' .. hi .. ' arguments' end
    if step then expected = expected .. ' in steps of ' .. step end
  else
    return nil
  end
  return string.format('PQ_CONTRACT %s expects %s (contract v%d), got %d', script, expected, CONTRACT_VERSION, got)
end
local function int_arg(value, name, lo, hi)
  if type(value) ~= 'string' or not string.find(value, '^%-?%d+$') then
    return nil, 'PQ_BADARG ' .. name .. ' must be an integer, got ' .. string.format('%q', tostring(value))
  end
  local n = tonumber(value)
  if n < lo or n > hi then
    return nil, string.format('PQ_BADARG %s must be in [%d, %d], got %s', name, lo, hi, value)
  end
  return n
end
local function id_arg(value)
  if type(value) ~= 'string' or #value < 1 or #value > 256 or string.find(value, '%c') then
    return 'PQ_BADARG id must be 1..256 bytes without control characters'
  end
end
local function now_arg(value)
  if value == '' then return nil end
  return int_arg(value, 'now_ms', 0, 2 ^ 53)
end
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function expect_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'WRONGTYPE ' .. key .. ' holds a ' .. got .. ', expected a ' .. want
  end
end
-- lua/include/calls.lua (each helper's note is there)
local CHUNK = 500
local function call_chunked(cmd, key, values)
  for i = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
end
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
-- lua/include/records.lua (each helper's note is there)
local function record_head(attempts, max_attempts, due_ms, enqueued_ms)
  if enqueued_ms then return string.format('%d|%d|%d:%d|', attempts, max_attempts, due_ms, enqueued_ms) end
  return string.format('%d|%d|%d|', attempts, max_attempts, due_ms)
end
-- lua/include/events.lua (each helper's note is there)
local function events_bound(counters_key, events_key, value)
  if value == nil then value = redis.call('HGET', counters_key, 'events') end
  local bound = value and tonumber(value)
  if not bound or bound < 1 then return nil end
  local err = expect_type(events_key, 'stream')
  if err then return nil, err end
  return bound
end
local function emit(events_key, bound, kind, id, now_ms, ...)
  if bound then
    redis.call('XADD', events_key, 'MAXLEN', bound, '0-*', 'type', kind, 'id', id, 'ms', string.format('%d', now_ms), ...)
  end
end
-- lua/include/control.lua (each helper's note is there)
local KEY_MODES = { debounce = 'd:', throttle = 't:', sequence = 's:' }
local KEY_TRIM = 10
local function rate_limit_arg(value, zero)
  local count, period, burst = string.match(value, '^(%d+)/(%d+)/(%d+)$')
  if not count then
    return nil, nil, nil, 'PQ_BADARG a rate limit is "<count>/<period_ms>/<burst>", got ' .. string.format('%q', value)
  end
  local c, p, b, err = tonumber(count), tonumber(period), tonumber(burst), nil
  if c < (zero and 0 or 1) or c > 1000000 then
    err = 'PQ_BADARG a rate limit\'s count must be in [' .. (zero and 0 or 1) .. ', 1000000], got ' .. count
  elseif p < 1 or p > 86400000 then
    err = 'PQ_BADARG a rate limit\'s period_ms must be in [1, 86400000], got ' .. period
  elseif b < 1 or b > 1000000 then
    err = 'PQ_BADARG a rate limit\'s burst must be in [1, 1000000], got ' .. burst
  end
  if err then return nil, nil, nil, err end
  return c, p, b
end
local function rate_arg(value)
  local limit, cost, key = string.match(value, '^rate|(%d+/%d+/%d+)/(%d+)|(.*)$')
  if not limit then
    return nil, 'PQ_BADARG a rate key must be "rate|<count>/<period_ms>/<burst>/<cost>|<key>", got '
      .. string.format('%q', value)
  end
  local _, _, burst, err = rate_limit_arg(limit, false)
  if err then return nil, err end
  local c = tonumber(cost)
  if c < 1 or c > burst then
    return nil, 'PQ_BADARG a job\'s cost must be in [1, burst] (' .. burst .. '): more could never pass, got ' .. cost
  end
  if #key < 1 or #key > 256 or string.find(key, '%c') then
    return nil, 'PQ_BADARG key must be 1..256 bytes without control characters'
  end
  return { limit = limit, cost = c, key = key }
end
local function key_arg(value)
  if value == '' then return nil end
  local mode, window, key = string.match(value, '^(%l+)|([^|]*)|(.*)$')
  if not mode or not KEY_MODES[mode] then
    return nil, 'PQ_BADARG key must be "debounce|<window_ms>|<key>", "throttle|<window_ms>|<key>" or '
      .. '"sequence|<block or skip>|<key>", got ' .. string.format('%q', value)
  end
  local window_ms, err, policy = 0, nil, nil
  if mode == 'sequence' then
    if window ~= 'block' and window ~= 'skip' then
      return nil, 'PQ_BADARG a sequence\'s failure policy must be block or skip, got ' .. string.format('%q', window)
    end
    policy = string.sub(window, 1, 1)
  else
    window_ms, err = int_arg(window, mode .. ' window_ms', 1, 2 ^ 40)
    if err then return nil, err end
  end
  if #key < 1 or #key > 256 or string.find(key, '%c') then
    return nil, 'PQ_BADARG key must be 1..256 bytes without control characters'
  end
  return { mode = mode, window_ms = window_ms, policy = policy, key = key, field = KEY_MODES[mode] .. key }
end
local function task_arg(value)
  local name = string.sub(value, 6)
  if #name < 1 or #name > 256 or string.find(name, '%c') then
    return nil, 'PQ_BADARG a task name must be "task|<name>", name 1..256 bytes without control characters, got '
      .. string.format('%q', value)
  end
  return name
end
local function keys_arg(value)
  if value == '' then return false, false, false end
  local got, err = { key = false, rate = false, task = false }, nil
  for line in string.gmatch(value .. '\n', '([^\n]*)\n') do
    local kind = string.sub(line, 1, 5) == 'rate|' and 'rate' or string.sub(line, 1, 5) == 'task|' and 'task'
      or line ~= '' and 'key' or nil
    if not kind or got[kind] then
      err = 'PQ_BADARG a job\'s keys are lines joined by newlines, at most one each of a flow key, a rate key '
        .. '("rate|...") and a task name ("task|..."), got ' .. string.format('%q', value)
    elseif kind == 'rate' then
      got.rate, err = rate_arg(line)
    elseif kind == 'task' then
      got.task, err = task_arg(line)
    else
      got.key, err = key_arg(line)
    end
    if err then return nil, nil, nil, err end
  end
  return got.key, got.rate, got.task
end
local function budget_refusal(counters_key, budget, used, delta)
  if delta > 0 and used + delta > budget then
    return string.format('PQ_FULL the queue is at its byte budget: %d of %d bytes in use, this call adds %d (%s)',
      used, budget, delta, counters_key)
  end
end
local function index_entry(enqueued_ms, group, task)
  if (task or '') == '' and (group or '') == '' then return nil end
  return string.format('%d', enqueued_ms) .. '\n' .. (group or '') .. '\n' .. (task or '')
end
local function index_members(id, entry, out)
  local enqueued_ms, group, task = string.match(entry, '^(%d+)\n([^\n]*)\n(.*)$')
  if not enqueued_ms then return nil end
  local at = string.format('%015d', tonumber(enqueued_ms))
  if task ~= '' then out[#out + 1] = 't\n' .. task .. '\n' .. at .. '\n' .. id end
  if group ~= '' then out[#out + 1] = 'g\n' .. group .. '\n' .. at .. '\n' .. id end
  return out
end
-- lua/include/groups.lua (each helper's note is there)
local PRIORITY_MIN, PRIORITY_MAX = -5, 5
local POS_MID = 5000000000000000
local function fair_keys(first)
  return { meta = KEYS[first], gready = KEYS[first + 1], ring = KEYS[first + 2], groups = KEYS[first + 3] }
end
local function fair_arg(priority, group)
  local p, err = 0, nil
  if priority ~= '' then
    p, err = int_arg(priority, 'priority', PRIORITY_MIN, PRIORITY_MAX)
    if err then return nil, err end
  end
  if #group > 128 or string.find(group, '[%c|]') then
    return nil, 'PQ_BADARG group must be 1..128 bytes without | or control characters'
  end
  return p
end
local function fair_member(group, priority, pos, id)
  return group .. '|' .. string.char(53 - priority) .. pos .. '|' .. id
end
local function fair_slots(F, group)
  local v = redis.call('HMGET', F.groups, 'r:' .. group, 'c:' .. group, 'cap')
  return tonumber(v[1] or '0') or 0, tonumber(v[2] or v[3] or '0') or 0
end
local function fair_activate(F, group)
  if redis.call('ZSCORE', F.ring, group) then return end
  local running, cap = fair_slots(F, group)
  if cap == 0 or running < cap then
    redis.call('ZADD', F.ring, redis.call('HINCRBY', F.groups, 'turn', 1), group)
  else
    redis.call('ZADD', F.ring, -1, group)
  end
end
local function fair_enter(F, ids, metas, head)
  local plain, fair = {}, {}
  for i, id in ipairs(ids) do
    if metas[i] then fair[#fair + 1] = i else plain[#plain + 1] = id end
  end
  if #fair == 0 then return plain end
  local last = redis.call('HINCRBY', F.groups, 'seq', #fair)
  local members, entries, activate = {}, {}, {}
  for k, i in ipairs(fair) do
    local meta, id = metas[i], ids[i]
    local seq = head and last - k + 1 or last - #fair + k
    local pos = string.format('%016.0f', head and POS_MID - seq or POS_MID + seq)
    members[2 * k - 1], members[2 * k] = 0, fair_member(meta.group, meta.priority, pos, id)
    entries[2 * k - 1], entries[2 * k] = id, meta.priority .. '|' .. pos .. '|' .. meta.group
    if meta.group ~= '' and not activate[meta.group] then
      activate[meta.group] = true
      activate[#activate + 1] = meta.group
    end
  end
  call_chunked('ZADD', F.gready, members)
  call_chunked('HSET', F.meta, entries)
  for _, g in ipairs(activate) do fair_activate(F, g) end
  return plain
end
local function fair_types(F)
  return expect_type(F.meta, 'hash') or expect_type(F.gready, 'zset') or expect_type(F.ring, 'zset')
    or expect_type(F.groups, 'hash')
end
-- <<< pyqueue includes

local contract_error = contract('enqueue', 16, 10, 2 + 8 * MAX_BATCH, 8)
if contract_error then return redis.error_reply(contract_error) end

-- 1. Validate every argument before touching a key.
local n, err = int_arg(ARGV[2], 'n', 1, MAX_BATCH)
if err then return redis.error_reply(err) end
if #ARGV ~= 2 + 8 * n then
  return redis.error_reply(string.format('PQ_BADARG expected %d arguments for %d jobs, got %d', 2 + 8 * n, n, #ARGV))
end
local now_ms
now_ms, err = now_arg(ARGV[1])
if err then return redis.error_reply(err) end
-- expiries[i]: job i's expires_ms or false; keys[i]: its key (key_arg) or false; rates[i]:
-- its rate key (rate_arg) or false.
-- tasks[i]: its task name (task_arg) or false.
local ids, delays, maxes, metas, expiries, keys, rates, any_keyed, any_rated = {}, {}, {}, {}, {}, {}, {}, false, false
local tasks = {}
for i = 1, n do
  local base = 8 * i - 6
  local id = ARGV[base + 1]
  err = id_arg(id)
  if err then return redis.error_reply(err .. ', job ' .. i) end
  ids[i] = id
  delays[i], err = int_arg(ARGV[base + 3], 'delay_ms', 0, 2 ^ 40)
  if err then return redis.error_reply(err) end
  maxes[i], err = int_arg(ARGV[base + 4], 'max_attempts', 1, 10000)
  if err then return redis.error_reply(err) end
  local priority, group = ARGV[base + 5], ARGV[base + 6]
  metas[i] = false
  if priority ~= '' or group ~= '' then
    local p
    p, err = fair_arg(priority, group)
    if err then return redis.error_reply(err .. ', job ' .. i) end
    if p ~= 0 or group ~= '' then metas[i] = { priority = p, pos = '', group = group } end
  end
  expiries[i] = false
  keys[i], rates[i], tasks[i], err = keys_arg(ARGV[base + 8])
  if err then return redis.error_reply(err .. ', job ' .. i) end
  if rates[i] then any_rated = true end
  if keys[i] then
    any_keyed = true
    if keys[i].mode == 'debounce' then
      -- A debounced job is due when its window has passed since the last send.
      if delays[i] ~= 0 then
        return redis.error_reply('PQ_BADARG a debounced job is due at the end of its window: delay_ms must be 0, job ' .. i)
      end
      delays[i] = keys[i].window_ms
    end
  end
  if ARGV[base + 7] ~= '' then
    expiries[i], err = int_arg(ARGV[base + 7], 'expires_ms', 1, 2 ^ 40)
    if err then return redis.error_reply(err) end
    if expiries[i] <= delays[i] then
      return redis.error_reply('PQ_BADARG expires_ms must be more than the delay (or the debounce window): '
        .. 'the job could never start, job ' .. i)
    end
  end
end

-- 2. Read: which ids exist already, which were acked recently. HMGET and ZMSCORE also
-- prove `jobs` is a hash and `done` a zset.
local existing = redis.call('HMGET', jobs_key, unpack(ids))
local tombstones = redis.call('ZMSCORE', done_key, unpack(ids))
now_ms = now_ms or server_now_ms()

-- The keys' holders, by field: {id, new = the index of the send that added it in this
-- call, or false}. A field whose window has passed holds nothing; nor does a debounce
-- field whose job is no longer scheduled after now (cancelled, promoted by hand). Up to
-- KEY_TRIM such stale fields are trimmed below. (These reads prove `keyed` a hash and
-- `windows` and `scheduled` zsets.)
local held, stale, any_windowed = {}, NONE, false
if any_keyed then
  local fields, listed = {}, {}
  for i = 1, n do
    local field = keys[i] and keys[i].field
    if field and not listed[field] then listed[field], fields[#fields + 1] = true, field end
  end
  local holders = redis.call('HMGET', keyed_key, unpack(fields))
  -- Windows (debounce, throttle) only: a sequence's head holds its key until it ends.
  local windowed = {}
  for _, field in ipairs(fields) do
    if string.sub(field, 1, 1) ~= 's' then windowed[#windowed + 1] = field end
  end
  local untils = #windowed > 0 and redis.call('ZMSCORE', windows_key, unpack(windowed)) or NONE
  local at = 0
  local debounce_fields, debounce_ids = {}, {}
  for k, field in ipairs(fields) do
    local until_ms
    if string.sub(field, 1, 1) ~= 's' then
      at = at + 1
      until_ms = untils[at] and tonumber(untils[at])
    end
    if holders[k] and string.sub(field, 1, 1) == 's' then
      held[field] = { id = holders[k], new = false, src = false } -- a sequence's head, until it ends
    elseif holders[k] and until_ms and until_ms > now_ms then
      held[field] = { id = holders[k], new = false, src = false }
      if string.sub(field, 1, 1) == 'd' then
        debounce_fields[#debounce_fields + 1], debounce_ids[#debounce_ids + 1] = field, holders[k]
      end
    end
  end
  if #debounce_ids > 0 then
    -- Still scheduled? And what a merge must undo: its meta and its expiry (these reads
    -- also prove `meta` a hash and `expires` a zset).
    local dues = redis.call('ZMSCORE', scheduled_key, unpack(debounce_ids))
    local had_meta = redis.call('HMGET', meta_key, unpack(debounce_ids))
    local had_expiry = redis.call('ZMSCORE', expires_key, unpack(debounce_ids))
    for k, field in ipairs(debounce_fields) do
      if dues[k] and tonumber(dues[k]) > now_ms then
        held[field].meta, held[field].expiry = had_meta[k], had_expiry[k]
      else
        held[field] = nil
      end
    end
  end
  any_windowed = #windowed > 0
end
-- Stale fields to trim: windows past, and rate keys' state past its time (rates: its
-- producers pay for the trim). The read proves `windows` a zset, and a rated job's HSET
-- needs `keyed` proven a hash when no read above did.
if any_windowed or any_rated then
  stale = redis.call('ZRANGEBYSCORE', windows_key, '-inf', now_ms, 'LIMIT', 0, KEY_TRIM)
end
if any_rated and not any_keyed then err = expect_type(keyed_key, 'hash') end
if err then return redis.error_reply(err) end

-- 3. Decide each send, in order. src[i], for a job i this call adds, is the send whose
-- arguments it takes: i, or the last send debounced into it. `merged` lists the keys'
-- existing jobs that a send debounced into (each with its own src).
-- The reply is {added, duplicates, flag_1 .. flag_n}; the two counts are set at the end.
local reply = { 0, 0 }
local seen = n > 1 and {} or nil -- an id repeated in this call is added once
local added, duplicates, src, merged, debounced, throttled = 0, 0, {}, NONE, 0, 0
local behind, n_behind = {}, 0 -- behind[i]: job i waits behind its sequence's head
for i = 1, n do
  local id = ids[i]
  local kept_until = tombstones[i] and tonumber(tombstones[i])
  local dup = existing[i] or seen and seen[id] or kept_until and kept_until > now_ms
  local h = keys[i] and held[keys[i].field]
  if h and keys[i].mode == 'debounce' and (not dup or id == h.id) then
    reply[2 + i] = h.id
    debounced = debounced + 1
    if h.new then
      src[h.new] = i
    else
      if not h.src then
        if merged == NONE then merged = {} end
        merged[#merged + 1] = h
      end
      h.src = i
    end
  elseif dup then
    reply[2 + i] = 0
    duplicates = duplicates + 1
  elseif h and keys[i].mode == 'throttle' then
    reply[2 + i] = h.id -- throttled: dropped
    throttled = throttled + 1
  else
    if seen then seen[id] = true end
    reply[2 + i] = 1
    added = added + 1
    src[i] = i
    if h then
      behind[i], n_behind = true, n_behind + 1
    elseif keys[i] then
      held[keys[i].field] = { id = id, new = i, src = false }
    end
  end
end
reply[1], reply[2] = added, duplicates

-- 4. The writes, planned: records, READY and SCHEDULED entries, meta, expiries, keys.
local records, ready_ids, ready_metas, scheduled_args, later_metas = {}, {}, {}, NONE, {}
local expiry_args, expiry_gone, meta_gone, key_args, window_args = NONE, NONE, NONE, NONE, NONE
-- rate_args: the jobs' rate entries to write; unrated: the rate entries of merged jobs
-- whose last send has none (deleted when the queue has rate keys); keyed_gone: keyed
-- fields to delete.
local rate_args, unrated, keyed_gone = NONE, NONE, NONE
local fair = false
local function schedule(id, due_ms)
  if scheduled_args == NONE then scheduled_args = {} end
  scheduled_args[#scheduled_args + 1] = due_ms
  scheduled_args[#scheduled_args + 1] = id
end
-- Job `id` with the arguments of send s: its record, and its expiry and key entries.
local function plan_job(id, s, key)
  local due_ms = now_ms + delays[s]
  records[#records + 1] = id
  records[#records + 1] = record_head(0, maxes[s], due_ms, now_ms) .. ARGV[8 * s - 4]
  if expiries[s] then
    if expiry_args == NONE then expiry_args = {} end
    expiry_args[#expiry_args + 1] = now_ms + expiries[s]
    expiry_args[#expiry_args + 1] = id
  end
  if rates[s] then
    if rate_args == NONE then rate_args = {} end
    rate_args[#rate_args + 1] = 'r:' .. id
    rate_args[#rate_args + 1] = rates[s].limit .. '/' .. rates[s].cost .. '||' .. rates[s].key
  end
  if key and key.mode ~= 'sequence' then
    if window_args == NONE then window_args = {} end
    -- A debounce key is held until its job is due; a throttle key for its window.
    window_args[#window_args + 1] = key.mode == 'debounce' and due_ms or now_ms + key.window_ms
    window_args[#window_args + 1] = key.field
  end
  return due_ms
end
-- A sequence's jobs: "j:<id>" entries, and the members of those behind their head (their
-- seq numbers are drawn in the writes, below).
local sequence_args, line = NONE, NONE
for i = 1, n do
  if reply[2 + i] == 1 then
    local s = src[i]
    local due_ms = plan_job(ids[i], s, keys[i])
    if keys[i] and keys[i].mode == 'sequence' then
      if sequence_args == NONE then sequence_args, line = {}, {} end
      sequence_args[#sequence_args + 1] = 'j:' .. ids[i]
      sequence_args[#sequence_args + 1] = '|' .. string.format('%d', due_ms) .. '|' .. keys[i].policy .. '|'
        .. keys[i].key
      if behind[i] then line[#line + 1] = #sequence_args end
    end
    if keys[i] and not behind[i] then
      if key_args == NONE then key_args = {} end
      key_args[#key_args + 1] = keys[i].field
      key_args[#key_args + 1] = ids[i]
    end
    if metas[s] then fair = true end
    if behind[i] then
      -- Out of READY and SCHEDULED until its turn: its meta waits as a scheduled job's.
      if metas[s] then
        later_metas[#later_metas + 1] = ids[i]
        later_metas[#later_metas + 1] = metas[s].priority .. '||' .. metas[s].group
      end
    elseif delays[s] == 0 then
      ready_ids[#ready_ids + 1] = ids[i]
      ready_metas[#ready_ids] = metas[s]
    else
      if metas[s] then
        later_metas[#later_metas + 1] = ids[i]
        later_metas[#later_metas + 1] = metas[s].priority .. '||' .. metas[s].group
      end
      schedule(ids[i], due_ms)
    end
  end
end
-- A key's existing job takes its last send's arguments: still SCHEDULED, due anew.
for _, h in ipairs(merged) do
  local s = h.src
  schedule(h.id, plan_job(h.id, s, keys[s]))
  if metas[s] then
    fair = true
    later_metas[#later_metas + 1] = h.id
    later_metas[#later_metas + 1] = metas[s].priority .. '||' .. metas[s].group
  elseif h.meta then
    if meta_gone == NONE then meta_gone = {} end
    meta_gone[#meta_gone + 1] = h.id
  end
  if not expiries[s] and h.expiry then
    if expiry_gone == NONE then expiry_gone = {} end
    expiry_gone[#expiry_gone + 1] = h.id
  end
  -- Its rate is the last send's too: none when that send has none.
  if not rates[s] then
    if unrated == NONE then unrated = {} end
    unrated[#unrated + 1] = 'r:' .. h.id
  end
end
-- Stale fields to trim: those this call does not write again.
local trimmed = NONE
if #stale > 0 then
  local written = {}
  for k = 2, #window_args, 2 do written[window_args[k]] = true end
  trimmed = {}
  for _, field in ipairs(stale) do
    if not written[field] then trimmed[#trimmed + 1] = field end
  end
  if #trimmed > 0 then
    if keyed_gone == NONE then keyed_gone = {} end
    for _, field in ipairs(trimmed) do keyed_gone[#keyed_gone + 1] = field end
  end
end

-- 5. Prove every key we are about to write holds the right type. A plain call's first
-- write is its RPUSH to `ready` (or, with no job ready now, its ZADD to `scheduled`),
-- made by first_write: a key of another type fails it before anything is written, so
-- that key needs no probe (one command less per call). `counters` is proven by the read
-- of its `events` field when a job is added, and is the first write when none is. `wake`
-- is proven by reading the marker, which also spares the write when it is already up
-- (ZMSCORE rather than ZSCORE: the producer's ACL role already grants it, for `done`).
-- A queue that uses groups or priorities says so in `counters` (lease.lua reads it), and
-- one that uses expiries says so too.
local F = fair_keys(7)
local wrote = #records > 0
local first_ready = not fair and #ready_ids > 0
local first_scheduled = not fair and not first_ready and #scheduled_args > 0
if #ready_ids > 0 and not first_ready then err = expect_type(ready_key, 'list') end
if not err and #scheduled_args > 0 and not first_scheduled then err = expect_type(scheduled_key, 'zset') end
-- (A merge's HDEL on `meta` and ZREM on `expires` need no probe: the merge read both.)
if not err and fair then err = fair_types(F) end
if not err and expiry_args ~= NONE then err = expect_type(expires_key, 'zset') end
if not err and n_behind > 0 then err = expect_type(sequenced_key, 'zset') end
-- The events' bound, whether the queue has rate keys (a merged job may have a rate
-- entry to delete only then), and its byte budget: one read of `counters`, which proves
-- it a hash.
local bound, flags
if not err and (wrote or throttled > 0) then
  flags = redis.call('HMGET', counters_key, 'events', 'rates', 'budget', 'bytes', 'sized', 'indexes', 'indexed')
  bound, err = events_bound(counters_key, events_key, flags[1])
end
if err then return redis.error_reply(err) end
-- A byte budget (set_budget.lua): each job's payload size is kept as "b:<id>" in `keyed`
-- and counted in `bytes` (the scripts that end jobs take it off); a call that would take
-- the queue past its budget is refused, with nothing written. A merged job's size is
-- its last send's.
local sized_args, delta = NONE, 0
local budget = flags and tonumber(flags[3] or '')
if budget then
  sized_args = {}
  for i = 1, n do
    if reply[2 + i] == 1 then
      local size = #ARGV[8 * src[i] - 4]
      sized_args[#sized_args + 1], sized_args[#sized_args + 2] = 'b:' .. ids[i], size
      delta = delta + size
    end
  end
  if #merged > 0 then
    local fields = {}
    for k, h in ipairs(merged) do fields[k] = 'b:' .. h.id end
    local olds = redis.call('HMGET', keyed_key, unpack(fields))
    for k, h in ipairs(merged) do
      local size = #ARGV[8 * h.src - 4]
      sized_args[#sized_args + 1], sized_args[#sized_args + 2] = 'b:' .. h.id, size
      delta = delta + size - (tonumber(olds[k] or '0') or 0)
    end
  end
  err = budget_refusal(counters_key, budget, tonumber(flags[4] or '0') or 0, delta)
  if err then return redis.error_reply(err) end
  -- (`keyed` is written below: a probe unless a read above proved it.)
  if not any_keyed and not any_rated then err = expect_type(keyed_key, 'hash') end
  if err then return redis.error_reply(err) end
end
-- Indexes (set_indexes.lua): each job added with a task name or a group gets its
-- members in `index` and its entry "x:<id>" in `keyed`; a merged job's members are those
-- of its last send (its send time and arguments change), so its old ones go.
local index_args, indexed, unindexed = NONE, NONE, NONE
if flags and flags[6] then
  index_args, indexed, unindexed = {}, {}, {}
  local function index_job(id, s)
    local entry = index_entry(now_ms, metas[s] and metas[s].group, tasks[s])
    if entry then
      index_args[#index_args + 1], index_args[#index_args + 2] = 'x:' .. id, entry
      for _, member in ipairs(index_members(id, entry, {})) do
        indexed[#indexed + 1], indexed[#indexed + 2] = 0, member
      end
    end
  end
  for i = 1, n do
    if reply[2 + i] == 1 then index_job(ids[i], src[i]) end
  end
  if #merged > 0 then
    local fields = {}
    for k, h in ipairs(merged) do fields[k] = 'x:' .. h.id end
    local olds = redis.call('HMGET', keyed_key, unpack(fields))
    for k, h in ipairs(merged) do
      if olds[k] and not index_members(h.id, olds[k], unindexed) then
        return redis.error_reply('PQ_CORRUPT unparsable index entry in ' .. keyed_key)
      end
      local listed = #index_args
      index_job(h.id, h.src)
      -- Its last send has neither a task name nor a group: the job is listed no more.
      if olds[k] and #index_args == listed then
        if keyed_gone == NONE then keyed_gone = {} end
        keyed_gone[#keyed_gone + 1] = 'x:' .. h.id
      end
    end
  end
  -- (`keyed` and `index` are written below: probes unless a read above proved them.)
  if #index_args > 0 or #unindexed > 0 then
    err = not any_keyed and not any_rated and not budget and expect_type(keyed_key, 'hash')
      or expect_type(index_key, 'zset') or nil
    if err then return redis.error_reply(err) end
  end
end
local raised = added > 0 and redis.call('ZMSCORE', wake_key, 'wake')[1]

-- 6. Write.
if first_ready then err = first_write('RPUSH', ready_key, ready_ids, 'list') end
if first_scheduled then err = first_write('ZADD', scheduled_key, scheduled_args, 'zset') end
if err then return redis.error_reply(err) end
if duplicates > 0 then redis.call('HINCRBY', counters_key, 'duplicates', duplicates) end
if wrote then
  if added > 0 then redis.call('HINCRBY', counters_key, 'enqueued', added) end
  call_chunked('HSET', jobs_key, records)
  if fair then
    redis.call('HSET', counters_key, 'fair', 1)
    if #later_metas > 0 then call_chunked('HSET', F.meta, later_metas) end
    ready_ids = fair_enter(F, ready_ids, ready_metas, false)
  end
  if meta_gone ~= NONE then call_chunked('HDEL', F.meta, meta_gone) end
  if #ready_ids > 0 and not first_ready then call_chunked('RPUSH', ready_key, ready_ids) end
  if #scheduled_args > 0 and not first_scheduled then call_chunked('ZADD', scheduled_key, scheduled_args) end
  -- A delayed job also wakes a worker: it may have to shorten its blocking wait.
  if added > 0 and not raised then redis.call('ZADD', wake_key, 0, 'wake') end
end
if expiry_args ~= NONE then
  call_chunked('ZADD', expires_key, expiry_args)
  redis.call('HSET', counters_key, 'expiry', 1)
end
if expiry_gone ~= NONE then call_chunked('ZREM', expires_key, expiry_gone) end
if key_args ~= NONE then call_chunked('HSET', keyed_key, key_args) end
if sequence_args ~= NONE then
  local seq, members = n_behind > 0 and redis.call('HINCRBY', keyed_key, 'seq', n_behind) - n_behind or 0, {}
  for k = 2, #sequence_args, 2 do sequence_args[k] = '0' .. sequence_args[k] end
  for k, at in ipairs(line) do
    local number = string.format('%016d', seq + k)
    local key = string.match(sequence_args[at], '^0|%d+|%a|(.*)$')
    sequence_args[at] = number .. string.sub(sequence_args[at], 2)
    members[2 * k - 1], members[2 * k] = 0, key .. '\n' .. number .. '\n' .. string.sub(sequence_args[at - 1], 3)
  end
  call_chunked('HSET', keyed_key, sequence_args)
  if #members > 0 then call_chunked('ZADD', sequenced_key, members) end
  redis.call('HSET', counters_key, 'sequences', 1)
end
if window_args ~= NONE then call_chunked('ZADD', windows_key, window_args) end
if rate_args ~= NONE then
  call_chunked('HSET', keyed_key, rate_args)
  redis.call('HSET', counters_key, 'rates', 1)
end
if sized_args ~= NONE and #sized_args > 0 then
  call_chunked('HSET', keyed_key, sized_args)
  if delta ~= 0 then redis.call('HINCRBY', counters_key, 'bytes', delta) end
  if not flags[5] then redis.call('HSET', counters_key, 'sized', 1) end
end
if index_args ~= NONE then
  if #unindexed > 0 then call_chunked('ZREM', index_key, unindexed) end
  if #index_args > 0 then
    call_chunked('HSET', keyed_key, index_args)
    call_chunked('ZADD', index_key, indexed)
    if not flags[7] then redis.call('HSET', counters_key, 'indexed', 1) end
  end
end
if unrated ~= NONE and flags and flags[2] then
  if keyed_gone == NONE then keyed_gone = {} end
  for _, field in ipairs(unrated) do keyed_gone[#keyed_gone + 1] = field end
end
if keyed_gone ~= NONE then call_chunked('HDEL', keyed_key, keyed_gone) end
if trimmed ~= NONE and #trimmed > 0 then call_chunked('ZREM', windows_key, trimmed) end
if debounced > 0 then redis.call('HINCRBY', counters_key, 'debounced', debounced) end
if throttled > 0 then redis.call('HINCRBY', counters_key, 'throttled', throttled) end
if bound then
  for i = 1, n do
    local flag, s = reply[2 + i], src[i] or i
    if flag == 1 then
      if delays[s] == 0 then
        emit(events_key, bound, 'enqueued', ids[i], now_ms)
      else
        emit(events_key, bound, 'enqueued', ids[i], now_ms, 'due_ms', string.format('%d', now_ms + delays[s]))
      end
    elseif flag ~= 0 then
      emit(events_key, bound, keys[i].mode == 'debounce' and 'debounced' or 'throttled', flag, now_ms, 'send', ids[i])
    end
  end
end
return reply
