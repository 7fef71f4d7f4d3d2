-- The semaphore floor's release (semaphore_bench): give the place back.
--
-- KEYS[1]  the semaphore       as semaphore_acquire.lua
-- ARGV[1]  identifier          the holder's
-- ARGV[2]  channel             optional: announce the release there (PUBLISH), for the
--                              notified physical limit of the hand-off; absent for the polled
--                              floor, which announces nothing
--
-- Replies: 1 given back, 0 the identifier held no place.
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] then
  redis.call('PUBLISH', ARGV[2], '1')
end
return removed
