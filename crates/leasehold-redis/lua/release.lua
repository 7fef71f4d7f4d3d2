#!lua flags=allow-oom
-- leasehold release, key layout v1.
--
-- KEYS[1]  lease key
-- KEYS[2]  release channel     the lease key with ":released" (same hash slot)
-- ARGV[1]  owner token
-- ARGV[2]  operation id
-- ARGV[3]  fence (decimal), or "" for whatever fence this attempt's grant carries (the
--          cleanup after an acquire whose reply was lost)
-- ARGV[4]  sharded   "1" to announce with SPUBLISH (sharded pub/sub, Cluster), else PUBLISH
--
-- Deletes only the exact grant "<fence>:<owner token>:<operation id>". The fence counter is
-- never deleted. After a release the fence is published on the release channel, so that
-- waiters retry at once; an expiry publishes nothing. On a cluster the channel is a shard
-- channel in the lease's slot, so SPUBLISH reaches the subscribers of this node only, with no
-- broadcast over the cluster bus. An announcement the server refuses (an ACL without the
-- channel) is skipped: waiters then fall back to the holder's TTL. Allowed under maxmemory
-- (allow-oom).
--
-- Replies:
--   {1}    released: the key was deleted and the release published
--   {0}    absent: nothing to delete
--   {-1}   another grant, or a value of another type, holds the key; it was left alone
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then
  return {-1}
end
if not current then
  return {0}
end
local fence = ARGV[3]
if fence == '' then
  fence = string.match(current, '^(%d+):') or ''
end
if current ~= fence .. ':' .. ARGV[1] .. ':' .. ARGV[2] then
  return {-1}
end
redis.call('DEL', KEYS[1])
-- The announcement is a hint that wakes waiters early. It must not turn a release that
-- deleted the key into an error: an ACL that forbids the channel (Redis 7 gives a new user no
-- channels) would make the reply say the release may not have happened.
if ARGV[4] == '1' then
  redis.pcall('SPUBLISH', KEYS[2], fence)
else
  redis.pcall('PUBLISH', KEYS[2], fence)
end
return {1}
