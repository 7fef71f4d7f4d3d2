#!lua flags=no-writes
-- leasehold inspect, key layout v1. Read-only (no-writes).
--
-- KEYS[1]  lease key
-- ARGV[1]  owner token of the inspecting attempt, or "" to inspect without one
-- ARGV[2]  operation id of the inspecting attempt, or ""
--
-- Replies (holder as in acquire.lua):
--   {0}                         free: the key is absent
--   {1, fence, pttl, holder}    held by the inspecting attempt (same token and operation)
--   {2, fence, pttl, holder}    held by someone else (fence 0, holder "": unreadable value)
local current = redis.call('GET', KEYS[1])
if not current then
  return {0}
end
local pttl = redis.call('PTTL', KEYS[1])
local fence, token, operation = string.match(current, '^(%d+):([^:]+):(.*)$')
if not fence then
  return {2, 0, pttl, ''}
end
local holder = string.sub(redis.sha1hex(token), 1, 16)
if ARGV[1] ~= '' and token == ARGV[1] and operation == ARGV[2] then
  return {1, tonumber(fence), pttl, holder}
end
return {2, tonumber(fence), pttl, holder}
