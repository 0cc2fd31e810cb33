--[[ ack: complete leased jobs. Fenced: only the current lease of a job can ack it.

A receipt still present in `leased` is the job's current lease (even past its deadline,
until maintenance reclaims it): the job record, the lease and its owner index entry are
deleted, and the answer is 'ok'. That answer is given at most once per job, ever: after
it the job is gone. Acked jobs are counted by stats as
leased - nacked - reclaimed - scrubbed - released - (leases outstanding), so the busy path
writes no counter.

KEYS (3), all <prefix>:{<queue>}:<role>
  1 jobs     hash  id -> "<attempts>|<max_attempts>|<due_ms>|<payload>"
  2 leased   zset  receipt -> deadline_ms
  3 owners   zset  receipt -> 0 (lexicographic index: receipts by owner, then call)

ARGV (r)
  1..r receipts  1..1000 receipts "<owner>|<call>|<fence>|<attempt>|<id>" from lease

Returns  {status_1 .. status_r}: 'ok' (acked by this call), 'stale' (the job exists
         under another lease or in another state: this lease lost it), 'gone' (no such
         job: acked before, purged, never enqueued, or repeated in this call).
Errors   PQ_BADARG (nothing written), WRONGTYPE (a key holds another Redis type;
         nothing written).
Replay   a re-sent call finds its receipts gone and changes nothing; its answer is
         'gone' where the lost reply said 'ok'.
]]

local jobs_key, leased_key, owners_key = KEYS[1], KEYS[2], KEYS[3]

local MAX_BATCH = 1000
local CHUNK = 500

local function expect_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'WRONGTYPE ' .. key .. ' holds a ' .. got .. ', expected a ' .. want
  end
end

local function call_chunked(cmd, key, values)
  for i = 1, #values, CHUNK do
    redis.call(cmd, key, unpack(values, i, math.min(i + CHUNK - 1, #values)))
  end
end

-- 1. Validate.
if #ARGV < 1 or #ARGV > MAX_BATCH then return redis.error_reply('PQ_BADARG 1..1000 receipts per call') end
local leases = {}
for i = 1, #ARGV do
  local id = string.match(ARGV[i], '^[%w_.:%-]+|[%w_.:%-]+|%d+|%d+|(.+)$')
  if not id then return redis.error_reply('PQ_BADARG malformed receipt ' .. string.format('%q', ARGV[i])) end
  leases[i] = { receipt = ARGV[i], id = id }
end

-- 2. Read.
local status, receipts, ids, acking = {}, {}, {}, {}
for i, lease in ipairs(leases) do
  if not acking[lease.receipt] and redis.call('ZSCORE', leased_key, lease.receipt) then
    acking[lease.receipt] = true
    status[i] = 'ok'
    receipts[#receipts + 1] = lease.receipt
    ids[#ids + 1] = lease.id
  elseif acking[lease.receipt] then
    status[i] = 'gone'
  else
    status[i] = redis.call('HEXISTS', jobs_key, lease.id) == 1 and 'stale' or 'gone'
  end
end

-- 3. Write. `leased` was read above; `jobs` and `owners` may not have been.
if #receipts > 0 then
  local err = expect_type(owners_key, 'zset') or expect_type(jobs_key, 'hash')
  if err then return redis.error_reply(err) end
  call_chunked('ZREM', leased_key, receipts)
  call_chunked('ZREM', owners_key, receipts)
  call_chunked('HDEL', jobs_key, ids)
end
return status
