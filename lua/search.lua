--[[ search: one page of the jobs that match a filter, in any state. Read only.

Answers "the dead jobs of task send_invoice that failed with TimeoutError since 10:00"
or "the waiting jobs of group tenant-42": every filter given must hold. The page is read
from the narrowest source the filter allows (the plan), and every job read from it is
checked against the whole filter, its state read where the state lives (as get.lua
reads it), so a job that changed state after an index was written is answered in the
state it has now:
  task, group  the queue's indexes (set_indexes.lua, section 2.8): `index`, a
               lexicographic zset of "<t or g>\n<value>\n<enqueued_ms, 15 digits>\n<id>",
               in send order. Given both, the one with fewer members in the range.
  dead         the dead letters by time of death (since/until: that range of `dead`),
               when no index range is smaller.
  scheduled    SCHEDULED (with `waiting`: the jobs parked for a signal), by due time.
  leased       LEASED, by lease deadline.
  ready        the `ready` list from its head, then `gready` (as browse.lua).
  otherwise    HSCAN of `jobs` (every job, in no order): state '' and no task or group.
A task or group filter needs the queue's indexes: a queue without them answers
PQ_BADARG. The indexes hold the jobs sent while they were on (indexed_since_ms).

since_ms/until_ms bound the time of the job's entry: when it died for a dead job,
when it was sent (enqueued_ms) for any other; since inclusive, until exclusive.
error is an exception class: a dead job matches when its error text's part before the
first ':' is that name, or ends with '.' and that name (TimeoutError matches
"asyncio.exceptions.TimeoutError: ..."). It implies state dead.

Pages: a call reads its source in chunks, 100 jobs first and twice as many each time
after, until `count` jobs match, SCAN_MOST (2000) have been read, or the source ends;
it answers the matches (at most `count`) and a cursor to go on from ('' when the
source is exhausted): a page may hold no match and still have a cursor, and a page
whose matches come early reads few jobs. The cursor goes on after the last job read
(or, on a full page, after the job before the first match left out): an index page
after that member, a zset page after that (score, member), so jobs that leave the
source meanwhile shift nothing; a ready or leased page by rank (jobs leased meanwhile
shift it: a job may be missed, as with browse.lua); an HSCAN page by HSCAN's cursor,
"<cursor>:<taken>:<count>" (a job may be seen twice). Each page is one atomic read;
jobs moving between pages may be seen twice or missed. Bulk actions (lua/README.md
section 2.8) check each job again.

KEYS (11), all <prefix>:{<queue>}:<role>
  1 jobs       hash  id -> "<attempts>|<max_attempts>|<due_ms>:<enqueued_ms>|<payload>"
  2 ready      list  READY ids without group or priority, head first
  3 scheduled  zset  id -> due_ms
  4 leased     zset  receipt "<owner>|<call>|<fence>|<attempt>|<id>" -> deadline_ms
  5 dead       zset  id -> dead_ms
  6 errors     hash  id -> last error text of a dead job
  7 counters   hash  `indexes` -> since when the queue keeps indexes; `sequences`
  8 index      zset  "<kind>\n<value>\n<enqueued_ms>\n<id>" -> 0 (section 2.8)
  9 keyed      hash  "x:<id>" -> "<enqueued_ms>\n<group>\n<task>"; sequences' entries
 10 waiting    zset  id -> until_ms, the jobs parked for a signal (section 2.6)
 11 gready     zset  "<group>|<rank>|<id>" -> 0: READY ids with a group or priority

ARGV (9)
  1  now_ms    '' (use the server clock) or integer >= 0; tests only
  2  state     '' (any), 'ready', 'scheduled', 'waiting', 'sequenced', 'leased' or 'dead'
  3  task      '' (any) or a task name, 1..256 bytes without control characters
  4  group     '' (any) or a group, 1..128 bytes without | or control characters
  5  error     '' (any) or an exception class name, 1..256 bytes without ':' or
               control characters
  6  since_ms  '' or integer 0..2^50
  7  until_ms  '' or integer 0..2^50
  8  cursor    '' (the first page) or the cursor a page answered
  9  count     integer 1..500: the most matches in the page

Returns  {now_ms, cursor, examined, indexed_since_ms, entry_1 .. entry_k}: cursor ''
         when the source is exhausted; examined: the jobs read from the source;
         indexed_since_ms: -1 without indexes. Each entry is 10 values: id, state,
         attempts, max_attempts, enqueued_ms (-1: unknown), at_ms (dead: when it died;
         scheduled, waiting: due time; leased: the lease's deadline; ready,
         sequenced: its due_ms), task ('' unknown), group, error (dead) or owner
         (leased) or '', payload_bytes. State 'ready_or_leased': a job found in none
         of the other states when LEASED holds more than 10,000 leases.
Cost     plain case (state 'dead', one dead job): 10 commands (`TIME` included). Per chunk
         read: one read of the source (O(log n + chunk) for an index or zset source),
         one HMGET of `jobs` and of `keyed`, ZMSCOREs of `dead`, `scheduled` and
         `waiting`, and one HMGET of `errors` when dead jobs pass the other filters; once
         per call, when a job may be leased, one ZRANGE of LEASED (at most 10,000: the
         workers' concurrency).
Errors   PQ_BADARG (a filter or cursor that does not parse; task or group on a queue
         without indexes), PQ_CORRUPT, WRONGTYPE. Writes nothing.
Replay   read only.
Contract v6 (lua/README.md section 10): other counts of KEYS or ARGV than above answer
         PQ_CONTRACT, before anything is read or written.
]]

local jobs_key, ready_key, scheduled_key, leased_key, dead_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local errors_key, counters_key, index_key, keyed_key, waiting_key = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local gready_key = KEYS[11]

-- >>> pyqueue includes: generated by `python lua/build.py`; do not edit
-- lua/include/validate.lua (each helper's note is there)
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
local function now_arg(value)
  if value == '' then return nil end
  return int_arg(value, 'now_ms', 0, 2 ^ 53)
end
local function server_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- lua/include/calls.lua (each helper's note is there)
local CHUNK = 500
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
-- lua/include/records.lua (each helper's note is there)
local function receipt_id(receipt)
  return string.match(receipt, '^[%w_.:%-]+|[%w_.:%-]+|%d+|%d+|(.+)$')
end
local function parse_record(record)
  local attempts, max_attempts, due_ms, sent, at = string.match(record, '^(%d+)|(%d+)|(%d+)(:?%d*)|()')
  if not attempts or sent == ':' then return nil end
  return tonumber(attempts), tonumber(max_attempts), tonumber(due_ms), at, tonumber(string.sub(sent, 2))
end
-- <<< pyqueue includes

local contract_error = contract('search', 11, 9, 9)
if contract_error then return redis.error_reply(contract_error) end

-- The most jobs a page reads from its source, and the most leases it reads.
local SCAN_MOST, LEASES_MOST = 2000, 10000
local STATES = { ready = true, scheduled = true, waiting = true, sequenced = true, leased = true, dead = true }

-- 1. Validate.
local now_ms, err = now_arg(ARGV[1])
if err then return redis.error_reply(err) end
local state, task, group, error_class, cursor = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[8]
if state ~= '' and not STATES[state] then
  return redis.error_reply('PQ_BADARG state must be one of ready, scheduled, waiting, sequenced, leased, dead, got '
    .. string.format('%q', state))
end
if task ~= '' and (#task > 256 or string.find(task, '%c')) then
  return redis.error_reply('PQ_BADARG task must be 1..256 bytes without control characters')
end
if group ~= '' and (#group > 128 or string.find(group, '[%c|]')) then
  return redis.error_reply('PQ_BADARG group must be 1..128 bytes without | or control characters')
end
if error_class ~= '' then
  if #error_class > 256 or string.find(error_class, '[%c:]') then
    return redis.error_reply('PQ_BADARG error must be an exception class name, 1..256 bytes without : or control '
      .. 'characters')
  end
  if state ~= '' and state ~= 'dead' then
    return redis.error_reply('PQ_BADARG only dead jobs have an error: state must be dead or none')
  end
  state = 'dead'
end
local since_ms, until_ms = 0, 2 ^ 50
if ARGV[6] ~= '' then since_ms, err = int_arg(ARGV[6], 'since_ms', 0, 2 ^ 50) end
if not err and ARGV[7] ~= '' then until_ms, err = int_arg(ARGV[7], 'until_ms', 0, 2 ^ 50) end
if err then return redis.error_reply(err) end
local count
count, err = int_arg(ARGV[9], 'count', 1, 500)
if err then return redis.error_reply(err) end

-- 2. The plan: the source to read.
local flags = redis.call('HMGET', counters_key, 'indexes', 'sequences')
local indexed_since = tonumber(flags[1] or '-1') or -1
if (task ~= '' or group ~= '') and not flags[1] then
  return redis.error_reply('PQ_BADARG this queue keeps no indexes, so it cannot be searched by task or group: turn '
    .. 'them on (set_indexes.lua; Queue.set_indexes(True))')
end
-- An index range: members of one value sent in [since, until) (for a dead job the
-- time is its death, checked below: its range is the value's whole range).
local function range(kind, value)
  local prefix = kind .. '\n' .. value .. '\n'
  if state == 'dead' then return '[' .. prefix, '(' .. kind .. '\n' .. value .. '\011' end
  return '[' .. prefix .. string.format('%015d', since_ms), '(' .. prefix .. string.format('%015d', until_ms)
end
local source, lo, hi, size = nil, nil, nil, nil
for _, tag in ipairs({ { 't', task }, { 'g', group } }) do
  if tag[2] ~= '' then
    local a, b = range(tag[1], tag[2])
    local n = redis.call('ZLEXCOUNT', index_key, a, b)
    if not size or n < size then source, lo, hi, size = 'i', a, b, n end
  end
end
if state == 'dead' then
  local n = redis.call('ZCOUNT', dead_key, string.format('%d', since_ms), '(' .. string.format('%d', until_ms))
  if not size or n < size then source, size = 'd', n end
end
if not source then
  source = state == 'scheduled' and 's' or state == 'waiting' and 'w' or state == 'leased' and 'l'
    or state == 'ready' and 'r' or 'h'
end
-- A cursor goes with its source: "<source letter><position>".
if cursor ~= '' and string.sub(cursor, 1, 1) ~= source then
  return redis.error_reply('PQ_BADARG this cursor is not one of this search\'s (its filter changed?)')
end

-- 3. The source, read in chunks: read(at, limit) answers up to `limit` ids from the
-- position `at` (a cursor without its letter), the cursor after each of them
-- (after(k)), and whether the source may hold more.
-- A zset by score from `lo_score` up to (not with) `hi_score`, after the (score, member)
-- of `at`.
local function zset_read(key, lo_score, hi_score, at, limit)
  local rows, full, tail
  if at == '' then
    rows = redis.call('ZRANGEBYSCORE', key, lo_score, '(' .. string.format('%d', hi_score), 'WITHSCORES', 'LIMIT', 0,
      limit)
    full = #rows == 2 * limit
  else
    local score, member = string.match(at, '^([^\n]+)\n(.*)$')
    if not score or not tonumber(score) then return nil, 'PQ_BADARG this cursor does not parse' end
    local rank = redis.call('ZRANK', key, member)
    if rank and tonumber(redis.call('ZSCORE', key, member)) == tonumber(score) then
      rows = redis.call('ZRANGE', key, rank + 1, rank + limit, 'WITHSCORES')
      full = #rows == 2 * limit
    else
      -- Gone meanwhile: from its score on, past the members of that score up to it
      -- (equal scores are in member order).
      local all = redis.call('ZRANGEBYSCORE', key, score, '(' .. string.format('%d', hi_score), 'WITHSCORES', 'LIMIT',
        0, limit)
      rows, full = {}, #all == 2 * limit
      -- (a full read of equal scores, all up to the cursor's member, goes on after the last)
      if full then tail = all[#all] .. '\n' .. all[#all - 1] end
      for i = 1, #all, 2 do
        if tonumber(all[i + 1]) ~= tonumber(score) or all[i] > member then
          rows[#rows + 1], rows[#rows + 2] = all[i], all[i + 1]
        end
      end
    end
  end
  local ids, marks, more = {}, { [0] = tail or at }, full
  for i = 1, #rows, 2 do
    if tonumber(rows[i + 1]) >= hi_score then more = false; break end
    ids[#ids + 1], marks[#ids + 1] = rows[i], rows[i + 1] .. '\n' .. rows[i]
  end
  return ids, function(k) return marks[k] end, more
end
local function read(at, limit)
  if source == 'i' then
    local members = redis.call('ZRANGEBYLEX', index_key, at == '' and lo or '(' .. at, hi, 'LIMIT', 0, limit)
    local ids = {}
    for i, member in ipairs(members) do
      ids[i] = string.match(member, '^[tg]\n[^\n]*\n%d+\n(.*)$')
      if not ids[i] then return nil, 'PQ_CORRUPT unparsable member in ' .. index_key end
    end
    return ids, function(k) return k == 0 and at or members[k] end, #members == limit
  elseif source == 'd' then
    return zset_read(dead_key, string.format('%d', since_ms), until_ms, at, limit)
  elseif source == 's' or source == 'w' then
    return zset_read(source == 's' and scheduled_key or waiting_key, '-inf', 2 ^ 53, at, limit)
  elseif source == 'h' then
    -- HSCAN's cursor, and how many of the page it answers were taken, of a page read
    -- with which COUNT (the same COUNT from the same cursor answers the same page while
    -- the hash is not resized).
    local from, skip = '0', 0
    if at ~= '' then
      local c, k, n = string.match(at, '^(%d+):(%d+):(%d+)$')
      if not c then return nil, 'PQ_BADARG this cursor does not parse' end
      from, skip = c, tonumber(k)
      if skip > 0 then limit = math.min(tonumber(n), SCAN_MOST) end
    end
    local page = redis.call('HSCAN', jobs_key, from, 'COUNT', limit)
    local ids, size = {}, #page[2] / 2
    for i = 2 * skip + 1, #page[2], 2 do ids[#ids + 1] = page[2][i] end
    return ids, function(k)
      return k + skip >= size and page[1] .. ':0:0' or from .. ':' .. (skip + k) .. ':' .. limit
    end, page[1] ~= '0'
  end
  -- By rank: the leases, or READY (the list, then `gready`).
  local rank = at == '' and 0 or tonumber(string.match(at, '^%d+$'))
  if not rank then return nil, 'PQ_BADARG this cursor does not parse' end
  local ids = {}
  if source == 'l' then
    for i, receipt in ipairs(redis.call('ZRANGE', leased_key, rank, rank + limit - 1)) do ids[i] = receipt_id(receipt) end
  else
    local n_ready = redis.call('LLEN', ready_key)
    if rank < n_ready then ids = redis.call('LRANGE', ready_key, rank, rank + limit - 1) end
    if #ids < limit then
      local from = math.max(rank - n_ready, 0)
      for _, member in ipairs(redis.call('ZRANGE', gready_key, from, from + limit - #ids - 1)) do
        ids[#ids + 1] = string.match(member, '^[^|]*|[^|]*|(.*)$')
      end
    end
  end
  return ids, function(k) return string.format('%d', rank + k) end, #ids == limit
end

-- 4. Check each job read against the whole filter, in its state now (its record, index
-- entry and state read in a few commands per chunk), until `count` match, SCAN_MOST
-- have been read, or the source ends. Chunks grow from CHUNK_FIRST: a page of few
-- matches near its start reads few jobs.
local CHUNK_FIRST = 100
local leases, leases_all = nil, true
local function lease_of(id)
  if not leases then
    leases = {}
    local rows = redis.call('ZRANGE', leased_key, 0, LEASES_MOST - 1, 'WITHSCORES')
    leases_all = #rows < 2 * LEASES_MOST
    for i = 1, #rows, 2 do leases[receipt_id(rows[i])] = { rows[i], tonumber(rows[i + 1]) } end
  end
  return leases[id]
end
local function behind_head(id)
  if not flags[2] then return false end
  local entry = redis.call('HGET', keyed_key, 'j:' .. id)
  return entry and redis.call('HGET', keyed_key, 's:' .. (string.match(entry, '^%d+|%d+|%a|(.+)$') or '')) ~= id
end
-- The jobs of `ids` that match, in order: {i, id, state, at_ms, extra, record, entry}.
local function check(ids)
  local records = hmget(jobs_key, ids)
  local fields = {}
  for i, id in ipairs(ids) do fields[i] = 'x:' .. id end
  local entries = hmget(keyed_key, fields)
  local dead = redis.call('ZMSCORE', dead_key, unpack(ids))
  local scheduled = redis.call('ZMSCORE', scheduled_key, unpack(ids))
  local waiting = redis.call('ZMSCORE', waiting_key, unpack(ids))
  local found, dead_found = {}, {}
  for i, id in ipairs(ids) do
    local record = records[i]
    local job = { i = i, id = id, record = record }
    if record then
      job.attempts, job.max_attempts, job.due_ms, job.payload_at, job.enqueued_ms = parse_record(record)
      if not job.attempts then return nil, 'PQ_CORRUPT job ' .. id .. ' has an unreadable record' end
    end
    local _, entry_group, entry_task = string.match(entries[i] or '', '^(%d+)\n([^\n]*)\n(.*)$')
    job.task, job.group = entry_task or '', entry_group or ''
    -- A job whose record is gone ended between its index entry and now: skipped.
    local ok = record ~= nil and (task == '' or entry_task == task) and (group == '' or entry_group == group)
    local s, at_ms, extra = nil, job.due_ms, ''
    if ok then
      if dead[i] then
        s, at_ms = 'dead', tonumber(dead[i])
      elseif scheduled[i] then
        s, at_ms = tonumber(waiting[i]) == tonumber(scheduled[i]) and 'waiting' or 'scheduled', tonumber(scheduled[i])
      elseif state == '' or state == 'leased' or state == 'ready' or state == 'sequenced' then
        local lease = lease_of(id)
        if lease then
          s, at_ms, extra = 'leased', lease[2], string.match(lease[1], '^[^|]+')
        elseif behind_head(id) then
          s = 'sequenced'
        else
          s = leases_all and 'ready' or 'ready_or_leased'
        end
      end
      ok = s ~= nil and (state == '' or s == state or s == 'ready_or_leased' and (state == 'ready' or state == 'leased'))
    end
    -- (A record written before v5 has no enqueued_ms: a time bound leaves it out, and a
    -- search without one finds it.)
    if ok and (ARGV[6] ~= '' or ARGV[7] ~= '') then
      local t = s == 'dead' and at_ms or job.enqueued_ms or -1
      ok = t >= since_ms and t < until_ms
    end
    if ok then
      job.state, job.at_ms, job.extra = s, at_ms, extra
      found[#found + 1] = job
      if s == 'dead' then dead_found[#dead_found + 1] = job end
    end
  end
  -- The dead ones' errors, in one read; the error class decides.
  if #dead_found > 0 then
    local dead_ids = {}
    for k, job in ipairs(dead_found) do dead_ids[k] = job.id end
    local errors = hmget(errors_key, dead_ids)
    for k, job in ipairs(dead_found) do
      job.extra = errors[k] or ''
      if error_class ~= '' then
        local class = string.match(job.extra, '^%s*([^:]-)%s*:') or string.match(job.extra, '^%s*(.-)%s*$')
        job.miss = class ~= error_class and string.sub(class, -#error_class - 1) ~= '.' .. error_class
      end
    end
  end
  return found
end

now_ms = now_ms or server_now_ms()
local out, at, examined, chunk = { now_ms, '', 0, indexed_since }, string.sub(cursor, 2), 0, CHUNK_FIRST
local matched = 0
while true do
  local ids, after, more = read(at, math.min(chunk, SCAN_MOST - examined))
  if not ids then return redis.error_reply(after) end
  local found = {}
  if #ids > 0 then
    found, err = check(ids)
    if not found then return redis.error_reply(err) end
  end
  for _, job in ipairs(found) do
    if not job.miss then
      matched = matched + 1
      if matched > count then
        -- A full page: the next goes on after the job before this one.
        out[2], out[3] = source .. after(job.i - 1), examined + job.i - 1
        return out
      end
      local n = #out
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = job.id, job.state, job.attempts, job.max_attempts
      out[n + 5], out[n + 6], out[n + 7], out[n + 8] = job.enqueued_ms or -1, job.at_ms or -1, job.task, job.group
      out[n + 9], out[n + 10] = job.extra, #job.record - job.payload_at + 1
    end
  end
  examined = examined + #ids
  out[3] = examined
  if not more then
    out[2] = ''
    return out
  end
  at = after(#ids)
  out[2] = source .. at
  if examined >= SCAN_MOST then return out end
  chunk = chunk * 2
end
