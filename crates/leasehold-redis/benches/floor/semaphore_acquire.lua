-- The semaphore floor's acquire (semaphore_bench): the usual sorted-set semaphore, unfenced
-- and unfair, as npm redis-semaphore's `Semaphore` runs it: drop the expired holders, then
-- take a place if fewer than the limit hold one.
--
-- KEYS[1]  the semaphore       a sorted set: holder's identifier -> when it took its place
--                              (the caller's clock, ms)
-- ARGV[1]  limit               the capacity
-- ARGV[2]  identifier          the holder's, unique per acquire
-- ARGV[3]  TTL in milliseconds how long a place counts after it was taken
-- ARGV[4]  now                 the caller's clock in milliseconds
--
-- Replies: 1 taken, 0 every place is held (the caller polls again).
local key, limit, ttl, now = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - ttl)
if redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now, ARGV[2])
  redis.call('PEXPIRE', key, ttl)
  return 1
end
return 0
