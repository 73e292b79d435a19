// loss_markers.h (private): the Lua every Redis script with loss markers shares (the fleet's
// heartbeat, federation's escrow, shared rate limits): how a script finds that this Redis may
// have lost writes it acknowledged.
#pragma once

#include <string>

namespace sluice::redis_detail {

// Lua defining two functions, for the start of a script:
//   sluice_server_marker(run_id)  "<run_id>:<evicted_keys>": the server as it is now (run_id as
//                                 the caller's connection read it, INFO stats' evicted_keys);
//   sluice_origin(origin_key, server_key, run_id, now)
//                                 the origin, the coordinator time of the last loss this Redis
//                                 cannot rule out: when there is no origin marker, or the
//                                 server marker names another server process or eviction count
//                                 than the last call saw, `now`, written to both markers.
const std::string& loss_markers_lua();

}  // namespace sluice::redis_detail
