#!lua flags=allow-oom
-- leasehold break, key layout v1. An operator's removal of a stuck lease, whoever holds it.
--
-- KEYS[1]  lease key
-- KEYS[2]  release channel     the lease key with ":released" (same hash slot)
-- ARGV[1]  sharded   "1" to announce with SPUBLISH (sharded pub/sub, Cluster), else PUBLISH
--
-- Deletes the lease key only: the fence counter stays, so the next grant's fence is higher
-- than the broken one's and the old holder's late fenced writes are still rejected. The
-- removal is always announced (a release only when someone was refused the grant: see
-- acquire.lua), so that any waiter tries at once.
--
-- Replies (as inspect.lua's, for what was removed):
--   {0}                         nothing to remove: the key is absent
--   {2, fence, pttl, holder, name, released}
--                               removed; fence "0", holder "": an unreadable value (removed
--                               too: it could never be renewed or released)
--   {-2, what}                  the lease key holds another type ("lease-type"): left alone
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then
  return {-2, 'lease-type'}
end
if not current then
  return {0}
end
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
-- The grant is what comes before the first newline; the name follows the second (a third
-- newline, last, is a mark: see acquire.lua).
local grant, name = string.match(current, '^([^\n]*)\n%d*\n([^\n]*)\n?$')
if not grant then
  grant, name = current, ''
end
local fence, token = string.match(grant, '^(%d+):([^:]+):')
local reply
if not fence then
  fence, reply = '0', {2, '0', pttl, '', '', 0}
elseif string.sub(token, 1, 1) == '~' then
  reply = {2, fence, pttl, string.sub(token, 2), name, 1}
else
  reply = {2, fence, pttl, string.sub(redis.sha1hex(token), 1, 16), name, 0}
end
if ARGV[1] == '1' then
  redis.pcall('SPUBLISH', KEYS[2], fence)
else
  redis.pcall('PUBLISH', KEYS[2], fence)
end
return reply
