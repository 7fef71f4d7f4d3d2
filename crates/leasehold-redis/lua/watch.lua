#!lua flags=allow-oom
-- leasehold watch, key layout v1. inspect.lua without an attempt, for a reader that then
-- waits for the holder's release notice (an election's observer): it marks the grant it
-- finds, as a refused acquire does (see acquire.lua), so that the grant's release is
-- announced. The mark is the only write; a value already marked, a record kept after release
-- and a value of a form the scripts do not write are left as they are. A server that refuses
-- writes (a replica: READONLY; MISCONF, NOREPLICAS) refuses the whole script, and the backend
-- then reads with inspect.lua, which writes nothing, so the reader learns of a release by the
-- holder's TTL. Allowed under maxmemory (allow-oom): the mark adds one to three bytes to a
-- value of under 200 (APPEND may move the value to a larger allocation).
--
-- KEYS[1]  lease key
-- KEYS[2]  fence counter key   (read only when the lease is free, to tell whether it can be
--                              granted)
--
-- Replies, as inspect.lua's without an attempt (fence a decimal string, holder, name and
-- released as in acquire.lua):
--   {0}                         free: the key is absent
--   {2, fence, pttl, holder, name, released}
--                               held, or kept after release until its minimum hold ends
--                               (released 1); fence "0", holder "": unreadable value
--   {-2, what}                  a key cannot be used, as in acquire.lua: what is
--                               "lease-type", "counter-type", "counter-value" or "fence-range"
local TOP = '9223372036854775807'

local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' then
  return {-2, 'lease-type'}
end
if not current then
  local counter = redis.pcall('GET', KEYS[2])
  if type(counter) == 'table' then
    return {-2, 'counter-type'}
  end
  counter = counter or '0'
  if counter ~= '0' and (not string.find(counter, '^[1-9]%d*$') or #counter > #TOP
      or (#counter == #TOP and counter > TOP)) then
    return {-2, 'counter-value'}
  end
  if counter == TOP then
    return {-2, 'fence-range'}
  end
  return {0}
end
local pttl = redis.call('PTTL', KEYS[1])
-- The grant is what comes before the first newline; the name follows the second, and a third
-- ends a marked value. `mark` is what marks this value: nil when it is marked already, or
-- not of a form the scripts write.
local grant, name, mark = current, '', '\n\n\n'
if string.find(current, '\n', 1, true) then
  local marked
  grant, name, marked = string.match(current, '^([^\n]*)\n%d*\n([^\n]*)(\n?)$')
  mark = marked == '' and '\n' or nil
  if not grant then
    grant, name = current, ''
  end
end
local fence, token = string.match(grant, '^(%d+):([^:]+):')
if not fence then
  return {2, '0', pttl, '', '', 0}
end
if string.sub(token, 1, 1) == '~' then
  return {2, fence, pttl, string.sub(token, 2), name, 1}
end
-- With pcall, as in acquire.lua: an ACL that refuses APPEND leaves the read a read, and the
-- reader learns of the release by the holder's TTL instead.
if mark then
  redis.pcall('APPEND', KEYS[1], mark)
end
return {2, fence, pttl, string.sub(redis.sha1hex(token), 1, 16), name, 0}
