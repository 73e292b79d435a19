// http_client.h (private): one HTTP/1.0 request over a fresh TCP connection, bounded by a
// timeout, for the throttler's URL probe and its clients (the check helper, the CLI).
//
// What it is: http:// only (no TLS), one request per connection (Connection: close, so the
// answer is never chunked and ends with the connection), the answer read whole (at most
// `max_body` bytes of body). Connecting, sending and reading are each bounded by what is left
// of the timeout; resolving a host name (getaddrinfo) is not: give an address where resolving
// could stall.
//
// Errors are values: an empty `error` means an answer came (any status); otherwise `error` says
// why none did ("cannot connect: Connection refused", "no answer within the timeout").
//
// Thread-safety: free functions; nothing shared.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"

namespace sluice::backend_detail {

struct HttpUrl {
  std::string host;  // without brackets
  int port = 80;
  std::string target = "/";  // path and query
  // "host:port" ("[v6]:port").
  [[nodiscard]] std::string authority() const;
};

// Parses http://host[:port][/path]; empty when it could, else what is wrong.
[[nodiscard]] std::string parse_http_url(const std::string& url, HttpUrl& out);

struct HttpAnswer {
  std::string error;  // empty: an answer came
  int status = 0;
  std::string body;
};

// `method` of `target` at `url`'s host (`target` empty: the URL's own), with extra header lines
// ("Authorization: Bearer x").
[[nodiscard]] HttpAnswer http_request(const HttpUrl& url, const std::string& method,
                                      const std::string& target,
                                      const std::vector<std::string>& headers, Nanos timeout,
                                      std::size_t max_body = 64 * 1024);

// Percent-encodes a query value (unreserved characters kept).
[[nodiscard]] std::string url_encode(const std::string& value);

}  // namespace sluice::backend_detail
