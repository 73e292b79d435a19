// text.h: UTF-8, checked and repaired. Every string the server stores from a request, keeps and
// writes back out (app names, probe errors, label values) passes one of these, so no listing,
// metric or JSON answer can fail on a stored string.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sluice {

// The offset of the first byte of `text` that does not begin a well-formed UTF-8 character
// (overlong forms, surrogates and code points past U+10FFFF are not well-formed); npos when
// there is none.
[[nodiscard]] std::size_t first_non_utf8(std::string_view text) noexcept;

[[nodiscard]] inline bool is_utf8(std::string_view text) noexcept {
  return first_non_utf8(text) == std::string_view::npos;
}

// `text` with each byte that does not begin a well-formed character replaced by U+FFFD.
[[nodiscard]] std::string utf8_or_replaced(std::string_view text);

}  // namespace sluice
