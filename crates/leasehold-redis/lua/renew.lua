#!lua flags=allow-oom
-- leasehold renew, key layout v1.
--
-- KEYS[1]  lease key
-- ARGV[1]  owner token
-- ARGV[2]  operation id
-- ARGV[3]  fence (decimal)
-- ARGV[4]  TTL in milliseconds (positive integer): the grant's TTL, set again
--
-- Renews only the exact grant "<fence>:<owner token>:<operation id>", which is the stored
-- value up to its first newline (acquire.lua describes both forms of the value): a lease that
-- lapsed and was granted again (a new fence) is never extended by its old holder, nor is a
-- grant released before its minimum hold ended. A lease key of another type (a hash, a list)
-- is not this grant either.
--
-- A grant with a minimum hold gets max(TTL, what is left of the hold, rounded up to the
-- millisecond): a renewal never lets the key go before its hold ends.
-- Allowed under maxmemory (allow-oom): PEXPIRE does not grow memory.
--
-- Replies:
--   {1, ttl}   renewed: PEXPIRE set the TTL (ttl is what it set)
--   {0}        absent
--   {-1}       another grant, or a value of another type, holds the key
local MAX_HOLD_MS = 86400000

local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then
  return {-1}
end
if not current then
  return {0}
end
local grant, hold_until = string.match(current, '^([^\n]*)\n(%d*)\n')
if not grant then
  grant, hold_until = current, ''
end
if grant ~= ARGV[3] .. ':' .. ARGV[1] .. ':' .. ARGV[2] then
  return {-1}
end
local ttl = ARGV[4]
if hold_until ~= '' then
  local time = redis.call('TIME')
  local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
  -- Bounded by the longest hold a request may ask for, should the clock have stepped back.
  local left = math.min(math.ceil((tonumber(hold_until) - now_us) / 1000), MAX_HOLD_MS)
  if left > tonumber(ttl) then
    ttl = string.format('%d', left)
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, tonumber(ttl)}
