#include "sluice/core/text.h"

#include <charconv>
#include <cstdint>
#include <system_error>

namespace sluice {

namespace {

// The length of the well-formed character at text[i], or 0 when none begins there.
std::size_t char_at(std::string_view text, std::size_t i) noexcept {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) return 1;
  const std::size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  std::uint32_t cp = c & (0x7fu >> n);
  for (std::size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(text[i + k]);
    if ((d >> 6) != 0x2) return 0;
    cp = (cp << 6) | (d & 0x3fu);
  }
  constexpr std::uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kLeast[n] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return 0;
  return n;
}

}  // namespace

std::size_t first_non_utf8(std::string_view text) noexcept {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = char_at(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_or_replaced(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = char_at(text, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

namespace {

// "'<text>': <reason>", built by appending (g++ 12 at -O3 warns, wrongly, of overlapping copies
// in the operator+ chain that would say the same).
std::string refusal(std::string_view text, std::string_view reason) {
  std::string out;
  out.reserve(text.size() + reason.size() + 4);
  out.push_back('\'');
  out.append(text);
  out.append("': ");
  out.append(reason);
  return out;
}

}  // namespace

std::string parse_host_port(std::string_view text, HostPort& out, int min_port, int default_port) {
  std::string_view host = text;
  std::string_view port;
  bool has_port = false;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return refusal(text, "an unclosed '['");
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return refusal(text, "expected ':' after ']'");
      port = rest.substr(1);
      has_port = true;
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    if (text.find(':') != colon) return refusal(text, "an IPv6 address goes in brackets");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    has_port = true;
  }
  if (host.empty()) return refusal(text, "no host");
  int number = default_port;
  if (has_port || default_port < 0) {
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
    if (port.empty() || ec != std::errc{} || end != port.data() + port.size() ||
        number < min_port || number > 65535) {
      std::string range = "the port must be ";
      range.append(std::to_string(min_port));
      range.append("..65535");
      return refusal(text, range);
    }
  }
  out.host.assign(host);
  out.port = number;
  return {};
}

}  // namespace sluice
