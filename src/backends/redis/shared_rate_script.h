// shared_rate_script.h (private): the Lua transcription of the shared rate core (see the .cpp).
#pragma once

#include <string>

namespace sluice::redis_detail {

const std::string& shared_rate_script();

}  // namespace sluice::redis_detail
