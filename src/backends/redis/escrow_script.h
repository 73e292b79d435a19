// escrow_script.h (private): the Lua transcription of the escrow core (see the .cpp).
#pragma once

#include <string>

namespace sluice::redis_detail {

const std::string& escrow_script();

}  // namespace sluice::redis_detail
