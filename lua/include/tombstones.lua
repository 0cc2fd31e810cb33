-- Tombstones of acked ids in `done` (lua/README.md section 2).

-- Expired tombstones are trimmed this many at a time, at least
local TRIM_BATCH = 10

-- Remove up to `most` of the `expired` tombstones of `key` (done), counted before any
-- write, once at least TRIM_BATCH have expired: the lowest ranks are the earliest
-- expiries. A removal is a write Redis allows at its memory limit, and after it the
-- script's other writes are allowed too (tests/test_operations.py pins this down).
local function trim_done(key, expired, most)
  if expired >= TRIM_BATCH then
    redis.call('ZREMRANGEBYRANK', key, 0, math.min(expired, most) - 1)
  end
end

-- Tombstone acked ids in `key` (done; ack.lua). Trim the `expired` lowest ranks first: ZADD may re-rank them.
-- With a tombstone limit (`most`: counters `done_max`, set_tombstone_limit.lua), the
-- earliest-expiring tombstones past it go too, in force or not, at most #ids + TRIM_BATCH
-- a call (so a lowered limit is reached over a few calls, each bounded).
local function bury(key, ids, expired, now_ms, keep_done_ms, most)
  trim_done(key, expired, #ids + TRIM_BATCH)
  local kept_until = now_ms + keep_done_ms
  if keep_done_ms == 0 then
    return
  elseif #ids == 1 then
    redis.call('ZADD', key, kept_until, ids[1])
  else
    local args = {}
    for i, id in ipairs(ids) do args[2 * i - 1], args[2 * i] = kept_until, id end
    call_chunked('ZADD', key, args)
  end
  if most then
    local over = redis.call('ZCARD', key) - most
    if over > 0 then redis.call('ZREMRANGEBYRANK', key, 0, math.min(over, #ids + TRIM_BATCH) - 1) end
  end
end
