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
-- Only a lease is removed: a grant, or a record kept after release (acquire.lua describes
-- every form of the value). Something leasehold did not write is left alone, as acquire.lua
-- leaves it: a value of another type, or a string longer than any lease's value (LONGEST, as
-- in acquire.lua; no more of the key than that and one byte is read, whatever its size) or not
-- of a lease's form.
--
-- Replies (as inspect.lua's, for what was removed):
--   {0}                         nothing to remove: the key is absent
--   {2, fence, pttl, holder, name, released}
--                               removed
--   {-2, what}                  nothing removed: the lease key holds another type
--                               ("lease-type") or a string leasehold did not write
--                               ("lease-value"), left alone
-- The longest value a lease stores, in bytes (acquire.lua), and GETRANGE's end for it.
local LONGEST, LONGEST_TEXT = 332, '332'

-- PTTL tells an absent key (-2) from one that is there, of any type and size, unread.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  return {0}
end
local current = redis.pcall('GETRANGE', KEYS[1], '0', LONGEST_TEXT)
if type(current) == 'table' then
  return {-2, 'lease-type'}
end
if #current > LONGEST then
  return {-2, 'lease-value'}
end
-- The grant is what comes before the first newline; the name follows the second (a third
-- newline, last, is a mark: see acquire.lua).
local grant, name = string.match(current, '^([^\n]*)\n%d*\n([^\n]*)\n?$')
if not grant then
  grant, name = current, ''
end
local fence, token = string.match(grant, '^(%d+):([^:]+):')
if not fence then
  return {-2, 'lease-value'}
end
redis.call('DEL', KEYS[1])
local reply
if string.sub(token, 1, 1) == '~' then
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
