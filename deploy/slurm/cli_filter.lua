-- leap-stream cli_filter plugin (client side, inside sbatch/salloc/srun).
--
-- Asks `leap-stream serve` for the job's ranking (curl, with a short timeout) and sets the
-- partition to the best ranked type among those the user allowed. The serve also remembers the
-- submission (for its completion) and publishes the ranking, so job_submit.lua on the server
-- finds it in its cache too. No answer in time, a malformed spec or any error: the job keeps
-- what the user asked for and the server-side plugin may still place it.
--
-- Install: this file, leap_stream.lua and leap-stream.conf beside slurm.conf on every
-- submit host, and CliFilterPlugins=cli_filter/lua in slurm.conf (deploy/slurm/README.md).

local here = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")) or "/etc/slurm"
local leap = dofile(here .. "/leap_stream.lua")

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- The job-submitted event: the spec with the scheduler's fields put in front (the spec's own
-- fields win when it repeats one, as in leap_stream/contracts/job_spec.py).
local function submission(spec, allowed, conf, now)
  local user = (os.getenv("USER") or "user"):gsub("[^%w._-]", "_")
  local job_id = spec.job_id or string.format("slurm/%s/%d-%05d", user, now, math.random(0, 99999))
  local quoted = {}
  for i, t in ipairs(allowed) do quoted[i] = '"' .. t .. '"' end
  local head = string.format(
    '{"schema_version":1,"event_id":"sub-slurm-%s-%d-%05d","job_id":"%s","attempt":1,'
      .. '"submitted_at":"%s","default_hardware":"%s",',
    user, now, math.random(0, 99999), job_id, os.date("!%Y-%m-%dT%H:%M:%S.000Z", now),
    allowed[1])
  local body = head .. spec.text:sub(2, -2)
  return body .. ',"candidate_hardware":[' .. table.concat(quoted, ",") .. "]}"
end

local function ask(conf, event)
  local path = os.tmpname()
  local fh = io.open(path, "w")
  fh:write(event)
  fh:close()
  local auth = ""
  if conf.token_file ~= "" then
    local tf = io.open(conf.token_file, "r")
    local token = tf and tf:read("*l")
    if tf then tf:close() end
    if token then auth = "-H " .. shell_quote("Authorization: Bearer " .. token) .. " " end
  end
  local cmd = string.format(
    "curl -sS --fail --max-time %s -H 'content-type: application/json' %s--data-binary @%s %s 2>/dev/null",
    tonumber(conf.serve_timeout_s) or 2, auth, shell_quote(path), shell_quote(conf.serve_url))
  local out = io.popen(cmd, "r")
  local body = out:read("*a")
  out:close()
  os.remove(path)
  return body
end

local function debug(...)
  if os.getenv("LEAP_SLURM_DEBUG") then io.stderr:write("leap-stream: ", string.format(...), "\n") end
end

local function place(options)
  local spec, why = leap.spec_of(options["comment"])
  if not spec then
    if why then io.stderr:write("leap-stream: job spec ignored: ", why, "\n") end
    return
  end
  local conf = leap.read_conf(here .. "/leap-stream.conf")
  if conf.serve_url == "" then return end
  local allowed, unknown = leap.allowed(conf, options["partition"])
  if #unknown > 0 or #allowed < 2 then return end
  math.randomseed(os.time() + math.floor(os.clock() * 1000000))
  local event = submission(spec, allowed, conf, os.time())
  local body = ask(conf, event)
  debug("asked %s with %s: %s", conf.serve_url, event, body)
  local best = leap.best(leap.ranked_of_json(body), allowed)
  if best then options["partition"] = conf.partition_of[best] end
end

function slurm_cli_setup_defaults(options, early_pass)
  return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
  local ok, err = pcall(place, options)
  if not ok then io.stderr:write("leap-stream: ", tostring(err), " (job left as asked)\n") end
  return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, job_id, step_id)
  return slurm.SUCCESS
end
