-- leasehold fenced write, key layout v1.
--
-- KEYS[1]  record key   the lease key with ":record:<name>" (same hash slot), a hash with
--                       fields "fence" and "value"
-- ARGV[1]  fence (decimal, no leading zeros) of the writer's grant
-- ARGV[2]  value
--
-- Writes the value only if no write with a higher fence was accepted before: a holder whose
-- lease expired and was granted to someone else (a higher fence) can no longer overwrite what
-- the new holder wrote. Equal fences are accepted (one grant writing again). Fences are
-- compared as decimal strings (length, then digits), exactly, beyond Lua's 2^53.
--
-- Replies:
--   {1, fence}          written; fence is the writer's
--   {0, current}        refused: current is the higher fence already accepted
--   {-2, 'record-type'} nothing written: the record key holds a value of another type
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end
local current = redis.pcall('HGET', KEYS[1], 'fence')
if type(current) == 'table' then
  return {-2, 'record-type'}
end
if current and below(ARGV[1], current) then
  return {0, current}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return {1, ARGV[1]}
