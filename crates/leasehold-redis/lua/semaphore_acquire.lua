#!lua
-- leasehold semaphore acquire, key layout v1: one permit of a semaphore of capacity N.
--
-- KEYS[1]  capacity key        {ns}:sem:{ver}:{purpose}:{{digest}}:capacity, a string
--                              "<capacity> <width>": the capacity recorded on first use, and
--                              how many slots to look at (more than the capacity only after
--                              an operator lowered it while higher slots were held)
-- KEYS[2]  fence counter key   ...:fence, as a lease's (acquire.lua): fences grow strictly
--                              across every slot of the semaphore
-- KEYS[3]  queue key           ...:queue, a sorted set: waiter's owner token -> when it began
--                              to wait (the server's clock in microseconds)
-- KEYS[4]  heartbeat key       ...:alive, a sorted set: waiter's owner token -> when its place
--                              lapses unless it tries again (server microseconds)
-- KEYS[5]  slot key prefix     ...:slot:, slot k's key is this prefix and k in decimal. Each
--                              slot is a lease key of its own (same value forms as a lease's,
--                              see acquire.lua), so renew.lua and the watchdog keep a permit
--                              as they keep a lease. Slot keys are built here from the prefix:
--                              they share its hash tag, so a Cluster keeps them in its slot
-- ARGV[1]  attempt             "<owner token>:<operation id>", as acquire.lua takes it
-- ARGV[2]  TTL in milliseconds positive integer
-- ARGV[3]  capacity            from 1 to 1024
-- ARGV[4]  queue heartbeat in milliseconds
--                              "0" for a try that does not wait: it takes no place in the
--                              queue. Otherwise a refused try takes (or keeps) its place, and
--                              the place lapses this long after the try unless it tries again
-- ARGV[5]  idle expiry in milliseconds
--                              what the capacity record and the fence counter live after
--                              their last use: the server's clock keeps fences growing
--                              without the counter (acquire.lua)
-- ARGV[6]  min hold in milliseconds, "0" or absent for none (as acquire.lua)
-- ARGV[7]  holder name, "" or absent for none (as acquire.lua)
--
-- Fair: waiters are served in the order they began to wait. With f slots free, the waiters
-- at the first f places of the queue may take them, and nobody else (a waiter at a place at
-- or past the capacity is refused before any slot is read: the common try of a busy
-- semaphore); a try that does not
-- wait, or that begins to wait, is behind every place already taken. A place whose heartbeat
-- lapsed is dropped before anything is decided (at most 64 per call, the oldest first), so a
-- waiter that died never keeps the others out for longer than its heartbeat. Every key
-- expires after its last use: slot keys with their grants, the queue and the heartbeats
-- with the latest heartbeat, the capacity record and the counter after the idle expiry.
--
-- Nothing is written when the capacity asked for is not the one recorded, nor when a key
-- cannot be used (another type, or a value leasehold did not write), as acquire.lua refuses.
--
-- Replies (fence a decimal string; slot, pttl, retry_after and ahead integers):
--   {1, fence, slot}               granted: slot's key was absent and is now this grant, with
--                                  a TTL of max(TTL, min hold)
--   {2, fence, pttl, slot}         replay: this attempt already holds slot; not extended
--   {3, fence, pttl, holder, name, slot}
--                                  conflict: the same owner token holds slot for another
--                                  operation (holder as in acquire.lua)
--   {0, retry_after, ahead}        contended: every slot is held, or the free ones go to the
--                                  `ahead` waiters before this one; try again within
--                                  retry_after ms (the soonest a held slot's TTL runs out, and
--                                  for a waiter at most a third of its heartbeat)
--   {-3, capacity}                 the semaphore's recorded capacity is another; nothing
--                                  written
--   {-2, what}                     nothing written: "lease-type", "lease-value",
--                                  "counter-type", "counter-value", "fence-range" as in
--                                  acquire.lua, or "semaphore-value" for a capacity record or a
--                                  queue leasehold did not write
local TOP = '9223372036854775807'
local LONGEST, LONGEST_TEXT = 332, '332'
-- The most lapsed places dropped per call: a bound on the work of one call.
local DROPPED_PER_CALL = 64

-- No helper functions (see acquire.lua): the body runs once, left with `return`.
local attempt, ttl, capacity, heartbeat = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local idle, hold, name = ARGV[5], ARGV[6] or '0', ARGV[7] or ''
local token = string.match(attempt, '^[^:]*')

local recorded = redis.pcall('GET', KEYS[1])
if type(recorded) == 'table' and recorded.err then
  return {-2, 'semaphore-value'}
end
local width = capacity
if recorded then
  local c, w = string.match(recorded, '^(%d+) (%d+)$')
  if not c then
    return {-2, 'semaphore-value'}
  end
  if tonumber(c) ~= capacity then
    return {-3, tonumber(c)}
  end
  width = math.max(tonumber(w), capacity)
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_text = string.format('%.0f', now_us)

-- Places whose heartbeat lapsed are dropped before anything is decided (a dead waiter keeps
-- nobody out); read here, dropped once no refusal can follow. (pcall: a queue key of another
-- type is refused, not raised.)
local lapsed = redis.pcall('ZRANGEBYSCORE', KEYS[4], '-inf', now_text, 'LIMIT', 0,
  DROPPED_PER_CALL)
local place = redis.pcall('ZRANK', KEYS[3], token)
if (type(lapsed) == 'table' and lapsed.err) or (type(place) == 'table' and place.err) then
  return {-2, 'semaphore-value'}
end
-- A waiter whose place, once the lapsed ones ahead of it are gone, is at or past the capacity
-- cannot be let in now however many slots are free (only the first f places take f free
-- slots): it keeps its place, and no slot is read. Most tries of a busy semaphore are these,
-- and a queued attempt holds no slot, so there is no replay to find.
if place and heartbeat ~= '0' and place >= capacity then
  local effective = place
  for i = 1, #lapsed do
    local rank = redis.call('ZRANK', KEYS[3], lapsed[i])
    if lapsed[i] == token then
      effective = -1
      break
    end
    if rank and rank < place then
      effective = effective - 1
    end
  end
  if effective >= capacity then
    if #lapsed > 0 then
      redis.call('ZREM', KEYS[3], unpack(lapsed))
      redis.call('ZREM', KEYS[4], unpack(lapsed))
    end
    redis.call('ZADD', KEYS[4], string.format('%.0f', now_us + tonumber(heartbeat) * 1000), token)
    if redis.call('PTTL', KEYS[3]) < tonumber(heartbeat) then
      redis.call('PEXPIRE', KEYS[3], heartbeat)
      redis.call('PEXPIRE', KEYS[4], heartbeat)
    end
    return {0, math.max(math.floor(tonumber(heartbeat) / 3), 1), effective}
  end
end

-- Every slot in turn: the attempt's own grant (a replay), how many are held, the lowest
-- free one below the capacity, and the held ones' keys for their TTLs.
local held, free_slot, held_keys, high_held = 0, nil, {}, false
for k = 0, width - 1 do
  local key = KEYS[5] .. k
  local current = redis.pcall('GETRANGE', key, '0', LONGEST_TEXT)
  if type(current) == 'table' then
    return {-2, 'lease-type'}
  end
  if current == '' then
    if not free_slot and k < capacity then
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
    held = held + 1
    held_keys[#held_keys + 1] = key
    if k >= capacity then
      high_held = true
    end
  end
end

if #lapsed > 0 then
  redis.call('ZREM', KEYS[3], unpack(lapsed))
  redis.call('ZREM', KEYS[4], unpack(lapsed))
  place = redis.call('ZRANK', KEYS[3], token)
end
local ahead = place or redis.call('ZCARD', KEYS[3])

if free_slot and capacity - held > ahead then
  -- The fence, exactly as acquire.lua makes it: max(counter + 1, the clock in µs).
  local size = redis.pcall('STRLEN', KEYS[2])
  if type(size) == 'table' then
    return {-2, 'counter-type'}
  end
  if size > #TOP then
    return {-2, 'counter-value'}
  end
  if redis.call('EXISTS', KEYS[5] .. free_slot) == 1 then
    -- An empty string at a slot key: not leasehold's.
    return {-2, 'lease-value'}
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
  if counter == TOP then
    return {-2, 'fence-range'}
  end
  local fence = now
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
  -- The counter lives the idle expiry past the moment the clock passes it (acquire.lua):
  -- the idle expiry, plus the fence's lead over the clock when it is ahead.
  local counter_px = tonumber(idle)
  if fence ~= now then
    counter_px = counter_px + math.max(math.ceil((tonumber(fence) - now_us) / 1000), 0)
  end
  redis.call('SET', KEYS[2], fence, 'PX', string.format('%.0f', counter_px))
  local value, px = fence .. ':' .. attempt, ttl
  if hold ~= '0' or name ~= '' then
    local hold_until = ''
    if hold ~= '0' then
      hold_until = string.format('%.0f', now_us + tonumber(hold) * 1000)
      if tonumber(hold) > tonumber(ttl) then
        px = hold
      end
    end
    value = value .. '\n' .. hold_until .. '\n' .. name
  end
  redis.call('SET', KEYS[5] .. free_slot, value, 'PX', px)
  if place then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
  end
  -- The width shrinks back to the capacity once no slot above it is held.
  if high_held then
    redis.call('SET', KEYS[1], capacity .. ' ' .. width, 'PX', idle)
  else
    redis.call('SET', KEYS[1], capacity .. ' ' .. capacity, 'PX', idle)
  end
  return {1, fence, free_slot}
end

-- Refused: a waiter takes or keeps its place, and the record says the capacity.
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
  -- The queue lives as long as its latest place: extended, never shortened (another
  -- waiter's heartbeat may be longer than this one's).
  if redis.call('PTTL', KEYS[3]) < tonumber(heartbeat) then
    redis.call('PEXPIRE', KEYS[3], heartbeat)
    redis.call('PEXPIRE', KEYS[4], heartbeat)
  end
  local third = math.max(math.floor(tonumber(heartbeat) / 3), 1)
  if not retry_after or retry_after > third then
    retry_after = third
  end
end
if not recorded then
  redis.call('SET', KEYS[1], capacity .. ' ' .. width, 'PX', idle)
end
return {0, retry_after or 1, ahead}
