#!lua
-- leasehold read/write acquire, key layout v1: one side of a read/write lease.
--
-- KEYS[1]  writer key          {ns}:rw:{ver}:{purpose}:{{digest}}:slot:w, the writer's grant
--                              (the value forms of a lease key, acquire.lua)
-- KEYS[2]  fence counter key   ...:fence: the last writer's fence (see below)
-- KEYS[3]  queue key           ...:queue, a sorted set: waiter's owner token -> when it began
--                              to wait (server microseconds), readers and writers
-- KEYS[4]  heartbeat key       ...:alive, a sorted set: waiter's owner token -> when its place
--                              lapses unless it tries again
-- KEYS[5]  writers key         ...:writers, a sorted set: the waiting writers' tokens -> when
--                              they began to wait
-- KEYS[6]  slot key prefix     ...:slot:, reader slot k's key is this and k, 0 to 63 (and the
--                              writer's is this and "w"); built here, same hash tag
-- ARGV[1]  attempt             "<owner token>:<operation id>"
-- ARGV[2]  TTL in milliseconds positive integer
-- ARGV[3]  mode                "read" or "write"
-- ARGV[4]  queue heartbeat in milliseconds
--                              "0" for a try that does not wait, as semaphore_acquire.lua
-- ARGV[5]  idle expiry in milliseconds
--                              what the counter lives after its last use
-- ARGV[6]  holder name, "" or absent for none
--
-- Many readers or one writer, writers preferred: a writer comes in when nobody holds either
-- side and no writer waits before it (writers in the order they began to wait); a reader
-- comes in when no writer holds the lease or waits for it, so a stream of readers cannot
-- starve a writer. A place whose heartbeat lapsed is dropped first (at most 64 per call), so
-- a dead waiter blocks nobody for longer than its heartbeat.
--
-- A writer's grant has a new fence, max(counter + 1, the clock in µs), as a lease's; the
-- counter keeps it. A reader's fence is the counter: the fence of the last writer before it
-- (or, before any writer, the clock in µs, which then becomes the counter), so that a target
-- that stores each write's fence can refuse a reader whose view a newer writer replaced. A
-- reader's fence is therefore shared with the other readers of that writer; its grant is
-- still its own (owner token and operation).
--
-- Replies (fence a decimal string; slot an integer, -1 for the writer's):
--   {1, fence, slot}               granted
--   {2, fence, pttl, slot}         replay: this attempt already holds it; not extended
--   {3, fence, pttl, holder, name, slot}
--                                  conflict: the same owner token holds it for another
--                                  operation
--   {0, retry_after, ahead}        refused: try again within retry_after ms; ahead is how many
--                                  writers wait before this one (for a reader: how many wait)
--   {-2, what}                     nothing written, as semaphore_acquire.lua
local TOP = '9223372036854775807'
local LONGEST, LONGEST_TEXT = 332, '332'
local READERS = 64
local DROPPED_PER_CALL = 64

local attempt, ttl, mode, heartbeat, idle = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local name = ARGV[6] or ''
local token = string.match(attempt, '^[^:]*')
local writing = mode == 'write'

-- The writer's slot first, then every reader's: the attempt's own grant (a replay), who
-- holds what, the lowest free reader slot, and the holders' keys for their TTLs.
local writer_held, readers, free_slot, held_keys = false, 0, nil, {}
for k = -1, READERS - 1 do
  local key = KEYS[6] .. k
  if k == -1 then
    key = KEYS[1]
  end
  local current = redis.pcall('GETRANGE', key, '0', LONGEST_TEXT)
  if type(current) == 'table' then
    return {-2, 'lease-type'}
  end
  if current == '' then
    if k >= 0 and not free_slot then
      free_slot = k
    end
  else
    if #current > LONGEST then
      return {-2, 'lease-value'}
    end
    local grant, holder_name = current, ''
    if string.find(current, '\n', 1, true) then
      grant, holder_name = string.match(current, '^([^\n]*)\n%d*\n([^\n]*)\n?$')
      if not grant then
        return {-2, 'lease-value'}
      end
    end
    local fence, owner, operation = string.match(grant, '^(%d+):([^:]+):(.*)$')
    if not fence then
      return {-2, 'lease-value'}
    end
    if owner .. ':' .. operation == attempt then
      return {2, fence, redis.call('PTTL', key), k}
    end
    if owner == token then
      return {3, fence, redis.call('PTTL', key), string.sub(redis.sha1hex(owner), 1, 16),
        holder_name, k}
    end
    held_keys[#held_keys + 1] = key
    if k == -1 then
      writer_held = true
    else
      readers = readers + 1
    end
  end
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_text = string.format('%.0f', now_us)

local lapsed = redis.pcall('ZRANGEBYSCORE', KEYS[4], '-inf', now_text, 'LIMIT', 0,
  DROPPED_PER_CALL)
local writers = redis.pcall('ZCARD', KEYS[5])
if (type(lapsed) == 'table' and lapsed.err) or type(writers) ~= 'number' then
  return {-2, 'semaphore-value'}
end
if #lapsed > 0 then
  redis.call('ZREM', KEYS[3], unpack(lapsed))
  redis.call('ZREM', KEYS[4], unpack(lapsed))
  redis.call('ZREM', KEYS[5], unpack(lapsed))
  writers = redis.call('ZCARD', KEYS[5])
end
local ahead = writers
if writing then
  ahead = redis.call('ZRANK', KEYS[5], token) or writers
end

local admitted
if writing then
  admitted = not writer_held and readers == 0 and ahead == 0
else
  admitted = not writer_held and writers == 0 and free_slot ~= nil
end

if admitted then
  local size = redis.pcall('STRLEN', KEYS[2])
  if type(size) == 'table' then
    return {-2, 'counter-type'}
  end
  if size > #TOP then
    return {-2, 'counter-value'}
  end
  local us = time[2]
  if #us < 6 then
    us = string.rep('0', 6 - #us) .. us
  end
  local now = time[1] .. us
  local counter = redis.call('GET', KEYS[2]) or '0'
  if counter ~= '0'
    and (not string.find(counter, '^[1-9]%d*$')
      or #counter > #TOP or (#counter == #TOP and counter > TOP)) then
    return {-2, 'counter-value'}
  end
  local fence, key, slot = counter, KEYS[1], -1
  if writing then
    if counter == TOP then
      return {-2, 'fence-range'}
    end
    fence = now
    if #counter > #now or (#counter == #now and counter >= now) then
      local d = #counter
      while d > 0 and string.byte(counter, d) == 57 do
        d = d - 1
      end
      if d == 0 then
        fence = '1' .. string.rep('0', #counter)
      else
        fence = string.sub(counter, 1, d - 1) .. string.char(string.byte(counter, d) + 1)
          .. string.rep('0', #counter - d)
      end
    end
  else
    -- Before any writer, the clock is the epoch readers follow, and the next writer's fence
    -- is above it.
    if counter == '0' then
      fence = now
    end
    key, slot = KEYS[6] .. free_slot, free_slot
  end
  if redis.call('EXISTS', key) == 1 then
    return {-2, 'lease-value'}
  end
  -- The counter lives the idle expiry past the moment the clock passes it (acquire.lua):
  -- the idle expiry, plus the fence's lead over the clock when it is ahead.
  local counter_px = tonumber(idle)
  if fence ~= now then
    counter_px = counter_px + math.max(math.ceil((tonumber(fence) - now_us) / 1000), 0)
  end
  redis.call('SET', KEYS[2], fence, 'PX', string.format('%.0f', counter_px))
  local value = fence .. ':' .. attempt
  if name ~= '' then
    value = value .. '\n\n' .. name
  end
  redis.call('SET', key, value, 'PX', ttl)
  redis.call('ZREM', KEYS[3], token)
  redis.call('ZREM', KEYS[4], token)
  if writing then
    redis.call('ZREM', KEYS[5], token)
  end
  return {1, fence, slot}
end

local retry_after = nil
for i = 1, #held_keys do
  local pttl = redis.call('PTTL', held_keys[i])
  if pttl > 0 and (not retry_after or pttl < retry_after) then
    retry_after = pttl
  end
end
if heartbeat ~= '0' then
  redis.call('ZADD', KEYS[3], 'NX', now_text, token)
  redis.call('ZADD', KEYS[4], string.format('%.0f', now_us + tonumber(heartbeat) * 1000), token)
  if writing then
    redis.call('ZADD', KEYS[5], 'NX', now_text, token)
  end
  -- Each set lives as long as its latest place: extended, never shortened.
  for i = 3, 5 do
    if (i < 5 or writing) and redis.call('PTTL', KEYS[i]) < tonumber(heartbeat) then
      redis.call('PEXPIRE', KEYS[i], heartbeat)
    end
  end
  local third = math.max(math.floor(tonumber(heartbeat) / 3), 1)
  if not retry_after or retry_after > third then
    retry_after = third
  end
end
return {0, retry_after or 1, ahead}
