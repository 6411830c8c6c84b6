-- leap-stream job_submit plugin (server side, inside slurmctld).
--
-- Runs under slurmctld's locks, so it never calls the network: it reads the local rankings
-- cache that `leap-stream rankings cache` keeps fresh from the rankings topic (the job's own
-- ranking when its submission was ranked before sbatch, else the newest ranking of its
-- lineage) and sets the partition to the best ranked type among those the user allowed.
-- No ranking, a stale one, a malformed spec or any error: the job keeps what it asked for.
--
-- Install: this file, leap_stream.lua and leap-stream.conf beside slurm.conf, and
-- JobSubmitPlugins=lua in slurm.conf (deploy/slurm/README.md).

local here = (debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$")) or "/etc/slurm"
local leap = dofile(here .. "/leap_stream.lua")

local function place(job_desc)
  local spec, why = leap.spec_of(job_desc.comment)
  if not spec then
    if why then slurm.log_info("leap-stream: job spec ignored: %s", why) end
    return
  end
  local conf = leap.read_conf(here .. "/leap-stream.conf")
  local allowed, unknown = leap.allowed(conf, job_desc.partition)
  if #unknown > 0 or #allowed == 0 then
    slurm.log_info("leap-stream: lineage %s: partitions not all known, left as asked",
                   spec.lineage_id)
    return
  end
  local now = os.time()
  local entry = leap.read_cached(conf, "job", spec.job_id, now)
  local via = "job"
  if not entry then
    entry, via = leap.read_cached(conf, "lineage", spec.lineage_id, now), "lineage"
  end
  local best = entry and leap.best(entry.ranked, allowed)
  if not best then
    slurm.log_info("leap-stream: lineage %s: no ranking, left as asked", spec.lineage_id)
    return
  end
  job_desc.partition = conf.partition_of[best]
  -- one word, so `scontrol show job -o` and sacct show it whole
  job_desc.admin_comment = string.format("leap-stream:type=%s;from=%s;ranking=%s;source=%s;model=%s",
    best, via, entry.job_id or "-", entry.source or "-", entry.model_version or "-")
  slurm.log_info("leap-stream: lineage %s -> %s", spec.lineage_id, best)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, err = pcall(place, job_desc)
  if not ok then slurm.log_error("leap-stream: %s (job left as asked)", tostring(err)) end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

slurm.log_info("leap-stream: job_submit plugin loaded from %s", here)
return slurm.SUCCESS
