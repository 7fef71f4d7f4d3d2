#!lua
-- leasehold semaphore capacity, key layout v1: an operator's change of a semaphore's
-- capacity, which evicts no holder.
--
-- KEYS[1]  capacity key        as semaphore_acquire.lua: "<capacity> <width>"
-- KEYS[2]  queue key           as semaphore_acquire.lua
-- KEYS[3]  slot key prefix     as semaphore_acquire.lua: slot k's key is this and k
-- ARGV[1]  capacity            the new capacity, from 1 to the slot limit
-- ARGV[2]  slot limit          the most slots a semaphore can have (MAX_CAPACITY): every slot
--                              below it is looked at, so that a permit held above a record
--                              that was lost (evicted, deleted) still counts
-- ARGV[3]  idle expiry in milliseconds
--                              what the record lives after its last use, as
--                              semaphore_acquire.lua sets it
-- ARGV[4]  channel             where the semaphore's releases are announced: its ":released"
-- ARGV[5]  sharded             "1" to announce with SPUBLISH (Cluster), "0" for PUBLISH
--
-- The record becomes "<capacity> <width>", width = max(the width recorded, the highest held
-- slot + 1, capacity). A holder of a slot at or above the new capacity keeps it: its renewals
-- and its release act on its slot's key alone. semaphore_acquire.lua counts every slot below
-- the width as held and grants only slots below the capacity, so after a lowering nobody new
-- is admitted until fewer than the capacity are held; it shrinks the width back once no slot
-- above the capacity is held. From now on an acquire that asks for another capacity is
-- refused (semaphore_acquire.lua's {-3, capacity}), a waiter's next try included.
--
-- When the capacity grows and someone waits in the queue, the change is announced on the
-- channel (the new capacity as the message), as semaphore_release.lua announces a release,
-- so that waiters try again at once instead of at their next timer; a refused PUBLISH (an
-- ACL without the channel) leaves them their timers. A slot key of another type or with a
-- value leasehold did not write counts as held (the width only grows); nothing is written
-- when the record or the queue holds something leasehold did not write.
--
-- Replies (integers):
--   {1, previous, width, held, announced}
--                                  set: previous is the capacity recorded before (0 for
--                                  none), width the width recorded now, held how many slot
--                                  keys are there, announced 1 if the change was published
--                                  (0 when nobody waits or PUBLISH was refused)
--   {-2, "semaphore-value"}        nothing written: the record or the queue is not leasehold's
local capacity, limit, idle = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local channel, sharded = ARGV[4], ARGV[5] == '1'

local recorded = redis.pcall('GET', KEYS[1])
if type(recorded) == 'table' and recorded.err then
  return {-2, 'semaphore-value'}
end
local previous, width = 0, capacity
if recorded then
  local c, w = string.match(recorded, '^(%d+) (%d+)$')
  if not c or tonumber(c) > limit or tonumber(w) > limit then
    return {-2, 'semaphore-value'}
  end
  previous, width = tonumber(c), math.max(tonumber(w), capacity)
end
-- (pcall: a queue of another type is refused, not raised.)
local waiting = redis.pcall('ZCARD', KEYS[2])
if type(waiting) == 'table' then
  return {-2, 'semaphore-value'}
end

local held = 0
for k = 0, limit - 1 do
  if redis.call('EXISTS', KEYS[3] .. k) == 1 then
    held = held + 1
    if k + 1 > width then
      width = k + 1
    end
  end
end

redis.call('SET', KEYS[1], capacity .. ' ' .. width, 'PX', idle)
local announced = 0
if capacity > previous and waiting > 0 then
  local sent
  if sharded then
    sent = redis.pcall('SPUBLISH', channel, capacity)
  else
    sent = redis.pcall('PUBLISH', channel, capacity)
  end
  if type(sent) == 'number' then
    announced = 1
  end
end
return {1, previous, width, held, announced}
