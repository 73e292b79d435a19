// check_text.h: a check's request body and its answer on the HTTP API's common path, read and
// written without a JSON document.
//
// What it is: most POST /v1/check bodies are one flat object, {"policy":"...","key":"...",
// "hits":N}, and most answers an allowed decision; building a document for each (a tree of
// nodes, a set of keys per object to find duplicates, the fields asked for) costs more than
// the check. plain_check_body() reads that shape and nothing else; whatever it does not take
// (another field, an escape, a non-ASCII byte, null, a float or a negative number, a key twice,
// bytes after the object, JSON that is not valid) goes the general way, whose errors are the
// API's. check_decision_text() writes a decision's JSON as nlohmann's dump of decision_json()
// does, byte for byte.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/calls.h"
#include "sluice/core/rate_strategy.h"

namespace sluice::transport {

// The call a body of the plain shape asks for (its views point into `body`); nullopt for any
// other body. Absent fields are as the general reader has them: empty strings, hits 1.
[[nodiscard]] std::optional<server::CheckCall> plain_check_body(std::string_view body) noexcept;

// A decision as the HTTP API answers it (its fields in the document's order).
[[nodiscard]] nlohmann::json decision_json(const RateDecision& d);

// The text of decision_json(d) with "detail" added when not empty (as json_text writes it).
[[nodiscard]] std::string check_decision_text(const RateDecision& d, const std::string& detail);

}  // namespace sluice::transport
