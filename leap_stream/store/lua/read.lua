-- Read (and remember) in one script: HGETALL of the first ARGV[1] keys, then SET EX of the rest
-- (the submissions) with values ARGV[3..]. One reply instead of one per command.
local nread = tonumber(ARGV[1])
local ttl = ARGV[2]
local out = {}
for i = 1, nread do out[i] = redis.call('HGETALL', KEYS[i]) end
for i = nread + 1, #KEYS do redis.call('SET', KEYS[i], ARGV[i - nread + 2], 'EX', ttl) end
return out
