// heartbeat_script.h (private): the Lua transcription of the heartbeat core (see the .cpp).
#pragma once

#include <string>

namespace sluice::redis_detail {

const std::string& heartbeat_script();

// leave: KEYS[1] the key's hash, ARGV node_id, instance (hex; "": any). Deletes the node's
// record unless another instance wrote it (sluice::leave). Returns 1 deleted, 0 not.
const std::string& leave_script();

}  // namespace sluice::redis_detail
