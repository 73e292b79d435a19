// string_map.h: a hash map keyed by std::string that is looked up by std::string_view.
//
// Heterogeneous lookup (C++20): find(std::string_view) hashes and compares the view as it is,
// without building a std::string, so a lookup on a hot path allocates nothing.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace sluice {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

}  // namespace sluice
