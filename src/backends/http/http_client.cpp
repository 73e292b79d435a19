// http_client.h: one HTTP/1.0 request over a fresh connection, bounded by a timeout.
#include "backends/http/http_client.h"
#include "sluice/core/text.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace sluice::backend_detail {
namespace {

class Fd {
 public:
  explicit Fd(int fd) noexcept : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_;
};

using SteadyTime = std::chrono::steady_clock::time_point;

// Waits for `events` on `fd` until `deadline`; false on timeout or error (`error` says which).
bool wait_for(int fd, short events, SteadyTime deadline, std::string& error) {
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      error = "no answer within the timeout";
      return false;
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) {
      error = std::string("poll: ") + std::strerror(errno);
      return false;
    }
  }
}

// A connected non-blocking socket to `url`'s host, or -1 with `error`.
int connect_to(const HttpUrl& url, SteadyTime deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(url.port);
  if (const int rc = ::getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    error = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
    return -1;
  }
  const std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  Fd guard(fd);
  if (::connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      error = std::string("cannot connect: ") + std::strerror(errno);
      return -1;
    }
    if (!wait_for(fd, POLLOUT, deadline, error)) return -1;
    int so = 0;
    socklen_t len = sizeof so;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
    if (so != 0) {
      error = std::string("cannot connect: ") + std::strerror(so);
      return -1;
    }
  }
  return ::dup(fd);  // the guard closes its own
}

}  // namespace

std::string HttpUrl::authority() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string parse_http_url(const std::string& url, HttpUrl& out) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0) return "must start with http:// (https is not supported)";
  const std::string rest = url.substr(kScheme.size());
  const auto slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  if (authority.find('@') != std::string::npos) return "must not carry user information";
  HostPort hp;
  if (std::string e = parse_host_port(authority, hp, 1, 80); !e.empty()) return e;
  out.host = std::move(hp.host);
  out.port = hp.port;
  out.target = slash == std::string::npos ? "/" : rest.substr(slash);
  for (const char c : out.target)
    if (c <= ' ' || c == 0x7f) return "the path must not contain spaces or control characters";
  return {};
}

HttpAnswer http_request(const HttpUrl& url, const std::string& method, const std::string& target,
                        const std::vector<std::string>& headers, Nanos timeout,
                        std::size_t max_body) {
  HttpAnswer out;
  const SteadyTime deadline = std::chrono::steady_clock::now() + timeout;
  Fd fd(connect_to(url, deadline, out.error));
  if (fd.get() < 0) return out;
  std::string request = method + " " + (target.empty() ? url.target : target) +
                        " HTTP/1.0\r\nHost: " + url.authority() +
                        "\r\nUser-Agent: sluice\r\nConnection: close\r\n";
  for (const std::string& h : headers) request += h + "\r\n";
  request += "\r\n";
  for (std::size_t sent = 0; sent < request.size();) {
    if (!wait_for(fd.get(), POLLOUT, deadline, out.error)) return out;
    const ssize_t n = ::send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      out.error = std::string("send: ") + std::strerror(errno);
      return out;
    }
    sent += static_cast<std::size_t>(n);
  }
  std::string response;
  for (;;) {
    if (!wait_for(fd.get(), POLLIN, deadline, out.error)) return out;
    char buf[4096];
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) {
      out.error = std::string("recv: ") + std::strerror(errno);
      return out;
    }
    if (n == 0) break;
    response.append(buf, static_cast<std::size_t>(n));
    if (response.size() > max_body + 16 * 1024) {
      out.error = "the answer is longer than " + std::to_string(max_body) + " bytes";
      return out;
    }
  }
  // "HTTP/1.x NNN reason\r\n" headers "\r\n\r\n" body
  const auto end = response.find("\r\n\r\n");
  int status = 0;
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12 || end == std::string::npos ||
      std::from_chars(response.data() + 9, response.data() + 12, status).ec != std::errc{} ||
      status < 100 || status > 599) {
    out.error = "not an HTTP answer";
    return out;
  }
  out.status = status;
  out.body = response.substr(end + 4);
  return out;
}

std::string url_encode(const std::string& value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) != 0 || c == '-' || c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

}  // namespace sluice::backend_detail
