// The Redis shared rate script: sluice/core/shared_rate.h's apply() (and through it the three
// strategies of src/core/rate_strategy.cpp), transcribed rule for rule, for n calls in one script
// call.
//
// KEYS[1..n]  each call's state: one string, "<strategy> <limit> <written_us> <a> <b> [<c>]"
//             (strategy f, s or g; `limit` the rule's when written; `written_us` the coordinator
//             time of that write), with fixed window: a window start, b count; sliding window:
//             a window start, b current, c previous; GCRA: the theoretical arrival time times
//             the limit, tat * limit = a * limit + b in microseconds (0 <= b < limit). No key:
//             never written (or idle long enough to have expired).
// KEYS[n+1]   the origin marker, KEYS[n+2] the server marker: as in escrow_script.cpp (a time
//             at which this Redis was found to have lost writes it may have acknowledged, and
//             "<run_id>:<evicted_keys>" as the last call saw them). No origin marker, another
//             run_id or another eviction count: the origin is now.
// ARGV        now_us (empty: Redis TIME), run_id (the caller's connection's), n, then per call
//             op (c check, p peek, r refund, h charge), strategy (f, s, g), limit, period_us,
//             burst (GCRA; the limit when 0), hits (clamped by the caller: see below), ttl_ms.
// Returns     per call 15 integers: allowed, limit, remaining, reset_after (whole us, then ns
//             0..999), retry_after (the same; -1 -1: never), now_us, then the charge's limit,
//             remaining, overdraft, reset_after (us, ns), retry_after (us, ns) (zeros for other
//             ops).
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

namespace sluice::redis_detail {

const std::string& shared_rate_script() {
  static const std::string script = R"lua(
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local run_id = ARGV[2]
local n = tonumber(ARGV[3])
local floor, max, min = math.floor, math.max, math.min
local format, match = string.format, string.match
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

-- Durations: {us, ns} = us * 1000 + ns ns, 0 <= ns < 1000.
local ZERO, NEVER = { 0, 0 }, { -1, -1 }
local function us(x) return { x, 0 } end
local function norm(a, b)
  local c = floor_div(b, 1000)
  return { a + c, b - c * 1000 }
end
local function lt(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end
local function sub(x, y) return norm(x[1] - y[1], x[2] - y[2]) end
local function add(x, y) return norm(x[1] + y[1], x[2] + y[2]) end
-- floor(1000 * x / d) ns for x, d > 0 integers (1000 * (x mod d) below 2^53).
local function floor1000(x, d)
  local q = floor_div(x, d)
  local r = x - q * d
  return norm(q, floor_div(1000 * r, d))
end
-- ceil(1000 * x / d) ns.
local function ceil1000(x, d)
  local q = floor_div(x, d)
  local r = x - q * d
  return norm(q, floor_div(1000 * r + d - 1, d))
end

-- The origin: as in escrow_script.cpp.
local function origin_of(origin_key, server_key)
  local info = rcall('INFO', 'stats')
  local at = string.find(info, 'evicted_keys:', 1, true)
  local evicted = at and match(info, '^%d+', at + 13) or '?'
  local server = run_id .. ':' .. evicted
  local origin = tonumber(rcall('GET', origin_key))
  if origin == nil or rcall('GET', server_key) ~= server then
    origin = now
    rcall('SET', origin_key, format('%d', now))
    rcall('SET', server_key, server)
  end
  return origin
end

-- The rule of the call in hand, and its state.
local L, p, B, st

local function fits(count, h) return count <= L and h <= L - count end

-- Each decide returns allowed, limit, remaining, reset, retry (and commits when asked).
local function fixed(h, commit)
  local start = window_of(now, p)
  local count = 0
  if st.a == start then count = st.b end
  local wend = us(p - (now - start))
  if not fits(count, h) then
    local retry = wend
    if h > L then retry = NEVER end
    return 0, L, (count < L) and (L - count) or 0, (count > 0) and wend or ZERO, retry
  end
  count = count + h
  if commit and h > 0 then st.a, st.b, st.dirty = start, count, true end
  return 1, L, L - count, (count > 0) and wend or ZERO, ZERO
end

local function slide(h, commit)
  local start = window_of(now, p)
  local cur, prev = 0, 0
  if st.a == start then cur, prev = st.b, st.c
  elseif st.a == start - p then prev = st.b end
  local e = now - start
  local wprev = prev * (p - e)
  local cap = L * p
  local allowed = h <= L and wprev + (cur + h) * p <= cap
  local after = cur
  if allowed then after = cur + h end
  local used = wprev + after * p
  local remaining = 0
  if used < cap then remaining = floor_div(cap - used, p) end
  local reset = ZERO
  if after > 0 then reset = us(2 * p - e) elseif prev > 0 then reset = us(p - e) end
  if allowed then
    if commit and h > 0 then st.a, st.b, st.c, st.dirty = start, after, prev, true end
    return 1, L, remaining, reset, ZERO
  end
  if h > L then return 0, L, remaining, reset, NEVER end
  local retry
  if fits(cur, h) then
    local w = floor1000((L - cur - h) * p, prev)
    if lt(us(p), w) then w = us(p) end
    retry = sub(sub(us(p), w), us(e))
  else
    local x = floor1000((L - h) * p, cur)
    if lt(us(p), x) then x = us(p) end
    retry = sub(add(us(p), sub(us(p), x)), us(e))
  end
  if lt(retry, { 0, 1 }) then retry = { 0, 1 } end
  return 0, L, remaining, reset, retry
end

-- GCRA: the debt now, in us * limit (tat * limit - now * limit, at least 0).
local function debt()
  if st.a == nil or st.a < now then return 0 end
  return (st.a - now) * L + st.b
end
local function set_tat(after)
  local q = floor_div(after, L)
  st.a, st.b, st.dirty = now + q, after - q * L, true
end
local function gcra(h, commit)
  local d = debt()
  local tol = B * p
  local function left(x)
    if x >= tol then return 0 end
    return floor_div(tol - x, p)
  end
  local function till(x, to)
    if x <= to then return ZERO end
    return ceil1000(x - to, L)
  end
  if h > B then return 0, B, left(d), till(d, 0), NEVER end
  local after = d + h * p
  if after > tol then return 0, B, left(d), till(d, 0), till(after, tol) end
  if commit and h > 0 then set_tat(after) end
  return 1, B, left(after), till(after, 0), ZERO
end

local decide
local function allowance()
  local a, lim, rem, reset = decide(0, false)
  local b, _, _, _, retry = decide(1, false)
  if a == 0 then rem = 0 end
  if b == 1 then retry = ZERO end
  return lim, rem, reset, retry
end

-- Raises a state written before the origin (sluice/core/shared_rate.h).
local function raise(origin, kind)
  local ws = window_of(origin, p)
  if kind == 'f' then
    if st.a == ws then st.b = max(st.b, L)
    elseif st.a == nil or st.a < ws then st.a, st.b = ws, L end
  elseif kind == 's' then
    if st.a == ws then st.b, st.c = max(st.b, L), max(st.c, L)
    elseif st.a == ws - p then st.a, st.b, st.c = ws, L, max(st.b, L)
    elseif st.a == nil or st.a < ws then st.a, st.b, st.c = ws, L, L end
  else
    local tol = B * p
    local q = floor_div(tol, L)
    local a, b = origin + q, tol - q * L
    if st.a == nil or st.a < a or (st.a == a and st.b < b) then st.a, st.b = a, b end
  end
end

local function call(key, origin, op, kind, lim, period, burst, hits, ttl, out, at)
  L, p = tonumber(lim), tonumber(period)
  B = tonumber(burst)
  if B == 0 then B = L end
  local h = tonumber(hits)
  st = { dirty = false }
  local raw = rcall('GET', key)
  local written = nil
  if raw then
    local k, sl, sw, sa, sb, sc = match(raw, '^(%a) (%d+) (%-?%d+) (%-?%d+) (%d+) ?(%d*)$')
    if k ~= kind then return error('sluice: unreadable shared rate state at ' .. key) end
    written = tonumber(sw)
    st.a, st.b, st.c = tonumber(sa), tonumber(sb), tonumber(sc) or 0
    local old = tonumber(sl)
    if old ~= L then
      -- Carried: a window's counts mean the same; a GCRA debt (in hits * period) is kept.
      if kind == 'g' then
        local d = 0
        if st.a >= now then d = (st.a - now) * old + st.b end
        set_tat(d)
      end
      st.dirty = true
    end
  end
  if written == nil or written <= origin then raise(origin, kind) end
  if kind == 'f' then decide = fixed elseif kind == 's' then decide = slide else decide = gcra end
  local allowed, dl, drem, dreset, dretry = 0, 0, 0, ZERO, ZERO
  local cl, crem, cover, creset, cretry = 0, 0, 0, ZERO, ZERO
  if op == 'c' or op == 'p' then
    allowed, dl, drem, dreset, dretry = decide(h, op == 'c')
  elseif op == 'r' then
    if h == 0 then
      -- nothing to give back
    elseif kind == 'f' or kind == 's' then
      if st.a == window_of(now, p) then st.b, st.dirty = st.b - min(h, st.b), true end
    elseif st.a ~= nil then
      local v = st.b - h * p
      local q = floor_div(v, L)
      st.a, st.b, st.dirty = st.a + q, v - q * L, true
    end
    allowed, dl, drem, dreset, dretry = decide(0, false)
  else
    if kind == 'f' then
      local start = window_of(now, p)
      local count = 0
      if st.a == start then count = st.b end
      count = min(count + h, P52)
      if h > 0 then st.a, st.b, st.dirty = start, count, true end
      if count > L then cover = count - L end
    elseif kind == 's' then
      local start = window_of(now, p)
      local cur, prev = 0, 0
      if st.a == start then cur, prev = st.b, st.c
      elseif st.a == start - p then prev = st.b end
      cur = min(cur + h, min(P43, floor_div(P51, p)))
      if h > 0 then st.a, st.b, st.c, st.dirty = start, cur, prev, true end
      local used = prev * (p - (now - start)) + cur * p
      local cap = L * p
      if used > cap then cover = floor_div(used - cap + p - 1, p) end
    else
      local after = min(debt() + h * p, P51)
      if h > 0 then set_tat(after) end
      local tol = B * p
      if after > tol then cover = floor_div(after - tol + p - 1, p) end
    end
    cl, crem, creset, cretry = allowance()
    allowed, dl, drem, dreset, dretry = decide(0, false)
  end
  if st.dirty then
    local text
    if kind == 'g' then
      text = format('g %d %d %d %d', L, now, st.a, st.b)
    elseif kind == 's' then
      text = format('s %d %d %d %d %d', L, now, st.a, st.b, st.c)
    else
      text = format('f %d %d %d %d', L, now, st.a, st.b)
    end
    rcall('SET', key, text, 'PX', ttl)
  end
  local r = { allowed, dl, drem, dreset[1], dreset[2], dretry[1], dretry[2], now,
              cl, crem, cover, creset[1], creset[2], cretry[1], cretry[2] }
  for i = 1, 15 do out[at + i] = r[i] end
  return at + 15
end

local origin = origin_of(KEYS[n + 1], KEYS[n + 2])
local out = {}
local at = 0
for i = 1, n do
  local j = 3 + (i - 1) * 7
  at = call(KEYS[i], origin, ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4], ARGV[j + 5],
            ARGV[j + 6], ARGV[j + 7], out, at)
end
return out
)lua";
  return script;
}

}  // namespace sluice::redis_detail
