// The Redis shared rate script: sluice/core/shared_rate.h's apply() (and through it the three
// strategies of src/core/rate_strategy.cpp), transcribed rule for rule, for n calls in one script
// call.
//
// KEYS[1..n]  each call's state: one string of 41 bytes, struct.pack('<c1ddddd', strategy,
//             limit, written_us, a, b, c): strategy f, s or g; `limit` the rule's when written;
//             `written_us` the coordinator time of that write; fixed window: a window start,
//             b count (c 0); sliding window: a window start, b current, c previous; GCRA: the
//             theoretical arrival time times the limit, tat * limit = a * limit + b in
//             microseconds (0 <= b < limit; c 0). Read it with
//               EVAL "return {struct.unpack('<c1ddddd', redis.call('GET', KEYS[1]))}" 1 <key>
//             No key: never written (or idle long enough to have expired).
// KEYS[n+1]   the origin marker, KEYS[n+2] the server marker: as in escrow_script.cpp (a time
//             at which this Redis was found to have lost writes it may have acknowledged, and
//             "<run_id>:<evicted_keys>" as the last call saw them). No origin marker, another
//             run_id or another eviction count: the origin is now.
// ARGV        now_us (empty: Redis TIME), run_id (the caller's connection's), n, then r and r
//             rules, each strategy (f, s, g), limit, period_us, burst (GCRA; the limit when 0),
//             margin_ms (a state expires this long after it decides like a fresh key), then per
//             call op (c check, p peek, r refund, h charge, t take), its rule (1..r) and hits
//             (clamped by the caller: see below).
// Returns     now_us, then per call 7 integers: allowed, limit, remaining, reset_after (whole
//             us, then ns 0..999), retry_after (the same; -1 -1: never); a take one more, the
//             hits it took; a charge 7 more: its limit, remaining, overdraft, reset_after (us,
//             ns), retry_after (us, ns).
//
// Exactness. Lua numbers are doubles, exact below 2^53. Times are whole microseconds (so the
// local strategies' ns results are a microsecond part and a remainder of 0..999 ns, computed
// without ever forming a product above 2^53). The caller accepts only rules whose numbers stay
// below that: a sliding window's limit * period_us and a GCRA rule's burst * period_us at most
// 2^50; counts and a GCRA debt that charges raise saturate at a cap (the local strategies'
// saturate at 2^64 and 2^127: the two differ only in the overdraft of a key charged past the cap).
// Hits beyond what any decision can tell apart are clamped by the caller (limit + 1 or burst + 1
// for a check or peek).
#include "backends/redis/shared_rate_script.h"

#include "backends/redis/loss_markers.h"

namespace sluice::redis_detail {

const std::string& shared_rate_script() {
  static const std::string script = loss_markers_lua() + R"lua(
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local run_id = ARGV[2]
local n = tonumber(ARGV[3])
local floor, max, min = math.floor, math.max, math.min
local format, match = string.format, string.match
local pack, unpack = struct.pack, struct.unpack
local rcall = redis.call

local P52 = 4503599627370496  -- 2^52: a fixed window's count
local P51 = 2251799813685248  -- 2^51: a GCRA debt (us * limit); a sliding window's counts * p
local P43 = 8796093022208     -- 2^43: a sliding window's counts (1000 * count stays exact)

local function floor_div(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end
local function window_of(t, p) return floor_div(t, p) * p end

-- Durations are pairs of numbers (us, ns), us * 1000 + ns ns with 0 <= ns < 1000, passed and
-- returned as two values (no table per duration); (-1, -1) is never.
local function norm(a, b)
  if b >= 0 and b < 1000 then return a, b end
  local c = floor_div(b, 1000)
  return a + c, b - c * 1000
end
-- floor(1000 * x / d) ns for integers x >= 0, d > 0 (1000 * (x mod d) below 2^53).
local function floor1000(x, d)
  local q = floor_div(x, d)
  return norm(q, floor_div(1000 * (x - q * d), d))
end
-- ceil(1000 * x / d) ns.
local function ceil1000(x, d)
  local q = floor_div(x, d)
  return norm(q, floor_div(1000 * (x - q * d) + d - 1, d))
end

-- The call in hand: its rule (L limit, p period in us, B burst) and the key's state (sa, sb, sc:
-- see KEYS; sa nil when never written), and whether the state must be written back.
local L, p, B, sa, sb, sc, dirty

local function fits(count, h) return count <= L and h <= L - count end

-- Each decide returns allowed, limit, remaining, reset (us, ns), retry (us, ns), and commits
-- when asked.
local function fixed(h, commit)
  local start = window_of(now, p)
  local count = 0
  if sa == start then count = sb end
  local wend = p - (now - start)
  if not fits(count, h) then
    local reset, rem = 0, 0
    if count > 0 then reset = wend end
    if count < L then rem = L - count end
    if h > L then return 0, L, rem, reset, 0, -1, -1 end
    return 0, L, rem, reset, 0, wend, 0
  end
  count = count + h
  if commit and h > 0 then sa, sb, dirty = start, count, true end
  if count > 0 then return 1, L, L - count, wend, 0, 0, 0 end
  return 1, L, L - count, 0, 0, 0, 0
end

local function slide(h, commit)
  local start = window_of(now, p)
  local cur, prev = 0, 0
  if sa == start then cur, prev = sb, sc
  elseif sa == start - p then prev = sb end
  local e = now - start
  local wprev = prev * (p - e)
  local cap = L * p
  local allowed = h <= L and wprev + (cur + h) * p <= cap
  local after = cur
  if allowed then after = cur + h end
  local used = wprev + after * p
  local remaining = 0
  if used < cap then remaining = floor_div(cap - used, p) end
  local reset = 0
  if after > 0 then reset = 2 * p - e elseif prev > 0 then reset = p - e end
  if allowed then
    if commit and h > 0 then sa, sb, sc, dirty = start, after, prev, true end
    return 1, L, remaining, reset, 0, 0, 0
  end
  if h > L then return 0, L, remaining, reset, 0, -1, -1 end
  local ra, rb
  if fits(cur, h) then
    -- until the previous window's weight has fallen far enough: p - min(w, p) - e
    local wa, wb = floor1000((L - cur - h) * p, prev)
    if wa > p or (wa == p and wb > 0) then wa, wb = p, 0 end
    ra, rb = norm(p - wa - e, -wb)
  else
    -- into the next window, where this one's count is the previous: p + (p - min(x, p)) - e
    local xa, xb = floor1000((L - h) * p, cur)
    if xa > p or (xa == p and xb > 0) then xa, xb = p, 0 end
    ra, rb = norm(2 * p - xa - e, -xb)
  end
  if ra < 0 or (ra == 0 and rb < 1) then ra, rb = 0, 1 end
  return 0, L, remaining, reset, 0, ra, rb
end

-- GCRA: the debt now, in us * limit (tat * limit - now * limit, at least 0).
local function debt()
  if sa == nil or sa < now then return 0 end
  return (sa - now) * L + sb
end
local function set_tat(after)
  local q = floor_div(after, L)
  sa, sb, dirty = now + q, after - q * L, true
end
-- Whole hits that fit on top of debt x (tolerance tol).
local function left(x, tol)
  if x >= tol then return 0 end
  return floor_div(tol - x, p)
end
-- Until debt x has drained to `to`.
local function till(x, to)
  if x <= to then return 0, 0 end
  return ceil1000(x - to, L)
end
local function gcra(h, commit)
  local d = debt()
  local tol = B * p
  local ra, rb = till(d, 0)
  if h > B then return 0, B, left(d, tol), ra, rb, -1, -1 end
  local after = d + h * p
  if after > tol then
    local ta, tb = till(after, tol)
    return 0, B, left(d, tol), ra, rb, ta, tb
  end
  if commit and h > 0 then set_tat(after) end
  ra, rb = till(after, 0)
  return 1, B, left(after, tol), ra, rb, 0, 0
end

local decide

-- Raises a state written before the origin (sluice/core/shared_rate.h).
local function raise(origin, kind)
  local ws = window_of(origin, p)
  if kind == 'f' then
    if sa == ws then sb = max(sb, L)
    elseif sa == nil or sa < ws then sa, sb = ws, L end
  elseif kind == 's' then
    if sa == ws then sb, sc = max(sb, L), max(sc, L)
    elseif sa == ws - p then sa, sb, sc = ws, L, max(sb, L)
    elseif sa == nil or sa < ws then sa, sb, sc = ws, L, L end
  else
    local tol = B * p
    local q = floor_div(tol, L)
    local a, b = origin + q, tol - q * L
    if sa == nil or sa < a or (sa == a and sb < b) then sa, sb = a, b end
  end
end

-- Writes the state back if it changed, to expire `margin` ms (rule[5]) after it decides like a
-- fresh key (core/shared_rate.cpp: idle_at); returns `next`.
local function finish(key, kind, rule, next)
  if not dirty then return next end
  local idle  -- us from now
  if kind == 'f' then idle = sa + p - now
  elseif kind == 's' then idle = sa + 2 * p - now
  else
    idle = sa - now
    if sb > 0 then idle = idle + 1 end
  end
  local ttl = floor_div(max(idle, 0) + 999, 1000) + rule[5]
  rcall('SET', key, pack('<c1ddddd', kind, L, now, sa, sb, sc), 'PX', format('%d', ttl))
  return next
end

-- One call with rule `rule` (a table: kind, limit, period, burst, ttl): its reply goes to
-- out[at + 1 ...]; returns where the next one goes.
local function call(key, origin, op, rule, hits, out, at)
  local kind = rule[1]
  L, p, B = rule[2], rule[3], rule[4]
  local h = tonumber(hits)
  sa, sb, sc, dirty = nil, nil, 0, false
  local raw = rcall('GET', key)
  local written = nil
  if raw then
    if #raw ~= 41 then return error('sluice: unreadable shared rate state at ' .. key) end
    local k, sl, sw, ta, tb, tc = unpack('<c1ddddd', raw)
    if k ~= kind then return error('sluice: unreadable shared rate state at ' .. key) end
    written, sa, sb, sc = sw, ta, tb, tc
    if sl ~= L then
      -- Carried: a window's counts mean the same; a GCRA debt (in hits * period) is kept.
      if kind == 'g' then
        local d = 0
        if sa >= now then d = (sa - now) * sl + sb end
        set_tat(d)
      end
      dirty = true
    end
  end
  if written == nil or written <= origin then raise(origin, kind) end
  if kind == 'f' then decide = fixed elseif kind == 's' then decide = slide else decide = gcra end
  if op == 'c' or op == 'p' then
    out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6], out[at + 7] =
      decide(h, op == 'c')
  elseif op == 't' then
    local a0, _, r0 = decide(0, false)
    local g = 0
    if a0 == 1 then g = min(h, r0) end
    if g > 0 then
      out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6], out[at + 7] =
        decide(g, true)
    else
      out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6], out[at + 7] =
        decide(min(h, 1), false)
    end
    out[at + 8] = g
    return finish(key, kind, rule, at + 8)
  elseif op == 'r' then
    if h == 0 then
      -- nothing to give back
    elseif kind == 'f' or kind == 's' then
      if sa == window_of(now, p) then sb, dirty = sb - min(h, sb), true end
    elseif sa ~= nil then
      local v = sb - h * p
      local q = floor_div(v, L)
      sa, sb, dirty = sa + q, v - q * L, true
    end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6], out[at + 7] =
      decide(0, false)
  else
    local cover = 0
    if kind == 'f' then
      local start = window_of(now, p)
      local count = 0
      if sa == start then count = sb end
      count = min(count + h, P52)
      if h > 0 then sa, sb, dirty = start, count, true end
      if count > L then cover = count - L end
    elseif kind == 's' then
      local start = window_of(now, p)
      local cur, prev = 0, 0
      if sa == start then cur, prev = sb, sc
      elseif sa == start - p then prev = sb end
      cur = min(cur + h, min(P43, floor_div(P51, p)))
      if h > 0 then sa, sb, sc, dirty = start, cur, prev, true end
      local used = prev * (p - (now - start)) + cur * p
      local cap = L * p
      if used > cap then cover = floor_div(used - cap + p - 1, p) end
    else
      local after = min(debt() + h * p, P51)
      if h > 0 then set_tat(after) end
      local tol = B * p
      if after > tol then cover = floor_div(after - tol + p - 1, p) end
    end
    -- The allowance after it (a check of 0 hits and one of 1), then the decision of 0 hits.
    local a0, l0, r0, s0, s1 = decide(0, false)
    local a1, _, _, _, _, t0, t1 = decide(1, false)
    if a0 == 0 then r0 = 0 end
    if a1 == 1 then t0, t1 = 0, 0 end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6], out[at + 7] =
      decide(0, false)
    out[at + 8], out[at + 9], out[at + 10], out[at + 11], out[at + 12], out[at + 13],
      out[at + 14] = l0, r0, cover, s0, s1, t0, t1
  end
  if op == 'h' then return finish(key, kind, rule, at + 14) end
  return finish(key, kind, rule, at + 7)
end

local origin = sluice_origin(KEYS[n + 1], KEYS[n + 2], run_id, now)
local rules = {}
for r = 1, tonumber(ARGV[4]) do
  local j = 4 + (r - 1) * 5
  local burst = tonumber(ARGV[j + 4])
  local lim = tonumber(ARGV[j + 2])
  if burst == 0 then burst = lim end
  rules[r] = { ARGV[j + 1], lim, tonumber(ARGV[j + 3]), burst, tonumber(ARGV[j + 5]) }
end
local first = 5 + #rules * 5
local out = { now }
local at = 1
for i = 1, n do
  local j = first + (i - 1) * 3
  at = call(KEYS[i], origin, ARGV[j], rules[tonumber(ARGV[j + 1])], ARGV[j + 2], out, at)
end
return out
)lua";
  return script;
}

}  // namespace sluice::redis_detail
