// string_map.h: a hash map keyed by std::string that is looked up by std::string_view.
//
// Heterogeneous lookup (C++20): find(std::string_view) hashes and compares the view as it is,
// without building a std::string, so a lookup on a hot path allocates nothing; find(HashedKey)
// takes a hash computed before.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace sluice {

// A key with its StringHash already computed: a caller that hashed the key once (to pick a
// shard) looks it up without hashing it again.
struct HashedKey {
  std::string_view key;
  std::size_t hash;
  friend bool operator==(const HashedKey& a, std::string_view b) noexcept { return a.key == b; }
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
  std::size_t operator()(const HashedKey& k) const noexcept { return k.hash; }
};

template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

}  // namespace sluice
