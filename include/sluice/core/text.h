// text.h: UTF-8, checked and repaired. Every string the server stores from a request, keeps and
// writes back out (app names, probe errors, label values) passes one of these, so no listing,
// metric or JSON answer can fail on a stored string. And the one reader of "host:port" text
// (listen addresses, coordinators, the CLI's --server, probe hosts, URLs' authorities).
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

// A host and a port, as read from "host:port" (a name or an IPv4 address) or "[v6]:port" (an
// IPv6 address goes in brackets; `host` holds it without them).
struct HostPort {
  std::string host;
  int port = 0;
};
// Reads `text` into `out`: the port, decimal, in min_port..65535; required when `default_port`
// is negative, else optional (default_port when absent). Returns "" when it can, else why not,
// quoting the text: "'x': an IPv6 address goes in brackets", "'x': no host", "'x': an unclosed
// '['", "'x': expected ':' after ']'", "'x': the port must be 1..65535". `out` is unchanged on
// an error.
[[nodiscard]] std::string parse_host_port(std::string_view text, HostPort& out, int min_port = 1,
                                          int default_port = -1);

}  // namespace sluice
