#!lua flags=allow-oom
-- leasehold renew, key layout v1: one grant, or several in one call.
--
-- KEYS[1]  lease key           of the first grant; KEYS[i] is the i-th grant's
-- ARGV[1]  grant               of the first grant, "<fence>:<owner token>:<operation id>";
--                              ARGV[2(i-1)+1] is the i-th grant's, ARGV[2(i-1)+2] its TTL
-- ARGV[2]  TTL in milliseconds (positive integer): the grant's TTL, set again
--
-- Renews only the exact grant, which is the stored value up to its first newline (acquire.lua
-- describes every form of the value): a lease that lapsed and was granted again (a new fence)
-- is never extended by its old holder, nor is a grant released before its minimum hold ended.
-- A lease key of another type (a hash, a list) is not this grant either, nor is a string
-- longer than any lease's value (LONGEST, as in acquire.lua): no more of the key than that and
-- one byte is read, whatever its size. Each grant is renewed on its own, as if by a call of
-- its own: one that is gone does not keep the others from being renewed. On a Cluster every
-- key of a call must share a slot, so a call there renews one grant.
--
-- A grant with a minimum hold gets max(TTL, what is left of the hold, rounded up to the
-- millisecond): a renewal never lets the key go before its hold ends.
-- Allowed under maxmemory (allow-oom): PEXPIRE does not grow memory.
--
-- Replies: one integer per grant, in KEYS order (integers, not tables, which cost the server
-- more to hand back, a hundred of them in a batch), each
--   ttl        renewed: PEXPIRE set the TTL, a positive number of milliseconds
--   0          absent
--   -1         another grant, a value of another type, or a string that is not this grant
--              (an empty one included), holds the key
local MAX_HOLD_MS = 86400000
-- The longest value a lease stores, in bytes (acquire.lua), and GETRANGE's end for it.
local LONGEST, LONGEST_TEXT = 332, '332'

-- No helper functions (see acquire.lua): one loop renews every grant of the call, and an
-- entry's reply is set and the loop body left with `break`.
local replies = {}
for i = 1, #KEYS do
  local key, wanted, ttl = KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]
  local reply = -1
  repeat
    -- At most LONGEST + 1 bytes of the key: GETRANGE, which reports a key of another type
    -- (a table from pcall) instead of raising WRONGTYPE, and reads an absent key as "".
    local current = redis.pcall('GETRANGE', key, '0', LONGEST_TEXT)
    -- Most often the stored value is exactly the grant (neither a hold, nor a name, nor a
    -- mark): nothing else is looked at.
    if current ~= wanted then
      if type(current) == 'table' or #current > LONGEST then
        break
      end
      if current == '' then
        -- Absent, unless EXISTS finds an empty string there, which is no grant.
        if redis.call('EXISTS', key) == 0 then
          reply = 0
        end
        break
      end
      local grant, hold_until = current, ''
      if string.find(current, '\n', 1, true) then
        grant, hold_until = string.match(current, '^([^\n]*)\n(%d*)\n')
        if not grant then
          grant, hold_until = current, ''
        end
      end
      if grant ~= wanted then
        break
      end
      if hold_until ~= '' then
        local time = redis.call('TIME')
        local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
        -- Bounded by the longest hold a request may ask for, should the clock have stepped
        -- back.
        local left = math.min(math.ceil((tonumber(hold_until) - now_us) / 1000), MAX_HOLD_MS)
        if left > tonumber(ttl) then
          ttl = string.format('%d', left)
        end
      end
    end
    redis.call('PEXPIRE', key, ttl)
    reply = tonumber(ttl)
  until true
  replies[i] = reply
end
return replies
