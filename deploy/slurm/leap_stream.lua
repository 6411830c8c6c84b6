-- leap-stream for Slurm: what job_submit.lua and cli_filter.lua share (Lua 5.1, no modules).
--
-- The job's training configuration travels in its comment, as a job spec (docs/schedulers.md):
--     sbatch --comment='leap:{"lineage_id":"…","team":"…","model":{…},"training":{…}}' …
-- The hardware types the user allows are the partitions given with -p (one partition per type,
-- named in leap-stream.conf); none given means every partition leap-stream.conf names.
-- Nothing here ever fails or blocks a job: on any doubt the job keeps what the user asked for.

local M = {}

M.PREFIX = "leap:"
local ID = "[A-Za-z0-9._:/-]+"

-- The folder this file is in (the plugins live beside slurm.conf).
function M.here()
  local src = debug.getinfo(1, "S").source
  return (src:match("^@(.*)/[^/]*$")) or "/etc/slurm"
end

-- leap-stream.conf: "key = value" lines, "#" comments; "partition.<type> = <partition>".
function M.read_conf(path)
  local conf = {
    serve_url = "", serve_timeout_s = "2", token_file = "",
    cache_dir = "/var/cache/leap-stream/rankings", cache_max_age_s = "604800",
    partition_of = {}, type_of = {}, types = {},
  }
  local fh = io.open(path, "r")
  if not fh then return conf, "no " .. path end
  for line in fh:lines() do
    local key, value = line:match("^%s*([%w%._-]+)%s*=%s*(.-)%s*$")
    if key and not line:match("^%s*#") then
      local t = key:match("^partition%.(.+)$")
      if t then
        conf.partition_of[t] = value
        conf.type_of[value] = t
        table.insert(conf.types, t)
      else
        conf[key] = value
      end
    end
  end
  fh:close()
  return conf
end

-- The job spec of a comment, or nil and why (nil, nil: not a leap-stream job).
function M.spec_of(comment)
  if type(comment) ~= "string" or comment:sub(1, #M.PREFIX) ~= M.PREFIX then return nil, nil end
  local spec = comment:sub(#M.PREFIX + 1):match("^%s*(.-)%s*$")
  if spec:sub(1, 1) ~= "{" or spec:sub(-1) ~= "}" then
    return nil, "the job spec is not a JSON object"
  end
  local lineage = spec:match('"lineage_id"%s*:%s*"(' .. ID .. ')"')
  if not lineage then return nil, "the job spec has no valid lineage_id" end
  return { text = spec, lineage_id = lineage,
           job_id = spec:match('"job_id"%s*:%s*"(' .. ID .. ')"') }
end

-- The hardware types a partition list allows (every configured type when the list is empty),
-- and the partitions leap-stream does not know (then it stays out of the way).
function M.allowed(conf, partitions)
  local allowed, unknown = {}, {}
  if partitions == nil or partitions == "" then
    for _, t in ipairs(conf.types) do table.insert(allowed, t) end
    return allowed, unknown
  end
  for p in partitions:gmatch("[^,]+") do
    local t = conf.type_of[p]
    if t then table.insert(allowed, t) else table.insert(unknown, p) end
  end
  return allowed, unknown
end

-- The first of `ranked` that is in `allowed`.
function M.best(ranked, allowed)
  local ok = {}
  for _, t in ipairs(allowed) do ok[t] = true end
  for _, t in ipairs(ranked) do
    if ok[t] then return t end
  end
  return nil
end

local function file_name(kind, id)
  return kind .. "." .. id:gsub("/", "~"):gsub(":", "+")
end

-- A cached ranking (leap_stream/schedulers/slurm.py writes it): {produced_at, source, ranked}.
function M.read_cached(conf, kind, id, now)
  if not id then return nil end
  local fh = io.open(conf.cache_dir .. "/" .. file_name(kind, id), "r")
  if not fh then return nil end
  local entry = { ranked = {} }
  local first = fh:read("*l")
  if first ~= "leap-ranking 1" then fh:close(); return nil end
  for line in fh:lines() do
    local key, value = line:match("^(%S+) (.*)$")
    if key == "rank" then table.insert(entry.ranked, value)
    elseif key then entry[key] = value end
  end
  fh:close()
  local age = now - (tonumber(entry.produced_at) or 0)
  if age > (tonumber(conf.cache_max_age_s) or 604800) then return nil end
  return entry
end

-- The ranked types of a hardware-ranking JSON body, best first (candidates are in rank order).
function M.ranked_of_json(body)
  if not body or body:match('"source"%s*:%s*"none"') then return {} end
  local ranked = {}
  local cands = body:match('"candidates"%s*:%s*(%b[])') or ""
  for t in cands:gmatch('"hardware_type"%s*:%s*"([a-z0-9._-]+)"') do
    table.insert(ranked, t)
  end
  return ranked
end

return M
