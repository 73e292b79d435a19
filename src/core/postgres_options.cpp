#include "sluice/core/postgres_options.h"

#include <algorithm>

namespace sluice {

std::string table_prefix_problem(std::string_view prefix, std::size_t max_size) {
  const auto lower = [](char ch) { return (ch >= 'a' && ch <= 'z') || ch == '_'; };
  const bool ok = !prefix.empty() && prefix.size() <= max_size && lower(prefix[0]) &&
                  std::all_of(prefix.begin(), prefix.end(),
                              [&](char ch) { return lower(ch) || (ch >= '0' && ch <= '9'); });
  if (ok) return {};
  return "must match [a-z_][a-z0-9_]* (at most " + std::to_string(max_size) + " characters)";
}

}  // namespace sluice
