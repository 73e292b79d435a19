// access_index.h (private): (tenant id, upstream id) -> Access*, for Gateway::resolve.
//
// What it is: an open-addressing hash table built once and then only read, sized to a power
// of two at most half full, probed linearly. A slot is one cache line holding the pair's hash
// and, when both ids fit (kInlineKeys bytes together), the ids themselves, so a lookup on a
// cold tenant usually costs one cache miss and never chases a node or a key string. Ids that
// do not fit are compared through the Access (slower, still correct).
//
// Thread-safety: find() is safe from any number of threads once build() has returned.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>
#include <vector>

namespace sluice::gateway_detail {

template <typename Value, typename KeysOf>
class AccessIndex {
 public:
  static constexpr std::size_t kInlineKeys = 46;

  // `keys_of(value)` returns the value's (tenant id, upstream id); they must outlive the index.
  explicit AccessIndex(KeysOf keys_of) : keys_of_(keys_of) {}

  void build(const std::vector<Value>& values) {
    std::size_t capacity = 16;
    while (capacity < values.size() * 2) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (const Value& v : values) {
      const auto [tenant, upstream] = keys_of_(v);
      const std::uint64_t h = hash(tenant, upstream);
      std::size_t i = h & mask_;
      while (slots_[i].value != Value{}) i = (i + 1) & mask_;
      Slot& s = slots_[i];
      s.hash = h;
      s.value = v;
      if (tenant.size() + upstream.size() <= kInlineKeys) {
        s.tenant_size = static_cast<std::uint8_t>(tenant.size());
        s.upstream_size = static_cast<std::uint8_t>(upstream.size());
        std::memcpy(s.keys, tenant.data(), tenant.size());
        std::memcpy(s.keys + tenant.size(), upstream.data(), upstream.size());
      } else {
        s.tenant_size = kNotInline;
      }
    }
  }

  // The value stored for (tenant, upstream), or Value{} (null) if there is none.
  [[nodiscard]] Value find(std::string_view tenant, std::string_view upstream) const noexcept {
    if (slots_.empty()) return Value{};
    const std::uint64_t h = hash(tenant, upstream);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == Value{}) return Value{};
      if (s.hash == h && matches(s, tenant, upstream)) return s.value;
    }
  }

 private:
  static constexpr std::uint8_t kNotInline = 0xFF;

  struct alignas(64) Slot {
    std::uint64_t hash = 0;
    Value value{};
    std::uint8_t tenant_size = 0;
    std::uint8_t upstream_size = 0;
    char keys[kInlineKeys] = {};
  };
  static_assert(sizeof(Slot) == 64);

  static std::uint64_t hash(std::string_view tenant, std::string_view upstream) noexcept {
    const std::uint64_t a = std::hash<std::string_view>{}(tenant);
    const std::uint64_t b = std::hash<std::string_view>{}(upstream);
    // Mix so (x, y) and (y, x) differ and the low bits (the slot) depend on both.
    std::uint64_t z = a ^ (b + 0x9E37'79B9'7F4A'7C15ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xBF58'476D'1CE4'E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D0'49BB'1331'11EBull;
    return z ^ (z >> 31);
  }

  bool matches(const Slot& s, std::string_view tenant, std::string_view upstream) const noexcept {
    if (s.tenant_size == kNotInline) {
      const auto [t, u] = keys_of_(s.value);
      return t == tenant && u == upstream;
    }
    return std::string_view(s.keys, s.tenant_size) == tenant &&
           std::string_view(s.keys + s.tenant_size, s.upstream_size) == upstream;
  }

  KeysOf keys_of_;
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

}  // namespace sluice::gateway_detail
