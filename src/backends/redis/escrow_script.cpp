// The Redis escrow script: sluice/escrow.h's lease() and reconcile(), transcribed rule for rule
// (src/core/escrow.cpp), on one key's ledger, or leases of many keys in one call.
//
// KEYS[1]  the key's ledger: one string, a MessagePack array of 1 (the form's version), window
//          start, clock_high, limit, period, granted, returned, forfeited, then per region its
//          id, granted, relinquished, relinquished_window (false: none yet). No key: no window
//          leased yet. Read it with
//            EVAL "return cmsgpack.unpack(redis.call('GET', KEYS[1]))" 1 <ledger key>
//          A ledger an earlier version left as a hash (fields "w", "h", "lim", "p", "g", "ret",
//          "f", "r:<region>" = "granted:relinquished:relinquished_window") is read as such and
//          written back in this form.
// KEYS[2]  the origin marker: the coordinator time at which this Redis was last found to have
//          lost grants it acknowledged (rule 3). A lease writes the current time there when it
//          finds no marker (an empty or flushed Redis), or when KEYS[3] does not name the server
//          as it is now.
// KEYS[3]  the server marker, "<run_id>:<evicted_keys>" as the last lease saw them: another
//          run_id is another server process (a restart, whatever it reloaded: an RDB snapshot
//          or an AOF may lack the last grants; a replica promoted by a failover may too), and
//          another evicted_keys count means keys were evicted (a ledger among them, perhaps).
//          Either is a loss of grants this Redis cannot rule out, so it counts as one.
// ARGV     mode ("lease" or "reconcile"), now_us (empty: Redis TIME), min_ttl_ms, region, then
//          lease:      limit, period_us, want, min_window_left_us (rounded up), run_id (the
//                      server's, read by the caller's connection when it connected), need
//                      (absent: 0)
//          reconcile:  window_start_us, relinquished
// Returns  lease: {status, granted, window_start_us, window_end_us, now_us, remaining, limit,
//          period_us} (status 0 granted, 1 spent, 2 window ending, 3 state lost, 4 spec
//          mismatch, 5 short); reconcile: the units given back.
//
// Mode "many": n leases in one call, the markers read (INFO, TIME) once for all of them, each
// lease exactly as a "lease" call of its own in the same order. KEYS: the n ledgers, then the
// origin and server markers. ARGV: "many", now_us, min_ttl_ms, run_id, n, then per lease region,
// limit, period_us, want, min_window_left_us, need. Returns the n replies' 8 numbers, one after
// another.
//
// Times are whole microseconds and counts at most 2^53, so every number is an exact Lua double
// (the caller checks); the ledger stores them as MessagePack integers and the origin marker
// with %d (tostring would switch to exponent notation).
// The ledger expires max(3 periods, min_ttl_ms) after the last call that wrote it. A lease
// runs two commands on it (GET, SET ... PX), as a per-request limiter's script does.
#include "backends/redis/escrow_script.h"

namespace sluice::redis_detail {

const std::string& escrow_script() {
  static const std::string script = R"lua(
local mode = ARGV[1]
local now = tonumber(ARGV[2])
local min_ttl = tonumber(ARGV[3])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local format, match, sub = string.format, string.match, string.sub

-- Floor division of integers below 2^53 (corrected, should the quotient round up).
local function floor_div(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end
local function window_of(t, p) return floor_div(t, p) * p end

-- The ledger in hand, read from the key `lkey`: window start `w` (nil: none yet), clock_high `h`,
-- limit, period, granted, returned, forfeited, and `regions`: id -> {granted, rel, rw}.
local lkey, w, h, lim, p, g, ret, f, regions

local function unreadable() error('sluice: unreadable ledger at ' .. lkey) end

local function read_hash()
  local raw = redis.call('HGETALL', lkey)
  for i = 1, #raw, 2 do
    local k, v = raw[i], raw[i + 1]
    if sub(k, 1, 2) == 'r:' then
      local rg, rrel, rrw = match(v, '^(%d+):(%d+):(%-?%d*)$')
      if rg == nil then unreadable() end
      regions[sub(k, 3)] = { granted = tonumber(rg), rel = tonumber(rrel), rw = tonumber(rrw) }
    elseif k == 'w' then w = tonumber(v)
    elseif k == 'h' then h = tonumber(v)
    elseif k == 'lim' then lim = tonumber(v)
    elseif k == 'p' then p = tonumber(v)
    elseif k == 'g' then g = tonumber(v)
    elseif k == 'ret' then ret = tonumber(v)
    elseif k == 'f' then f = tonumber(v)
    end
  end
end

local function open_ledger(key)
  lkey, regions, f = key, {}, 0
  w, h, lim, p, g, ret = nil, nil, nil, nil, nil, nil
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' then
    if raw.err == nil or not string.find(raw.err, 'WRONGTYPE', 1, true) then return error(raw) end
    return read_hash()
  end
  if not raw then return end
  local ok, v = pcall(cmsgpack.unpack, raw)
  if not ok or type(v) ~= 'table' or v[1] ~= 1 or #v < 8 or (#v - 8) % 4 ~= 0 then
    unreadable()
  end
  w, h, lim, p, g, ret, f = v[2], v[3], v[4], v[5], v[6], v[7], v[8]
  for i = 9, #v, 4 do
    local rw = v[i + 3]
    if rw == false then rw = nil end
    regions[v[i]] = { granted = v[i + 1], rel = v[i + 2], rw = rw }
  end
end

-- The ledger's time to live, in milliseconds, for a period of `period` us (the last one kept).
local ttl_p, ttl_ms
local function ttl_of(period)
  if period ~= ttl_p then
    ttl_p, ttl_ms = period, format('%d', max(min_ttl, ceil(3 * period / 1000)))
  end
  return ttl_ms
end

-- MessagePack writes each number, an integer below 2^53, as an integer: exactly.
local function write()
  local v = { 1, w, h, lim, p, g, ret, f }
  local n = 8
  for id, r in pairs(regions) do
    local rw = r.rw
    if rw == nil then rw = false end
    v[n + 1], v[n + 2], v[n + 3], v[n + 4] = id, r.granted, r.rel, rw
    n = n + 4
  end
  redis.call('SET', lkey, cmsgpack.pack(v), 'PX', ttl_of(p))
end

local function region_of(id)
  local r = regions[id]
  if r == nil then
    r = { granted = 0, rel = 0 }
    regions[id] = r
  end
  return r
end

local function window_open(t) return w ~= nil and t < w + p end

local function left_in()
  local used = g - min(ret, g)
  return lim - min(used, lim)
end

-- A new window: the whole budget, no grants; regions that did nothing in the window that ends
-- are forgotten, the others keep their running totals.
local function roll(start, new_lim, new_p)
  local ended = w or -math.huge
  for id, r in pairs(regions) do
    if r.granted == 0 and (r.rw or -math.huge) < ended then
      regions[id] = nil
    else
      r.granted = 0
    end
  end
  w, lim, p, g, ret = start, new_lim, new_p, 0, 0
end

-- The origin: the coordinator time of the last loss this Redis cannot rule out (rule 3). No
-- marker, or another server process or eviction count than the last lease saw: one now.
local function origin_of(origin_key, server_key, run_id)
  local evicted = match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)') or '?'
  local server = run_id .. ':' .. evicted
  local origin = tonumber(redis.call('GET', origin_key))
  if origin == nil or redis.call('GET', server_key) ~= server then
    origin = now
    redis.call('SET', origin_key, format('%d', now))
    redis.call('SET', server_key, server)
  end
  return origin
end

-- One lease on the ledger in hand; its reply's 8 numbers written to `out` from out[at + 1].
local function lease_one(origin, region, want_lim, want_p, want, min_left, need, out, at)
  local t = now
  if h ~= nil and h > t then t = h end
  h = t
  if not window_open(t) then roll(window_of(t, want_p), want_lim, want_p) end
  local we = w + p
  local status, granted, remaining = 0, 0, 0
  if lim ~= want_lim or p ~= want_p then
    status, remaining = 4, left_in()
  elseif w <= window_of(origin, want_p) then
    status = 3
  else
    local left = left_in()
    remaining = left
    if we - t < min_left then
      status = 2
    elseif left == 0 then
      status = 1
    elseif left < need then
      status = 5
    else
      local me = region_of(region)
      local active = 0
      if me.granted == 0 then active = 1 end
      for _, r in pairs(regions) do if r.granted > 0 then active = active + 1 end end
      local taper = max(1, floor_div(left + 2 * active - 1, 2 * active))
      granted = min(left, max(need, min(want, taper)))
      g = g + granted
      me.granted = me.granted + granted
      remaining = left - granted
    end
  end
  write()
  out[at + 1], out[at + 2], out[at + 3], out[at + 4] = status, granted, w, we
  out[at + 5], out[at + 6], out[at + 7], out[at + 8] = t, remaining, lim, p
end

if mode == 'lease' then
  local origin = origin_of(KEYS[2], KEYS[3], ARGV[9])
  open_ledger(KEYS[1])
  local out = {}
  lease_one(origin, ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
            tonumber(ARGV[8]), tonumber(ARGV[10]) or 0, out, 0)
  return out
end

if mode == 'many' then
  local n = tonumber(ARGV[5])
  local origin = origin_of(KEYS[n + 1], KEYS[n + 2], ARGV[4])
  local out = {}
  -- Leases of one budget repeat their numbers: each distinct argument is converted once.
  local seen = {}
  local function number(s)
    local x = seen[s]
    if x == nil then
      x = tonumber(s)
      seen[s] = x
    end
    return x
  end
  for i = 1, n do
    local a = 5 + (i - 1) * 6
    open_ledger(KEYS[i])
    lease_one(origin, ARGV[a + 1], number(ARGV[a + 2]), number(ARGV[a + 3]), number(ARGV[a + 4]),
              number(ARGV[a + 5]), number(ARGV[a + 6]), out, 8 * (i - 1))
  end
  return out
end

-- reconcile
open_ledger(KEYS[1])
local region = ARGV[4]
local rw_in, rel = tonumber(ARGV[5]), tonumber(ARGV[6])
local t = now
if h ~= nil and h > t then t = h end
if w == nil or rw_in > w then return 0 end
local r = region_of(region)
local given = 0
if r.rw == nil or r.rw <= rw_in then
  local before = 0
  if r.rw == rw_in then before = r.rel end
  if rel > before then
    local delta = rel - before
    r.rw, r.rel = rw_in, rel
    if rw_in == w and window_open(t) then
      given = min(delta, r.granted - min(before, r.granted))
      ret = ret + given
    else
      f = f + delta
    end
  end
end
write()
return given
)lua";
  return script;
}

}  // namespace sluice::redis_detail
