#!lua flags=allow-oom
-- leasehold release, key layout v1.
--
-- KEYS[1]  lease key
-- ARGV[1]  grant               "<fence>:<owner token>:<operation id>", or
--                              ":<owner token>:<operation id>" for whatever fence this
--                              attempt's grant carries (the cleanup after an acquire whose
--                              reply was lost); one argument, not three: each costs the server
--                              a string made in Lua
-- ARGV[2]  sharded             "1" to announce with SPUBLISH (sharded pub/sub, Cluster);
--                              "0" or absent for PUBLISH
--
-- A batch releases several grants in one call, each exactly as a call of its own would: with
-- n > 1 grants, KEYS holds each one's lease key (KEYS[i]), ARGV each one's grant (ARGV[i]),
-- announced with PUBLISH (a Cluster never batches: the keys of one call must share a slot),
-- and the reply is a table of n integers, in order.
--
-- Releases only the exact grant, which is the stored value up to its first newline
-- (acquire.lua describes every form of the value); a string longer than any lease's value
-- (LONGEST, as in acquire.lua) is not one, and no more of the key than that and one byte is
-- read, whatever its size. The fence counter is left alone (it expires once idle, as
-- acquire.lua sets it).
--
-- A grant whose minimum hold has not ended is not deleted: the value is rewritten with the
-- owner token replaced by "~" and the token's holder fingerprint (16 hex digits), keeping the
-- fence, the hold and the holder name, and the key's TTL is set to what is left of the hold.
-- The grant is gone (no token matches "~", so neither renew, nor this release, nor a replay
-- of the acquire finds it), but the key keeps everyone out until the hold ends. Nothing is
-- published then: a waiter woken now would only be contended. Releasing that record again,
-- by the attempt that released it (its reply lost), finds it by the fingerprint and answers
-- 1 again, changing nothing.
--
-- Otherwise the key is deleted. If the grant is marked (someone was refused it and may wait:
-- see acquire.lua), its fence is then published on the release channel, the lease key with
-- ":released", so that waiters retry at once; a grant nobody was refused is deleted without
-- a PUBLISH, and an expiry publishes nothing. On a cluster the channel is a shard channel in
-- the lease's slot (it carries the lease key's hash tag), so SPUBLISH reaches the
-- subscribers of this node only, with no broadcast over the cluster bus. An announcement the
-- server refuses (an ACL without the channel) is skipped: waiters then fall back to the
-- holder's TTL. Allowed under maxmemory (allow-oom).
--
-- Replies, integers (not tables, which cost the server more to hand back):
--   1      released: the key was deleted (and the release published, if the grant was
--          marked), or the grant was turned into a record kept until its hold ends
--   0      absent: nothing to delete
--   -1     another grant, a value of another type, or a string that is not this grant (an
--          empty one included), holds the key; it was left alone
local MAX_HOLD_MS = 86400000
-- The longest value a lease stores, in bytes (acquire.lua), and GETRANGE's end for it.
local LONGEST, LONGEST_TEXT = 332, '332'

-- No helper functions (see acquire.lua): one loop releases every grant of the call, a single
-- one included, and an entry's reply is set and the loop body left with `break`.
local n = #KEYS
local replies = n ~= 1 and {}
for i = 1, n do
  local lease_key, grant_arg = KEYS[i], ARGV[i]
  local sharded = n == 1 and ARGV[2] == '1'
  local reply = 1
  -- Whether the stored grant is marked: only its release is announced.
  local marked = false
  repeat
    -- At most LONGEST + 1 bytes of the key: GETRANGE, which reports a key of another type
    -- (a table from pcall) instead of raising WRONGTYPE, and reads an absent key as "".
    local current = redis.pcall('GETRANGE', lease_key, '0', LONGEST_TEXT)
    local grant = current
    -- Most often the stored value is exactly the grant (neither a hold, nor a name, nor a
    -- mark): nothing else is looked at. A grant never holds a newline, and a stored value
    -- never starts with ':', so a value equal to the argument is a grant to delete.
    if current ~= grant_arg then
      if type(current) == 'table' or #current > LONGEST then
        reply = -1
        break
      end
      if current == '' then
        -- Absent, unless EXISTS finds an empty string there, which is no grant.
        if redis.call('EXISTS', lease_key) == 0 then
          reply = 0
        else
          reply = -1
        end
        break
      end
      local hold_until, name, mark = '', '', ''
      if string.find(current, '\n', 1, true) then
        grant, hold_until, name, mark =
          string.match(current, '^([^\n]*)\n(%d*)\n([^\n]*)(\n?)$')
        if not grant then
          grant, hold_until, name, mark = current, '', '', ''
        end
      end
      marked = mark == '\n'
      local wanted = grant_arg
      if string.byte(wanted, 1) == 58 then
        -- ':': whatever fence the stored grant carries.
        wanted = (string.match(grant, '^(%d+):') or '') .. wanted
      end
      -- What a grant with a minimum hold is turned into on release; the token and the
      -- operation are read only for such a grant.
      local record
      if hold_until ~= '' then
        local fence, token, operation = string.match(wanted, '^(%d*):([^:]*):(.*)$')
        record = fence .. ':~' .. string.sub(redis.sha1hex(token), 1, 16) .. ':' .. operation
      end
      if grant ~= wanted then
        if not (record and grant == record) then
          reply = -1
        end
        break
      end
      if record then
        local time = redis.call('TIME')
        local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
        -- Bounded by the longest hold a request may ask for, should the clock have stepped
        -- back.
        local left = math.min(math.ceil((tonumber(hold_until) - now_us) / 1000), MAX_HOLD_MS)
        if left > 0 then
          redis.call('SET', lease_key, record .. '\n' .. hold_until .. '\n' .. name, 'PX',
            string.format('%d', left))
          break
        end
      end
    end
    redis.call('DEL', lease_key)
    if marked then
      local channel, fence = lease_key .. ':released', string.match(grant, '^%d+')
      -- The announcement is a hint that wakes waiters early. It must not turn a release that
      -- deleted the key into an error: an ACL that forbids the channel (Redis 7 gives a new
      -- user no channels) would make the reply say the release may not have happened.
      if sharded then
        redis.pcall('SPUBLISH', channel, fence)
      else
        redis.pcall('PUBLISH', channel, fence)
      end
    end
  until true
  if n == 1 then
    return reply
  end
  replies[i] = reply
end
return replies
