// heartbeat_script.h (private): the Lua transcription of the heartbeat core (see the .cpp).
#pragma once

#include <string>

namespace sluice::redis_detail {

const std::string& heartbeat_script();

}  // namespace sluice::redis_detail
