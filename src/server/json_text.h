// json_text.h: the JSON text of a document the server answers with. Bytes that are not UTF-8 (a
// request's path or body echoed in a message, a probe's error) become U+FFFD instead of the
// exception that would leave the request, a listing or a scrape without an answer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace sluice::server {

inline std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace sluice::server
