-- One call applies many completions in arrival order, with the rules of core.history (refreshed,
-- judge, apply_measurement, guard_after, aggregate_step). Global ARGV: alpha, dedup TTL, history
-- TTL, recent window, lineage and aggregate limits (log space), aggregate min count, whether a
-- completion without a stored submission still counts ('1'), and where lineage_id / model_type
-- / num_devices / candidate_hardware sit in a stored submission array, the physics limit, how
-- long an attempt's completion marker lives, the speed limits of a prior and of an aggregate
-- (log space), the speed period and the corroboration gap (seconds), the corroborated limit. A completion that names another lineage or model type, or
-- hardware its submission did not list as a candidate, is a mismatch; one of a job attempt that
-- already completed (its `done` marker holds another event) is a repeat. Per event: KEYS seen,
-- lin, agg, sub, done, the lineage's guard, the model type's aggregate guard; ARGV measured
-- flag ('0' no, '1' yes, '2' a probe's: its device count may be a slice of the submission's,
-- core.history.slice_of), hardware, num_devices, measured_at, log(samples_per_s/num_devices) (computed in Python
-- so both sides use the same libm), lineage_id, model_type, physics ceiling, event_id, event
-- time (core.history.event_time), job key. Floats leave as %.17g: exact round trip.
-- A stored submission gives the device count the job asked for (the `devices` rule).
-- A lineage entry is [num_devices, measured_at, count, has_pending, pending_at, pending,
-- (at, value) of the recent window, oldest first...]; a lineage guard is [has_reference,
-- reference, since, jumped_at, pending_t, pending_job]; an aggregate guard [reference, since].
-- Returns per event: 1 no measurement, 2 accepted, 3 corroborated, 4 quarantined by the
-- lineage, 5 by the aggregate, 6 by the device count, 7 by physics, 11 by speed, 8 submission
-- mismatch, 9 no submission, 10 a repeat of a completed attempt (nothing changed for 8 to 10);
-- + 20 when the aggregate speed bound held the aggregate back; 100 + the first outcome for a
-- duplicate. The `done` marker ("code event_id") is set with the `seen` one.
local alpha = tonumber(ARGV[1])
local seen_ttl = ARGV[2]
local hist_ttl = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local llim = tonumber(ARGV[5])
local alim = tonumber(ARGV[6])
local amin = tonumber(ARGV[7])
local orphans = ARGV[8] == '1'
local li = tonumber(ARGV[9])
local mi = tonumber(ARGV[10])
local di = tonumber(ARGV[11])
local ci = tonumber(ARGV[12])
local plim = tonumber(ARGV[13])
local done_ttl = ARGV[14]
local slim = tonumber(ARGV[15])
local aslim = tonumber(ARGV[16])
local period = tonumber(ARGV[17])
local gap = tonumber(ARGV[18])
local clim = tonumber(ARGV[19])
local G = 19
local never = -1e18  -- core.history.NEVER
local function median(r)
  local s = {}
  for j = 1, #r do s[j] = r[j][2] end
  table.sort(s)
  local m = math.floor(#s / 2)
  if #s % 2 == 1 then return s[m + 1] end
  return (s[m] + s[m + 1]) / 2
end
local function older(u, v)
  if u[1] ~= v[1] then return u[1] < v[1] end
  return u[2] < v[2]
end
local function entry_of(raw)
  local p = cjson.decode(raw)
  if #p == 4 then return p[2], p[3], p[4], {{p[3], math.log(p[1] / p[2])}}, nil end
  local recent = {}
  for j = 7, #p - 1, 2 do recent[#recent + 1] = {p[j], p[j+1]} end
  local pend = nil
  if p[4] == 1 then pend = {p[5], p[6]} end
  return p[1], p[2], p[3], recent, pend
end
local function encode(nd, at, count, recent, pend)
  local parts = {string.format('%d,%.17g,%d', nd, at, count)}
  if pend then
    parts[2] = string.format('1,%.17g,%.17g', pend[1], pend[2])
  else
    parts[2] = '0,0,0'
  end
  for j = 1, #recent do
    parts[#parts + 1] = string.format('%.17g,%.17g', recent[j][1], recent[j][2])
  end
  return '[' .. table.concat(parts, ',') .. ']'
end
local function window_with(recent, this)
  local all = {}
  for j = 1, #recent do all[j] = recent[j] end
  all[#all + 1] = this
  table.sort(all, older)
  local r2 = {}
  for j = math.max(1, #all - window + 1), #all do r2[#r2 + 1] = all[j] end
  return r2
end
local function guard_of(raw)
  if raw then return cjson.decode(raw) end
  return nil
end
local out = {}
local n = #KEYS / 7
for i = 0, n - 1 do
  local k = 7 * i
  local a = G + 1 + 11 * i
  local first = redis.call('GET', KEYS[k+1])
  local done = nil
  if not first then
    done = redis.call('GET', KEYS[k+5])
    if done then
      local sp = string.find(done, ' ', 1, true)
      if string.sub(done, sp + 1) == ARGV[a+8] then first = string.sub(done, 1, sp - 1) end
    end
  end
  if first then
    out[i+1] = 100 + tonumber(first)
  elseif done then
    out[i+1] = 10
  else
    local code = nil
    local snd = nil
    local sub = redis.call('GET', KEYS[k+4])
    if sub then
      local s = cjson.decode(sub)
      if s[li] ~= ARGV[a+5] or s[mi] ~= ARGV[a+6] then
        code = 8
      elseif not string.find('|' .. s[ci] .. '|', '|' .. ARGV[a+1] .. '|', 1, true) then
        code = 8
      end
      snd = tonumber(s[di])
    elseif not orphans then
      code = 9
    end
    if code == nil and ARGV[a] == '0' then code = 1 end
    local held = 0
    if code == nil then
      local hw = ARGV[a+1]
      local nd = tonumber(ARGV[a+2])
      local at = tonumber(ARGV[a+3])
      local x = tonumber(ARGV[a+4])
      local t = tonumber(ARGV[a+9])
      local job = tonumber(ARGV[a+10])
      local raw = redis.call('HGET', KEYS[k+2], hw)
      local pnd, pat, pcount, recent, pend = nd, at, 0, {}, nil
      if raw then pnd, pat, pcount, recent, pend = entry_of(raw) end
      local rawagg = redis.call('HGET', KEYS[k+3], hw)
      local q = nil
      if rawagg then q = cjson.decode(rawagg) end
      local g = guard_of(redis.call('HGET', KEYS[k+6], hw))
      if #recent > 0 then
        local prior = median(recent)
        if not g then
          g = {1, prior, t, never, never, 0}
        elseif g[1] == 0 or t - g[3] >= period then
          g[1] = 1
          g[2] = prior
          g[3] = t
        end
      end
      code = 2
      local rule = nil
      if snd and nd ~= snd and not (ARGV[a] == '2' and nd > 0 and nd < snd and snd % nd == 0) then
        rule = 6
      elseif #recent > 0 and nd == pnd then
        if math.abs(x - median(recent)) > llim then rule = 4 end
      elseif q and q[2] >= amin then
        if math.abs(x - q[1]) > alim then rule = 5 end
      end
      local impossible = ARGV[a+7] ~= '' and x - tonumber(ARGV[a+7]) > plim
      if rule == nil and impossible then rule = 7 end
      local this = {at, x}
      if rule == nil and g and g[1] == 1 and #recent > 0 then
        if math.abs(median(window_with(recent, this)) - g[2]) > slim then rule = 11 end
      end
      if rule then
        local indep = g and job ~= 0 and g[6] ~= 0 and g[6] ~= job and t - g[5] >= gap
          and t - g[4] >= period
        if not impossible and pend and math.abs(x - pend[2]) <= llim and indep then
          code = 3
          if g[1] == 1 and math.abs(median({pend, this}) - g[2]) > clim then code = 11 end
        else
          code = rule
        end
      end
      local entry
      local kept = nil
      if code >= 4 then
        entry = encode(pnd, pat, pcount, recent, this)
      elseif code == 3 then
        local pair = {pend, this}
        table.sort(pair, older)
        kept = pair
        entry = encode(nd, pair[2][1], pcount + 2, pair, nil)
      elseif #recent == 0 then
        kept = {this}
        entry = encode(nd, at, pcount + 1, kept, nil)
      else
        kept = window_with(recent, this)
        if at < pat then
          entry = encode(pnd, pat, pcount + 1, kept, nil)
        else
          entry = encode(nd, at, pcount + 1, kept, nil)
        end
      end
      redis.call('HSET', KEYS[k+2], hw, entry)
      redis.call('EXPIRE', KEYS[k+2], hist_ttl)
      if code >= 4 then
        if not g then g = {0, 0, t, never, never, 0} end
        g[5] = t
        g[6] = job
      elseif code == 3 then
        g = {1, median(kept), t, t, never, 0}
      elseif not g or g[1] == 0 then
        local jumped = never
        if g then jumped = g[4] end
        g = {1, median(kept), t, jumped, never, 0}
      end
      redis.call('HSET', KEYS[k+6], hw, string.format('[%d,%.17g,%.17g,%.17g,%.17g,%d]',
        g[1], g[2], g[3], g[4], g[5], g[6]))
      redis.call('EXPIRE', KEYS[k+6], hist_ttl)
      if code <= 3 then
        local e, c, last = x, 1, at
        local ag = guard_of(redis.call('HGET', KEYS[k+7], hw))
        if q then
          e = q[1] + alpha * (x - q[1])
          c = q[2] + 1
          last = math.max(q[3], at)
          local forming = q[2] < amin
          if not ag or forming or t - ag[2] >= period then ag = {q[1], t} end
          if not forming then
            local he = math.min(math.max(e, ag[1] - aslim), ag[1] + aslim)
            if he ~= e then
              e = he
              held = 20
            end
          end
        else
          ag = {x, t}
        end
        redis.call('HSET', KEYS[k+3], hw, string.format('[%.17g,%d,%.17g]', e, c, last))
        redis.call('EXPIRE', KEYS[k+3], hist_ttl)
        redis.call('HSET', KEYS[k+7], hw, string.format('[%.17g,%.17g]', ag[1], ag[2]))
        redis.call('EXPIRE', KEYS[k+7], hist_ttl)
      end
    end
    if code <= 7 or code == 11 then
      redis.call('SET', KEYS[k+1], code + held, 'EX', seen_ttl)
      redis.call('SET', KEYS[k+5], (code + held) .. ' ' .. ARGV[a+8], 'EX', done_ttl)
    end
    out[i+1] = code + held
  end
end
return out
