// pool_script.h (private): the Lua transcription of the regional pool's rules (see the .cpp).
#pragma once

#include <string>

namespace sluice::redis_detail {

const std::string& pool_script();

}  // namespace sluice::redis_detail
