// The Redis regional pool script: sluice/core/escrow.h's pool_take(), pool_refill() and
// pool_release() (P1-P3), transcribed rule for rule (src/core/escrow.cpp), on one key's pool.
//
// KEYS[1]  the key's pool hash: "w" window start, "x" expiry, "b" balance, "d" demand,
//          "r" refilling until, "h" clock_high, "e" the run_id of the server process that
//          last wrote it. No "w": no window yet (an empty pool); no "r": no refill in flight.
//          A hash another process wrote (a restart that reloaded an RDB snapshot or an AOF, a
//          replica promoted by a failover) may hold units taken since: its balance is dropped
//          (forfeited: the pool never hands out a unit twice).
// ARGV     mode ("take", "refill" or "release"), now_us (empty: Redis TIME), keep_ms, run_id
//          (the server's, read by the caller's connection when it connected), then
//          take:     want, refill_hold_us, past_expiry ("1" or "0")
//          refill:   window_start_us, units, expires_at_us
//          release:  window_start_us, units
// Returns  {granted, balance, has_window (0/1), window_start_us, expires_in_us, now_us, refill,
//          demand}
//
// Times are whole microseconds and counts at most 2^53: every number is an exact Lua double;
// they are written with %.0f (tostring would switch to exponent notation). The hash expires
// keep_ms after its expiry (the regional-only outage mode may still serve its balance until
// then), or keep_ms after the last call for a pool with no window.
#include "backends/redis/pool_script.h"

namespace sluice::redis_detail {

const std::string& pool_script() {
  static const std::string script = R"lua(
local mode = ARGV[1]
local now = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function num(x) return string.format('%.0f', x) end

local run_id = ARGV[4]
local raw = redis.call('HMGET', KEYS[1], 'w', 'x', 'b', 'r', 'h', 'd', 'e')
local w, x, b, r, h = tonumber(raw[1]), tonumber(raw[2]), tonumber(raw[3]) or 0,
                      tonumber(raw[4]), tonumber(raw[5])
local d = tonumber(raw[6]) or 0
if raw[7] ~= run_id then b = 0 end
-- A clock that steps back stands still at the latest time seen.
if h ~= nil and h > now then now = h end

local granted, refill = 0, 0
if mode == 'take' then
  local want, hold, past = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
  if past or (x ~= nil and now < x) then granted = math.min(want, b) end
  b = b - granted
  d = math.min(d + want, 9007199254740992)
  if granted < want and (r == nil or now >= r) then
    refill = 1
    r = now + math.max(1, hold)
  end
elseif mode == 'refill' then
  local win, units, exp = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  r = nil
  if units > 0 and now < exp and (w == nil or win >= w) then
    if w == nil or win > w then
      w, x, b, d = win, exp, 0, 0
    elseif exp > x then
      x = exp
    end
    b = b + units
    granted = units
  end
elseif mode == 'release' then
  local win, units = tonumber(ARGV[5]), tonumber(ARGV[6])
  if w ~= nil and win == w and now < x then
    b = b + units
    granted = units
  end
else
  return redis.error_reply('unknown mode ' .. tostring(mode))
end

redis.call('HSET', KEYS[1], 'b', num(b), 'd', num(d), 'h', num(now), 'e', run_id)
if w ~= nil then redis.call('HSET', KEYS[1], 'w', num(w), 'x', num(x)) end
if r ~= nil then redis.call('HSET', KEYS[1], 'r', num(r)) else redis.call('HDEL', KEYS[1], 'r') end
local ttl = keep
if x ~= nil and x > now then ttl = keep + math.ceil((x - now) / 1000) end
redis.call('PEXPIRE', KEYS[1], num(ttl))

if w == nil then return { granted, b, 0, 0, 0, now, refill, d } end
return { granted, b, 1, w, x - now, now, refill, d }
)lua";
  return script;
}

}  // namespace sluice::redis_detail
