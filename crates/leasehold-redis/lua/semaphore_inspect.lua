#!lua flags=no-writes
-- leasehold semaphore inspect, key layout v1. Read-only (no-writes), and so on a replica too:
-- an operator's view of a semaphore, whoever holds its permits.
--
-- KEYS[1]  capacity key        as semaphore_acquire.lua: "<capacity> <width>"
-- KEYS[2]  heartbeat key       as semaphore_acquire.lua: waiter's owner token -> when its
--                              place lapses (server microseconds)
-- KEYS[3]  slot key prefix     as semaphore_acquire.lua: slot k's key is this and k
-- ARGV[1]  slot limit          the most slots a semaphore can have (MAX_CAPACITY): all of them
--                              are looked at when no capacity is recorded (a record evicted or
--                              deleted while permits are held), and a record above it is not
--                              leasehold's
--
-- Slots 0 to width - 1 are read as inspect.lua reads a lease key, every form of the value
-- (acquire.lua describes them), never more of it than the longest (LONGEST, as in
-- acquire.lua) and one byte. A waiter is a place in the queue whose heartbeat has not lapsed:
-- the place of a waiter that died, not yet dropped by an acquire, is not counted.
--
-- Replies (fence a decimal string; holder, name and released as in inspect.lua):
--   {0}                            no semaphore: no capacity recorded, no slot held, no waiter
--   {1, capacity, width, waiting, {slot, {2, fence, pttl, holder, name, released}}, ...}
--                                  one entry per held slot, in slot order, the inner table as
--                                  inspect.lua answers for a lease held by someone else;
--                                  capacity 0 when none is recorded, and then width is the
--                                  highest held slot + 1
--   {-2, what}                     a key cannot be used, as in acquire.lua: "semaphore-value"
--                                  for a capacity record or heartbeats leasehold did not write,
--                                  "lease-type" or "lease-value" for a slot key
-- The longest value a lease stores, in bytes (acquire.lua), and GETRANGE's end for it.
local LONGEST, LONGEST_TEXT = 332, '332'

local limit = tonumber(ARGV[1])
local recorded = redis.pcall('GET', KEYS[1])
if type(recorded) == 'table' and recorded.err then
  return {-2, 'semaphore-value'}
end
local capacity, width = 0, limit
if recorded then
  local c, w = string.match(recorded, '^(%d+) (%d+)$')
  if not c or tonumber(c) > limit or tonumber(w) > limit then
    return {-2, 'semaphore-value'}
  end
  capacity, width = tonumber(c), math.max(tonumber(c), tonumber(w))
end

local time = redis.call('TIME')
local now_text = string.format('%.0f', tonumber(time[1]) * 1000000 + tonumber(time[2]))
local waiting = redis.pcall('ZCOUNT', KEYS[2], '(' .. now_text, '+inf')
if type(waiting) == 'table' then
  return {-2, 'semaphore-value'}
end

local held, highest = {}, -1
for k = 0, width - 1 do
  local key = KEYS[3] .. k
  -- PTTL tells an absent key (-2) from one that is there, of any type and size, unread.
  local pttl = redis.call('PTTL', key)
  if pttl ~= -2 then
    local current = redis.pcall('GETRANGE', key, '0', LONGEST_TEXT)
    if type(current) == 'table' then
      return {-2, 'lease-type'}
    end
    if #current > LONGEST then
      return {-2, 'lease-value'}
    end
    -- The grant comes before the first newline, the name after the second (a third, last,
    -- is a mark: see acquire.lua).
    local grant, name = string.match(current, '^([^\n]*)\n%d*\n([^\n]*)\n?$')
    if not grant then
      grant, name = current, ''
    end
    local fence, token = string.match(grant, '^(%d+):([^:]+):')
    if not fence then
      return {-2, 'lease-value'}
    end
    local view
    if string.sub(token, 1, 1) == '~' then
      -- Released, kept until its minimum hold ends: the token is already a fingerprint.
      view = {2, fence, pttl, string.sub(token, 2), name, 1}
    else
      view = {2, fence, pttl, string.sub(redis.sha1hex(token), 1, 16), name, 0}
    end
    held[#held + 1] = {k, view}
    highest = k
  end
end

if not recorded then
  if #held == 0 and waiting == 0 then
    return {0}
  end
  width = highest + 1
end
local reply = {1, capacity, width, waiting}
for i = 1, #held do
  reply[#reply + 1] = held[i]
end
return reply
