#!lua flags=allow-oom
-- leasehold read/write downgrade, key layout v1: the writer becomes a reader, in one step.
--
-- KEYS[1]  writer key          as rw_acquire.lua
-- KEYS[2]  queue key           as rw_acquire.lua
-- KEYS[3]  slot key prefix     as rw_acquire.lua
-- ARGV[1]  grant               the writer's "<fence>:<owner token>:<operation id>"
-- ARGV[2]  TTL in milliseconds the reader's grant's, as the writer's
-- ARGV[3]  channel             the read/write lease's ":released" channel
-- ARGV[4]  sharded             "1" to announce with SPUBLISH (Cluster), "0" for PUBLISH
--
-- Only the exact writer's grant (the stored value up to its first newline) is downgraded: it
-- moves to the lowest free reader slot with its value unchanged (fence, attempt, holder
-- name), so the reader's fence is this writer's, as rw_acquire.lua gives readers. No other
-- writer can come in between: the script runs atomically. The release of the writer's side
-- is announced when someone waits, so that waiting readers come in at once (a waiting writer
-- still keeps new readers out, rw_acquire.lua's rule). The fence counter is left as it is:
-- its TTL, set at the writer's grant, already outlives the writer's fence.
--
-- Replies:
--   {1, fence, slot}   downgraded: the reader's grant, in slot
--   {0}                the writer's key is absent
--   {-1}               another grant, or anything else, holds the writer's key; nothing changed
local LONGEST, LONGEST_TEXT = 332, '332'
local READERS = 64

local current = redis.pcall('GETRANGE', KEYS[1], '0', LONGEST_TEXT)
if type(current) == 'table' or #current > LONGEST then
  return {-1}
end
if current == '' then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return {0}
  end
  return {-1}
end
local grant = string.match(current, '^[^\n]*')
if grant ~= ARGV[1] then
  return {-1}
end
-- Readers hold nothing while a writer does: slot 0 is free unless a key someone else wrote
-- sits there.
local slot
for k = 0, READERS - 1 do
  if redis.call('EXISTS', KEYS[3] .. k) == 0 then
    slot = k
    break
  end
end
if not slot then
  return {-1}
end
local value = string.gsub(current, '\n$', '')
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[3] .. slot, value, 'PX', ARGV[2])
local waiting = redis.pcall('ZCARD', KEYS[2])
if type(waiting) == 'number' and waiting > 0 then
  local fence = string.match(grant, '^%d+')
  if ARGV[4] == '1' then
    redis.pcall('SPUBLISH', ARGV[3], fence)
  else
    redis.pcall('PUBLISH', ARGV[3], fence)
  end
end
return {1, string.match(grant, '^%d+'), slot}
