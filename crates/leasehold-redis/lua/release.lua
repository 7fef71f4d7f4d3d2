#!lua flags=allow-oom
-- leasehold release, key layout v1.
--
-- KEYS[1]  lease key
-- KEYS[2]  release channel     the lease key with ":released" (same hash slot)
-- ARGV[1]  owner token
-- ARGV[2]  operation id
-- ARGV[3]  fence (decimal), or "" for whatever fence this attempt's grant carries (the
--          cleanup after an acquire whose reply was lost)
-- ARGV[4]  "1" to announce with SPUBLISH (sharded pub/sub, Cluster), else PUBLISH
--
-- Deletes only the exact grant "<fence>:<owner token>:<operation id>". The fence counter is
-- never deleted. After a release the fence is published on the release channel, so that
-- waiters retry at once; an expiry publishes nothing. On a cluster the channel is a shard
-- channel in the lease's slot, so SPUBLISH reaches the subscribers of this node only, with no
-- broadcast over the cluster bus. Allowed under maxmemory (allow-oom).
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
if ARGV[4] == '1' then
  redis.call('SPUBLISH', KEYS[2], fence)
else
  redis.call('PUBLISH', KEYS[2], fence)
end
return {1}
