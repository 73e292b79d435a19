// The Redis escrow script: sluice/escrow.h's lease() and reconcile(), transcribed rule for rule
// (src/core/escrow.cpp), on one key's ledger, or leases of many keys in one call.
//
// KEYS[1]  the key's ledger hash: "w" window start, "h" clock_high, "lim" limit, "p" period,
//          "g" granted, "ret" returned, "f" forfeited, and per region "r:<region>" =
//          "granted:relinquished:relinquished_window" (the window empty: none yet). No "w":
//          no window leased yet.
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
// (the caller checks); they are written with %.0f (tostring would switch to exponent notation).
// The hash expires max(3 periods, min_ttl_ms) after the last call that wrote it.
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

local function num(x) return string.format('%.0f', x) end
-- Floor division of integers below 2^53 (corrected, should the quotient round up).
local function floor_div(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end
local function window_of(t, p) return floor_div(t, p) * p end

-- The ledger in hand: `l` read from the hash `lkey`; `gone` the region fields to delete.
local l, gone, lkey
local function open_ledger(key)
  lkey = key
  l = { regions = {}, f = 0 }
  gone = {}
  local raw = redis.call('HGETALL', key)
  for i = 1, #raw, 2 do
    local f, v = raw[i], raw[i + 1]
    if string.sub(f, 1, 2) == 'r:' then
      local g, rel, rw = string.match(v, '^(%d+):(%d+):(%-?%d*)$')
      l.regions[string.sub(f, 3)] = { granted = tonumber(g), rel = tonumber(rel), rw = tonumber(rw) }
    elseif f == 'w' or f == 'h' or f == 'lim' or f == 'p' or f == 'g' or f == 'ret' or f == 'f' then
      l[f] = tonumber(v)
    end
  end
end

local function write()
  local args = { 'w', num(l.w), 'h', num(l.h), 'lim', num(l.lim), 'p', num(l.p), 'g', num(l.g),
                 'ret', num(l.ret), 'f', num(l.f) }
  for id, r in pairs(l.regions) do
    local rw = ''
    if r.rw ~= nil then rw = num(r.rw) end
    args[#args + 1] = 'r:' .. id
    args[#args + 1] = num(r.granted) .. ':' .. num(r.rel) .. ':' .. rw
  end
  -- The forgotten regions go first: one may have leased again since (rolled, then created).
  if #gone > 0 then redis.call('HDEL', lkey, unpack(gone)) end
  redis.call('HSET', lkey, unpack(args))
  redis.call('PEXPIRE', lkey, math.max(min_ttl, math.ceil(3 * l.p / 1000)))
end

local function region_of(id)
  local r = l.regions[id]
  if r == nil then
    r = { granted = 0, rel = 0, rw = nil }
    l.regions[id] = r
  end
  return r
end

local function window_open(t) return l.w ~= nil and t < l.w + l.p end

local function left_in()
  local used = l.g - math.min(l.ret, l.g)
  return l.lim - math.min(used, l.lim)
end

-- A new window: the whole budget, no grants; regions that did nothing in the window that ends
-- are forgotten, the others keep their running totals.
local function roll(start, lim, p)
  local ended = l.w or -math.huge
  for id, r in pairs(l.regions) do
    if r.granted == 0 and (r.rw or -math.huge) < ended then
      l.regions[id] = nil
      gone[#gone + 1] = 'r:' .. id
    end
  end
  for _, r in pairs(l.regions) do r.granted = 0 end
  l.w, l.lim, l.p, l.g, l.ret = start, lim, p, 0, 0
end

-- The origin: the coordinator time of the last loss this Redis cannot rule out (rule 3). No
-- marker, or another server process or eviction count than the last lease saw: one now.
local function origin_of(origin_key, server_key, run_id)
  local evicted = string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)') or '?'
  local server = run_id .. ':' .. evicted
  local origin = tonumber(redis.call('GET', origin_key))
  if origin == nil or redis.call('GET', server_key) ~= server then
    origin = now
    redis.call('SET', origin_key, num(now))
    redis.call('SET', server_key, server)
  end
  return origin
end

-- One lease on the ledger in hand; its reply's 8 numbers appended to `out`.
local function lease_one(origin, region, lim, p, want, min_left, need, out)
  local t = now
  if l.h ~= nil and l.h > t then t = l.h end
  l.h = t
  if not window_open(t) then roll(window_of(t, p), lim, p) end
  local we = l.w + l.p
  local status, granted, remaining = 0, 0, 0
  if l.lim ~= lim or l.p ~= p then
    status, remaining = 4, left_in()
  elseif l.w <= window_of(origin, p) then
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
      local regions = 0
      if me.granted == 0 then regions = 1 end
      for _, r in pairs(l.regions) do if r.granted > 0 then regions = regions + 1 end end
      local taper = math.max(1, floor_div(left + 2 * regions - 1, 2 * regions))
      granted = math.min(left, math.max(need, math.min(want, taper)))
      l.g = l.g + granted
      me.granted = me.granted + granted
      remaining = left - granted
    end
  end
  write()
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = status, granted, l.w, we
  out[n + 5], out[n + 6], out[n + 7], out[n + 8] = t, remaining, l.lim, l.p
end

if mode == 'lease' then
  local origin = origin_of(KEYS[2], KEYS[3], ARGV[9])
  open_ledger(KEYS[1])
  local out = {}
  lease_one(origin, ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
            tonumber(ARGV[8]), tonumber(ARGV[10]) or 0, out)
  return out
end

if mode == 'many' then
  local n = tonumber(ARGV[5])
  local origin = origin_of(KEYS[n + 1], KEYS[n + 2], ARGV[4])
  local out = {}
  for i = 1, n do
    local a = 5 + (i - 1) * 6
    open_ledger(KEYS[i])
    lease_one(origin, ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
              tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), out)
  end
  return out
end

-- reconcile
open_ledger(KEYS[1])
local region = ARGV[4]
local w, rel = tonumber(ARGV[5]), tonumber(ARGV[6])
local t = now
if l.h ~= nil and l.h > t then t = l.h end
if l.w == nil or w > l.w then return 0 end
local r = region_of(region)
local given = 0
if r.rw == nil or r.rw <= w then
  local before = 0
  if r.rw == w then before = r.rel end
  if rel > before then
    local delta = rel - before
    r.rw, r.rel = w, rel
    if w == l.w and window_open(t) then
      given = math.min(delta, r.granted - math.min(before, r.granted))
      l.ret = l.ret + given
    else
      l.f = l.f + delta
    end
  end
end
write()
return given
)lua";
  return script;
}

}  // namespace sluice::redis_detail
