#!lua flags=allow-oom
-- leasehold renew, key layout v1.
--
-- KEYS[1]  lease key
-- ARGV[1]  owner token
-- ARGV[2]  operation id
-- ARGV[3]  fence (decimal)
-- ARGV[4]  TTL in milliseconds (positive integer): the grant's TTL, set again
--
-- Renews only the exact grant "<fence>:<owner token>:<operation id>": a lease that lapsed and
-- was granted again (a new fence) is never extended by its old holder. A lease key of another
-- type (a hash, a list) is not this grant either.
-- Allowed under maxmemory (allow-oom): PEXPIRE does not grow memory.
--
-- Replies:
--   {1, ttl}   renewed: PEXPIRE set the TTL
--   {0}        absent
--   {-1}       another grant, or a value of another type, holds the key
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then
  return {-1}
end
if not current then
  return {0}
end
if current ~= ARGV[3] .. ':' .. ARGV[1] .. ':' .. ARGV[2] then
  return {-1}
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, tonumber(ARGV[4])}
