// The Redis escrow script: sluice/core/escrow.h's lease() and reconcile(), transcribed rule for
// rule (src/core/escrow.cpp), on one key's ledger, or leases of many keys in one call.
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
// Returns  lease: {status, granted, window_start_us, now_us, remaining} (status 0 granted,
//          1 spent, 2 window ending, 3 state lost, 4 spec mismatch, 5 short), followed by the
//          ledger's limit and period_us when the status is 4 (otherwise they are the request's,
//          and the window ends one period after it starts); reconcile: the units given back.
//
// Mode "many": n leases of one region and budget in one call, the markers read (INFO, TIME)
// once for all of them, each lease exactly as a "lease" call of its own in the same order.
// KEYS: the n ledgers, then the origin and server markers. ARGV: "many", now_us, min_ttl_ms,
// run_id, n, region, limit, period_us, min_window_left_us, then per lease want and need.
// Returns the n replies, one after another.
//
// Times are whole microseconds and counts at most 2^53, so every number is an exact Lua double
// (the caller checks); the ledger stores them as MessagePack integers and the origin marker
// with %d (tostring would switch to exponent notation).
// The ledger expires max(3 periods, min_ttl_ms) after the last call that wrote it. A lease of a
// key without a ledger runs one command on it (SET ... NX GET PX), one of a key with a ledger
// two (that SET, which writes nothing and returns the ledger, then SET ... PX); see lease_key.
#include "backends/redis/escrow_script.h"

#include "backends/redis/loss_markers.h"

namespace sluice::redis_detail {

const std::string& escrow_script() {
  static const std::string script = loss_markers_lua() + R"lua(
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

-- The ledger in hand, `v`, read from the key `lkey`: the array as stored (see above), so that
-- a lease changes it in place and writes it back as it is: v[2] window start (false: none yet),
-- v[3] clock_high (false: none yet), v[4] limit, v[5] period, v[6] granted, v[7] returned,
-- v[8] forfeited, then per region from v[9] on: id, granted, relinquished, relinquished_window
-- (false: none yet).
local lkey, v
local pack, unpack, rcall = cmsgpack.pack, cmsgpack.unpack, redis.call

local function unreadable() error('sluice: unreadable ledger at ' .. lkey) end

local function read_hash()
  local raw = rcall('HGETALL', lkey)
  local w, h, lim, p, g, ret, f
  local regions = {}
  for i = 1, #raw, 2 do
    local k, s = raw[i], raw[i + 1]
    if sub(k, 1, 2) == 'r:' then
      local rg, rrel, rrw = match(s, '^(%d+):(%d+):(%-?%d*)$')
      if rg == nil then unreadable() end
      regions[#regions + 1] = { sub(k, 3), tonumber(rg), tonumber(rrel), tonumber(rrw) or false }
    elseif k == 'w' then w = tonumber(s)
    elseif k == 'h' then h = tonumber(s)
    elseif k == 'lim' then lim = tonumber(s)
    elseif k == 'p' then p = tonumber(s)
    elseif k == 'g' then g = tonumber(s)
    elseif k == 'ret' then ret = tonumber(s)
    elseif k == 'f' then f = tonumber(s)
    end
  end
  v = { 1, w or false, h or false, lim or false, p or false, g or 0, ret or 0, f or 0 }
  for _, r in ipairs(regions) do
    local n = #v
    v[n + 1], v[n + 2], v[n + 3], v[n + 4] = r[1], r[2], r[3], r[4]
  end
end

-- The ledger in hand from `raw`, what a GET (or SET ... GET) of `lkey` answered under pcall:
-- false: no ledger yet; a WRONGTYPE error: a hash an earlier version left.
local function take(raw)
  if not raw then
    v = { 1, false, false, false, false, 0, 0, 0 }
  elseif type(raw) == 'table' then
    if raw.err == nil or not string.find(raw.err, 'WRONGTYPE', 1, true) then return error(raw) end
    read_hash()
  else
    local ok
    ok, v = pcall(unpack, raw)
    if not ok or type(v) ~= 'table' or v[1] ~= 1 or #v < 8 or (#v - 8) % 4 ~= 0 then
      unreadable()
    end
  end
end

local function open_ledger(key)
  lkey = key
  take(redis.pcall('GET', key))
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
local function write() rcall('SET', lkey, pack(v), 'PX', ttl_of(v[5])) end

-- The index of region `id`'s entry, added (nothing granted or relinquished) when absent.
local function region_at(id)
  local n = #v
  for i = 9, n, 4 do
    if v[i] == id then return i end
  end
  v[n + 1], v[n + 2], v[n + 3], v[n + 4] = id, 0, 0, false
  return n + 1
end

local function left_in()
  local g, ret, lim = v[6], v[7], v[4]
  local used = g - min(ret, g)
  return lim - min(used, lim)
end

-- A new window: the whole budget, no grants; regions that did nothing in the window that ends
-- are forgotten, the others keep their running totals.
local function roll(start, new_lim, new_p)
  local ended = v[2] or -math.huge
  local n, j = #v, 9
  for i = 9, n, 4 do
    local rw = v[i + 3]
    if v[i + 1] ~= 0 or (rw or -math.huge) >= ended then
      v[j], v[j + 1], v[j + 2], v[j + 3] = v[i], 0, v[i + 2], rw
      j = j + 4
    end
  end
  for i = n, j, -1 do v[i] = nil end
  v[2], v[4], v[5], v[6], v[7] = start, new_lim, new_p, 0, 0
end

-- The origin: the coordinator time of the last loss this Redis cannot rule out (rule 3). No
-- marker, or another server process or eviction count than the last lease saw: one now.
local function origin_of(origin_key, server_key, run_id)
  return sluice_origin(origin_key, server_key, run_id, now)
end

-- One lease on the ledger in hand (not written). Returns its reply: status, granted, window
-- start, now, remaining, the ledger's limit and period.
local function lease_one(origin, region, want_lim, want_p, want, min_left, need)
  local t = now
  local h = v[3]
  if h and h > t then t = h end
  v[3] = t
  local w = v[2]
  if not w or t >= w + v[5] then
    roll(window_of(t, want_p), want_lim, want_p)
    w = v[2]
  end
  local lim, p = v[4], v[5]
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
      local me = region_at(region)
      local active = 0
      if v[me + 1] == 0 then active = 1 end
      for i = 10, #v, 4 do if v[i] > 0 then active = active + 1 end end
      local taper = max(1, floor_div(left + 2 * active - 1, 2 * active))
      granted = min(left, max(need, min(want, taper)))
      v[6] = v[6] + granted
      v[me + 1] = v[me + 1] + granted
      remaining = left - granted
    end
  end
  return status, granted, w, t, remaining, lim, p
end

-- A reply written to `out` from out[at + 1]: status, granted, window start, now, remaining, and
-- when the status is 4 (spec mismatch) the ledger's limit and period. Returns where the next
-- reply goes.
local function put(out, at, status, granted, w, t, remaining, lim, p)
  out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5] = status, granted, w, t, remaining
  if status ~= 4 then return at + 5 end
  out[at + 6], out[at + 7] = lim, p
  return at + 7
end

-- Numbers of this call's arguments, each distinct one converted once.
local numbers = {}
local function number(s)
  local x = numbers[s]
  if x == nil then
    x = tonumber(s)
    numbers[s] = x
  end
  return x
end

-- One lease of `key` (`want` and `need` as the arguments gave them), its reply written to `out`
-- from out[at + 1]; returns where the next one goes. Most leases are a key's first in its
-- window, on a key without a ledger: the lease is made on a fresh ledger first and written with
-- SET ... NX GET, one command, which writes nothing when the key has a ledger and returns it
-- instead; the lease is then made again on that one and written. The call's leases share their
-- region, budget, time and origin, so a fresh ledger's lease depends on want and need alone:
-- each distinct pair is made and encoded once per call (`fresh`). A server older than Redis
-- 7.0 refuses NX with GET (a syntax error): from then on, for the rest of the call, GET the
-- ledger and SET it, two commands.
local nx_get = true
local fresh = {}  -- want -> need -> { the reply's 7 numbers, the ledger's MessagePack }
local function lease_key(key, origin, region, want_lim, want_p, want_s, min_left, need_s, out, at)
  lkey = key
  local want, need = number(want_s), number(need_s) or 0
  if nx_get then
    local by_need = fresh[want_s]
    if by_need == nil then
      by_need = {}
      fresh[want_s] = by_need
    end
    local made = by_need[need_s]
    if made == nil then
      v = { 1, false, false, false, false, 0, 0, 0 }
      made = { lease_one(origin, region, want_lim, want_p, want, min_left, need) }
      made[8] = pack(v)
      by_need[need_s] = made
    end
    local old = redis.pcall('SET', key, made[8], 'NX', 'GET', 'PX', ttl_of(want_p))
    if not old then
      return put(out, at, made[1], made[2], made[3], made[4], made[5], made[6], made[7])
    end
    if type(old) == 'table' and old.err and string.find(old.err, 'syntax error', 1, true) then
      nx_get = false
      old = redis.pcall('GET', key)
    end
    take(old)
  else
    take(redis.pcall('GET', key))
  end
  local next_at = put(out, at, lease_one(origin, region, want_lim, want_p, want, min_left, need))
  write()
  return next_at
end

if mode == 'lease' then
  local origin = origin_of(KEYS[2], KEYS[3], ARGV[9])
  local out = {}
  lease_key(KEYS[1], origin, ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7],
            tonumber(ARGV[8]), ARGV[10] or '0', out, 0)
  return out
end

if mode == 'many' then
  local n = tonumber(ARGV[5])
  local origin = origin_of(KEYS[n + 1], KEYS[n + 2], ARGV[4])
  local region, lim, p, min_left = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
  local out, at = {}, 0
  for i = 1, n do
    at = lease_key(KEYS[i], origin, region, lim, p, ARGV[8 + 2 * i], min_left, ARGV[9 + 2 * i],
                   out, at)
  end
  return out
end

-- reconcile
open_ledger(KEYS[1])
local region = ARGV[4]
local rw_in, rel = tonumber(ARGV[5]), tonumber(ARGV[6])
local t = now
local h = v[3]
if h and h > t then t = h end
local w = v[2]
if not w or rw_in > w then return 0 end
local me = region_at(region)
local given = 0
local r_rw = v[me + 3]
if not r_rw or r_rw <= rw_in then
  local before = 0
  if r_rw == rw_in then before = v[me + 2] end
  if rel > before then
    local delta = rel - before
    v[me + 2], v[me + 3] = rel, rw_in
    if rw_in == w and t < w + v[5] then
      local mine = v[me + 1]
      given = min(delta, mine - min(before, mine))
      v[7] = v[7] + given
    else
      v[8] = v[8] + delta
    end
  end
end
write()
return given
)lua";
  return script;
}

}  // namespace sluice::redis_detail
