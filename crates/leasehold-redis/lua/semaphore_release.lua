#!lua flags=allow-oom
-- leasehold semaphore release, key layout v1: one permit, or whatever an attempt holds; also
-- either side of a read/write lease (rw_acquire.lua), whose slots are its readers' and whose
-- writer's key is the slot "w".
--
-- KEYS[1]  capacity key        as semaphore_acquire.lua (absent for a read/write lease)
-- KEYS[2]  queue key           as semaphore_acquire.lua
-- KEYS[3]  heartbeat key       as semaphore_acquire.lua
-- KEYS[4]  slot key prefix     as semaphore_acquire.lua
-- KEYS[5]  writers key         rw_acquire.lua's waiting writers (absent for a semaphore)
-- ARGV[1]  grant               "<fence>:<owner token>:<operation id>", or
--                              ":<owner token>:<operation id>" for whatever slot and fence
--                              this attempt holds (the cleanup after an acquire whose reply
--                              was lost, or after a wait given up): then the attempt's place
--                              in the queue is given back too
-- ARGV[2]  slot                the grant's slot, "w" for a writer's; "" with a grant without
--                              a fence: every slot up to the width recorded (or ARGV[3]) is
--                              looked at, and the writer's too if ARGV[6] is "1"
-- ARGV[3]  capacity            the capacity the grant was asked with
-- ARGV[4]  channel             where releases are announced: the semaphore's ":released"
-- ARGV[5]  sharded             "1" to announce with SPUBLISH (Cluster), "0" for PUBLISH
-- ARGV[6]  writer              "1" for a read/write lease: a cleanup looks at the writer's
--                              slot too
--
-- A slot's key is released exactly as release.lua releases a lease key: only the exact grant
-- (the stored value up to its first newline), and a grant whose minimum hold has not ended
-- is turned into a record kept until the hold ends. The release is announced (the fence on
-- the channel) only when someone waits in the queue: a release nobody waits for costs no
-- PUBLISH. Allowed under maxmemory (allow-oom).
--
-- Replies, integers:
--   1      released (or kept as a record until its hold ends)
--   0      absent: nothing to delete (a place in the queue may have been given back)
--   -1     another grant, a value of another type, or a string that is not this grant holds
--          the slot's key; it was left alone
local MAX_HOLD_MS = 86400000
local LONGEST, LONGEST_TEXT = 332, '332'

local grant_arg, slot, capacity, channel, sharded = ARGV[1], ARGV[2], tonumber(ARGV[3]),
  ARGV[4], ARGV[5] == '1'
local cleanup = string.byte(grant_arg, 1) == 58
local token = string.match(grant_arg, '^%d*:([^:]*)')

local keys = {}
if slot ~= '' then
  keys[1] = KEYS[4] .. slot
else
  local width = capacity
  local recorded = redis.pcall('GET', KEYS[1])
  if type(recorded) == 'string' then
    local w = tonumber(string.match(recorded, '^%d+ (%d+)$') or '0')
    width = math.max(width, w)
  end
  for k = 0, width - 1 do
    keys[#keys + 1] = KEYS[4] .. k
  end
  if ARGV[6] == '1' then
    keys[#keys + 1] = KEYS[4] .. 'w'
  end
end
if cleanup then
  -- The attempt waits no more.
  redis.pcall('ZREM', KEYS[2], token)
  redis.pcall('ZREM', KEYS[3], token)
  redis.pcall('ZREM', KEYS[5], token)
end

local reply = 0
for i = 1, #keys do
  local key = keys[i]
  local current = redis.pcall('GETRANGE', key, '0', LONGEST_TEXT)
  repeat
    if type(current) == 'table' or #current > LONGEST then
      if not cleanup then
        reply = -1
      end
      break
    end
    if current == '' then
      if not cleanup and redis.call('EXISTS', key) == 1 then
        reply = -1
      end
      break
    end
    local grant, hold_until, name = current, '', ''
    if string.find(current, '\n', 1, true) then
      grant, hold_until, name = string.match(current, '^([^\n]*)\n(%d*)\n([^\n]*)\n?$')
      if not grant then
        grant, hold_until, name = current, '', ''
      end
    end
    local wanted = grant_arg
    if cleanup then
      wanted = (string.match(grant, '^(%d+):') or '') .. wanted
    end
    local record
    if hold_until ~= '' then
      local fence, owner, operation = string.match(wanted, '^(%d*):([^:]*):(.*)$')
      record = fence .. ':~' .. string.sub(redis.sha1hex(owner), 1, 16) .. ':' .. operation
    end
    if grant ~= wanted then
      if record and grant == record then
        reply = 1
      elseif not cleanup then
        reply = -1
      end
      break
    end
    reply = 1
    if record then
      local time = redis.call('TIME')
      local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
      local left = math.min(math.ceil((tonumber(hold_until) - now_us) / 1000), MAX_HOLD_MS)
      if left > 0 then
        redis.call('SET', key, record .. '\n' .. hold_until .. '\n' .. name, 'PX',
          string.format('%d', left))
        break
      end
    end
    redis.call('DEL', key)
    -- Announced only if someone waits: the hint wakes them at once; a refused PUBLISH (an
    -- ACL without the channel) leaves them their retry timer.
    local waiting = redis.pcall('ZCARD', KEYS[2])
    if type(waiting) == 'number' and waiting > 0 then
      local fence = string.match(grant, '^%d+')
      if sharded then
        redis.pcall('SPUBLISH', channel, fence)
      else
        redis.pcall('PUBLISH', channel, fence)
      end
    end
  until true
  if reply == 1 then
    break
  end
end
return reply
