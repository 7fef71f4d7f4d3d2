#!lua
-- leasehold acquire, key layout v1.
--
-- KEYS[1]  lease key           {ns}:lease:{ver}:{purpose}:{{digest}}
-- KEYS[2]  fence counter key   the same with ":fence" (same hash slot; no TTL, never deleted)
-- ARGV[1]  owner token         Base64URL, never contains ':'
-- ARGV[2]  operation id        printable ASCII, may contain ':'
-- ARGV[3]  TTL in milliseconds positive integer
--
-- The stored value is "<fence>:<owner token>:<operation id>".
--
-- Replies (fence and PTTL are integers; holder is the first 16 hex digits of SHA-1 of the
-- holder's token, or "" when the stored value is not ours):
--   {1, fence, pttl}          granted: the key was absent; the fence was incremented
--   {2, fence, pttl}          replay: this attempt already holds it; the TTL is NOT extended
--                             and pttl is the key's current remaining time
--   {3, fence, pttl, holder}  conflict: the same owner token holds it for another operation
--   {0, fence, pttl, holder}  contended: another owner holds it (fence 0: unreadable value)
local current = redis.call('GET', KEYS[1])
if not current then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], fence .. ':' .. ARGV[1] .. ':' .. ARGV[2], 'PX', ARGV[3])
  return {1, fence, tonumber(ARGV[3])}
end
local pttl = redis.call('PTTL', KEYS[1])
local fence, token, operation = string.match(current, '^(%d+):([^:]+):(.*)$')
if not fence then
  return {0, 0, pttl, ''}
end
local holder = string.sub(redis.sha1hex(token), 1, 16)
if token == ARGV[1] then
  if operation == ARGV[2] then
    return {2, tonumber(fence), pttl}
  end
  return {3, tonumber(fence), pttl, holder}
end
return {0, tonumber(fence), pttl, holder}
