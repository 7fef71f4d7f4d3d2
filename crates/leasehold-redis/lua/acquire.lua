#!lua
-- leasehold acquire, key layout v1.
--
-- KEYS[1]  lease key           {ns}:lease:{ver}:{purpose}:{{digest}}
-- KEYS[2]  fence counter key   the same with ":fence" (same hash slot; it expires once idle,
--                              see "The counter's TTL" below)
-- ARGV[1]  counter idle expiry in milliseconds
--                              positive integer: how long the counter is kept after a grant
--                              (RedisSettings::counter_idle_expiry); one per call, a batch's too
-- ARGV[2]  attempt             "<owner token>:<operation id>": the token is Base64URL and
--                              never contains ':', so the first ':' ends it; the operation id
--                              is printable ASCII and may contain ':'
-- ARGV[3]  TTL in milliseconds positive integer
-- ARGV[4]  min hold in milliseconds, "0" or absent for none: the key stays at least this
--          long after the grant, whatever its holder does (release.lua keeps it, renew.lua
--          never shortens it)
-- ARGV[5]  holder name, "" or absent for none: UTF-8 without control characters, so never a
--          newline
--
-- The last two are optional, and a lease with neither is sent without them: every argument
-- costs the server a string made in Lua (and the attempt is one argument, not two, for the
-- same reason).
--
-- A batch grants several leases in one call, each exactly as a call of its own would: with
-- n > 1 leases, KEYS holds each one's lease key and counter key (KEYS[2i-1], KEYS[2i]), ARGV
-- the counter idle expiry once (ARGV[1], shared by every lease of the call) and then each
-- one's attempt and TTL (ARGV[2i], ARGV[2i+1]), none with a hold or a holder name, and the
-- reply is a table of n replies, in order, each what a single call answers. One lease's
-- refusal (a key of another type, say) does not keep the others from being granted. The
-- server's clock is read once per call: the script runs atomically, so every grant in it is
-- made at that instant.
--
-- The stored value is "<fence>:<owner token>:<operation id>" when there is neither a hold
-- nor a holder name, byte for byte as before both existed. Otherwise it is
--
--   "<fence>:<owner token>:<operation id>\n<hold until>\n<holder name>"
--
-- where <hold until> is the server's clock (TIME) in microseconds plus the hold, or empty,
-- and <holder name> may be empty. Neither an operation id nor a holder name contains a
-- newline, so the first newline ends the grant. After a release before the hold ends, the
-- owner token is replaced by "~" and the token's holder fingerprint (see release.lua): "~" is
-- not Base64URL, so no attempt's token matches it again.
--
-- A grant that someone was refused is marked: a third newline ends the value,
--
--   "<fence>:<owner token>:<operation id>\n<hold until>\n<holder name>\n"
--
-- which is the longest form: at most 332 bytes (LONGEST below), from the documented limits —
-- a fence of at most 19 digits, an owner token of 32 (24 bytes in Base64URL; a released
-- record's "~" and 16 hex digits are shorter), an operation id and a holder name of at most
-- 128 bytes each, a hold's end of at most 20 digits, and 5 separators. Every script that
-- reads a lease key reads no more of it than LONGEST + 1 bytes (GETRANGE), and refuses a
-- longer value unread, in the same time whatever its size: a value that long is not
-- leasehold's, and reading all of it (10 MB, say) took longer than a command's timeout.
--
-- (appended with APPEND, which keeps the TTL: "\n\n\n" to a value of the first form, "\n" to
-- one of the second). release.lua announces the release of a marked grant only: a grant that
-- nobody waited for is deleted without a PUBLISH, which would cost every release a command
-- that no one hears. Renewals keep the mark; a refusal of a marked grant changes nothing. The
-- mark is written with pcall: an ACL that refuses APPEND leaves the refusal a refusal, and
-- the waiter wakes by the holder's TTL instead.
--
-- Fences are decimal strings from 1 to 9223372036854775807 (2^63 - 1), compared and counted
-- as strings, never as Lua numbers: those are doubles, which print 10^14 as "1e+14" and
-- cannot tell 2^53 from 2^53 + 1. A new grant's fence is
--
--   max(counter + 1, the server's clock in microseconds (TIME))
--
-- so that a counter lost to a restart without persistence, FLUSHALL, an eviction or a
-- failover restarts above every fence issued before, as long as the clock of the server that
-- grants now is not behind the one that granted then by more than the time in between.
--
-- The counter's TTL: every grant writes the counter with a TTL of the idle expiry (ARGV[1]),
-- so that the counter of a resource nobody takes any more goes away. That loses no fence: the
-- counter holds the clock at the last grant, and once it has been idle that long the clock
-- is past it by as much, so the next fence, the clock's, is above every fence before it. A
-- counter found ahead of the clock (two grants in one microsecond, a counter set far ahead
-- by hand, one a server whose clock ran ahead left behind) gets the idle expiry plus the new
-- fence's lead over the clock, so that it too lasts until the clock has been past it for the
-- idle expiry. Redis keeps an expiry as a time on the clock TIME reads, so a clock stepped
-- back delays it as much; what is assumed is what the floor assumes after any lost counter:
-- that the clock is not stepped back, or a server that takes over is not behind, by more
-- than the idle expiry.
--
-- Nothing is changed when a key cannot be used: the lease key holds another type, or a
-- string leasehold did not write (longer than LONGEST, or not of a form above, whatever its
-- length); or the counter holds another type, or something that is not a fence or is at the
-- top of the range. A counter longer than any fence is refused by its length (STRLEN),
-- unread; a shorter one is read by moving it, and put back in the same script: its value
-- stays, with no TTL (a TTL someone set on it does not stay; where it is put back says why).
--
-- Replies (fence is a decimal string, pttl an integer; holder is the first 16 hex digits of
-- SHA-1 of the holder's token, or "" when the stored value is not ours; name is the holder
-- name or ""; released is 1 for a key kept after release until its hold ends, else 0):
--   fence                     granted: the key was absent; the counter was moved to the fence,
--                             with its TTL (above), and the key's TTL set to max(TTL, min
--                             hold). The fence alone, a bulk string: the common reply is not a
--                             table, which costs the server more to hand back than the rest of
--                             the grant's Lua
--   {2, fence, pttl}          replay: this attempt already holds it; the TTL is NOT extended
--                             and pttl is the key's current remaining time
--   {3, fence, pttl, holder, name, 0}
--                             conflict: the same owner token holds it for another operation;
--                             the grant is marked
--   {0, fence, pttl, holder, name, released}
--                             contended: another owner holds it (the grant is marked), or a
--                             released grant's hold keeps it
--   {-2, what}                nothing written: what is "lease-type" (another type at the lease
--                             key), "lease-value" (a string leasehold did not write there, of
--                             any length, left as it is), "counter-type", "counter-value" or
--                             "fence-range"
local TOP = '9223372036854775807'
-- The longest value a lease stores, in bytes (see above), as a number and as GETRANGE's end:
-- GETRANGE 0 LONGEST reads one byte more than a lease's value can hold.
local LONGEST, LONGEST_TEXT = 332, '332'

-- No helper functions: the body of a script runs anew on every call, and each function it
-- defines is a closure made and collected each time, which costs the server more than the
-- lines it saves (D45). One loop grants every lease of the call, a single one included, and
-- an entry's reply is set and the loop body left with `break` (Lua 5.1 has no goto): the
-- `repeat ... until true` around it runs once. Decimals without leading zeros are compared
-- inline, by length first; the counter's successor is computed only on the rare path that
-- needs it. Checks that a grant never needs (the type of a key found, say) come after the
-- grant's path, so that it calls no more Lua functions than it must.
local n = #KEYS / 2
local idle = ARGV[1]
local replies = n ~= 1 and {}
-- The server's clock, read once per call: every grant of a batch is made at the same instant
-- (the script runs atomically), and TIME is the dearest call a grant makes.
local time
for i = 1, n do
  local lease_key, counter_key, attempt, ttl = KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i],
    ARGV[2 * i + 1]
  local hold, name = '0', ''
  if n == 1 then
    hold, name = ARGV[4] or '0', ARGV[5] or ''
  end
  local reply
  repeat
    -- PTTL tells an absent key (-2) from one that is there, of any type and size, without
    -- reading it: the value is read below only when there is one, and never more of it than
    -- a lease's value can hold.
    local pttl = redis.call('PTTL', lease_key)
    if pttl == -2 then
      -- The counter's length first (STRLEN reads no value; a key of another type makes it fail,
      -- a table from pcall): one longer than any fence is refused without being read.
      local size = redis.pcall('STRLEN', counter_key)
      if type(size) == 'table' then
        reply = {-2, 'counter-type'}
        break
      end
      if size > #TOP then
        reply = {-2, 'counter-value'}
        break
      end
      time = time or redis.call('TIME')
      local us = time[2]
      if #us < 6 then
        us = string.rep('0', 6 - #us) .. us
      end
      local now = time[1] .. us
      -- One call reads the counter and moves it to the clock, which is the new fence unless
      -- the counter is already there or beyond (two grants in one microsecond, a clock stepped
      -- back): then the counter's successor is, set below. It is a string (or absent) of at
      -- most 19 bytes, as STRLEN found; one that is not a fence is put back as it was. The
      -- same call gives the counter its TTL (above).
      local counter = redis.call('SET', counter_key, now, 'GET', 'PX', idle) or '0'
      -- One that cannot be used is put back with no TTL, as before counters had one: it is
      -- not a fence leasehold wrote (whoever wrote it must find it, and it hides what the
      -- counter was), or it is at the top of the range, where a lapse would let fences start
      -- again from the clock, below the fences it stands for.
      if counter ~= '0'
        and (not string.find(counter, '^[1-9]%d*$')
          or #counter > #TOP or (#counter == #TOP and counter > TOP)) then
        redis.call('SET', counter_key, counter)
        reply = {-2, 'counter-value'}
        break
      end
      if counter == TOP then
        redis.call('SET', counter_key, counter)
        reply = {-2, 'fence-range'}
        break
      end
      local fence = now
      if #counter > #now or (#counter == #now and counter >= now) then
        -- The counter is not below the clock: the fence is its successor, counter + 1.
        local d = #counter
        while d > 0 and string.byte(counter, d) == 57 do
          d = d - 1
        end
        if d == 0 then
          fence = '1' .. string.rep('0', #counter)
        else
          fence = string.sub(counter, 1, d - 1) .. string.char(string.byte(counter, d) + 1)
            .. string.rep('0', #counter - d)
        end
        -- Ahead of the clock, the counter alone keeps the next fence above this one until the
        -- clock passes it: it is kept the idle expiry past that moment (above). As doubles,
        -- the lead is exact while the fence is below 2^53 (the year 2255), and a few
        -- milliseconds off beyond, on a TTL of thousands of years.
        local ahead = math.ceil((tonumber(fence) - tonumber(now)) / 1000)
        redis.call('SET', counter_key, fence, 'PX', string.format('%.0f', tonumber(idle) + ahead))
      end
      local value = fence .. ':' .. attempt
      -- Strings, not Lua numbers, go to SET: a number would be formatted by Redis.
      local px = ttl
      if hold ~= '0' or name ~= '' then
        local hold_until = ''
        if hold ~= '0' then
          -- Microseconds are below 2^53 until the year 2255, so a double holds them exactly.
          local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
          hold_until = string.format('%.0f', now_us + tonumber(hold) * 1000)
          if tonumber(hold) > tonumber(ttl) then
            px = hold
          end
        end
        value = value .. '\n' .. hold_until .. '\n' .. name
      end
      redis.call('SET', lease_key, value, 'PX', px)
      reply = fence
      break
    end
    -- Never more than LONGEST + 1 bytes of it (GETRANGE, which fails on another type: a
    -- table from pcall); a longer value is refused unread.
    local current = redis.pcall('GETRANGE', lease_key, '0', LONGEST_TEXT)
    if type(current) == 'table' then
      reply = {-2, 'lease-type'}
      break
    end
    if #current > LONGEST then
      reply = {-2, 'lease-value'}
      break
    end
    -- The grant is what comes before the first newline; the name follows the second, and a
    -- third ends a marked value. `mark` is what marks this value: nil when it is marked
    -- already, or not of a form this script writes (it is left as it is).
    local grant, holder_name, mark = current, '', '\n\n\n'
    if string.find(current, '\n', 1, true) then
      local marked
      grant, holder_name, marked = string.match(current, '^([^\n]*)\n%d*\n([^\n]*)(\n?)$')
      mark = marked == '' and '\n' or nil
      if not grant then
        grant, holder_name = current, ''
      end
    end
    local fence, token, operation = string.match(grant, '^(%d+):([^:]+):(.*)$')
    if not fence then
      -- Not a lease's value (an empty string, a word, a number): left as it is.
      reply = {-2, 'lease-value'}
      break
    end
    if string.sub(token, 1, 1) == '~' then
      -- Released before its hold ended: no one's grant, and never this attempt's again.
      reply = {0, fence, pttl, string.sub(token, 2), holder_name, 1}
      break
    end
    local holder = string.sub(redis.sha1hex(token), 1, 16)
    if token .. ':' .. operation == attempt then
      reply = {2, fence, pttl}
      break
    end
    if token == string.match(attempt, '^[^:]*') then
      reply = {3, fence, pttl, holder, holder_name, 0}
    else
      reply = {0, fence, pttl, holder, holder_name, 0}
    end
    -- Refused: whoever asked may wait for the release, so the grant's release is announced.
    if mark then
      redis.pcall('APPEND', lease_key, mark)
    end
  until true
  if n == 1 then
    return reply
  end
  replies[i] = reply
end
return replies
