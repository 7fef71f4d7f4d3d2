#!lua flags=no-writes
-- leasehold inspect, key layout v1. Read-only (no-writes), and so on a replica too.
--
-- KEYS[1]  lease key
-- KEYS[2]  fence counter key   (read only when the lease is free, to tell whether it can be
--                              granted)
-- ARGV[1]  owner token of the inspecting attempt, or "" to inspect without one
-- ARGV[2]  operation id of the inspecting attempt, or ""
-- ARGV[3]  mark                "1" to mark the grant held by someone else, as a refused
--                              acquire does (see acquire.lua), so that its release is
--                              announced; "0" or absent for a plain read. Only the script's
--                              "watch" form sends it: this source with the first line
--                              "#!lua flags=allow-oom", which may write (an election
--                              observer's read). A value already marked, a record kept after
--                              release and a value leasehold did not write (refused) are left
--                              as they are; the mark goes through pcall, so an ACL without
--                              APPEND leaves the read a read. A server that refuses writes
--                              refuses the whole watch form, and the backend then reads with
--                              this one.
--
-- The stored value is read in every form (acquire.lua describes them), a marked one included,
-- and never more of it than the longest of them (LONGEST, as in acquire.lua) and one byte: a
-- longer value is refused unread, as is a shorter one that is not of those forms. The counter
-- is read no further than the longest fence and one byte.
--
-- Replies (fence a decimal string, holder, name and released as in acquire.lua):
--   {0}                         free: the key is absent
--   {1, fence, pttl, holder, name, 0}
--                               held by the inspecting attempt (same token and operation)
--   {2, fence, pttl, holder, name, released}
--                               held by someone else, or kept after release until its
--                               minimum hold ends (released 1)
--   {-2, what}                  a key cannot be used, as in acquire.lua: what is
--                               "lease-type", "lease-value", "counter-type", "counter-value"
--                               or "fence-range"
local TOP = '9223372036854775807'
-- The longest value a lease stores, in bytes (acquire.lua), and GETRANGE's end for it.
local LONGEST, LONGEST_TEXT = 332, '332'

-- a > b, for decimals without leading zeros.
local function above(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end

-- PTTL tells an absent key (-2) from one that is there, of any type and size, unread.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  -- At most 20 bytes of the counter, one more than the longest fence (GETRANGE fails on
  -- another type: a table from pcall). It reads an absent key as "", which EXISTS tells from
  -- an empty string, no fence.
  local counter = redis.pcall('GETRANGE', KEYS[2], '0', '19')
  if type(counter) == 'table' then
    return {-2, 'counter-type'}
  end
  if counter == '' then
    if redis.call('EXISTS', KEYS[2]) == 1 then
      return {-2, 'counter-value'}
    end
    counter = '0'
  end
  if counter ~= '0' and (#counter > #TOP or not string.find(counter, '^[1-9]%d*$')
      or above(counter, TOP)) then
    return {-2, 'counter-value'}
  end
  if counter == TOP then
    return {-2, 'fence-range'}
  end
  return {0}
end
local current = redis.pcall('GETRANGE', KEYS[1], '0', LONGEST_TEXT)
if type(current) == 'table' then
  return {-2, 'lease-type'}
end
if #current > LONGEST then
  return {-2, 'lease-value'}
end
-- The grant is what comes before the first newline; the name follows the second, and a third
-- ends a marked value. `mark` is what marks this value: nil when it is marked already, or not
-- of a form the scripts write.
local grant, name, mark = current, '', '\n\n\n'
if string.find(current, '\n', 1, true) then
  local marked
  grant, name, marked = string.match(current, '^([^\n]*)\n%d*\n([^\n]*)(\n?)$')
  mark = marked == '' and '\n' or nil
  if not grant then
    grant, name = current, ''
  end
end
local fence, token, operation = string.match(grant, '^(%d+):([^:]+):(.*)$')
if not fence then
  return {-2, 'lease-value'}
end
if string.sub(token, 1, 1) == '~' then
  return {2, fence, pttl, string.sub(token, 2), name, 1}
end
local holder = string.sub(redis.sha1hex(token), 1, 16)
if ARGV[1] ~= '' and token == ARGV[1] and operation == ARGV[2] then
  return {1, fence, pttl, holder, name, 0}
end
if ARGV[3] == '1' and mark then
  redis.pcall('APPEND', KEYS[1], mark)
end
return {2, fence, pttl, holder, name, 0}
