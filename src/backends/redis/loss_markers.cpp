#include "backends/redis/loss_markers.h"

namespace sluice::redis_detail {

const std::string& loss_markers_lua() {
  static const std::string lua = R"lua(
-- (A plain find, then a match anchored where it found the field: a pattern scanned over the whole
-- of INFO cost as much as INFO itself.)
local function sluice_server_marker(run_id)
  local info = redis.call('INFO', 'stats')
  local at = string.find(info, 'evicted_keys:', 1, true)
  local evicted = at and string.match(info, '^%d+', at + 13) or '?'
  return run_id .. ':' .. evicted
end
local function sluice_origin(origin_key, server_key, run_id, now)
  local server = sluice_server_marker(run_id)
  local origin = tonumber(redis.call('GET', origin_key))
  if origin == nil or redis.call('GET', server_key) ~= server then
    origin = now
    redis.call('SET', origin_key, string.format('%d', now))
    redis.call('SET', server_key, server)
  end
  return origin
end
)lua";
  return lua;
}

}  // namespace sluice::redis_detail
