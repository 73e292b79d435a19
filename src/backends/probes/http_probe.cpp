// The HTTP probe (probe.h): GET a URL, its body's first word as the number. HTTP/1.0 with
// Connection: close (so the body ends with the connection and is never chunked), every step
// bounded by the timeout; a host name is resolved per sample (getaddrinfo, which the timeout
// does not bound: give an address where resolving could stall).
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/probes/probe.h"

namespace sluice::probes {
namespace {

struct Url {
  Endpoint at;
  std::string target;  // path and query
};

// Parses http://host[:port][/path]; the error when it cannot.
std::string parse_url(const std::string& url, Url& out) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0) return "must start with http:// (https is not supported)";
  const std::string rest = url.substr(kScheme.size());
  const auto slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  out.target = slash == std::string::npos ? "/" : rest.substr(slash);
  if (authority.find('@') != std::string::npos) return "must not carry user information";
  if (std::string e = parse_endpoint(authority, 80, out.at); !e.empty()) return e;
  for (const char c : out.target)
    if (c <= ' ' || c == 0x7f) return "the path must not contain spaces or control characters";
  return {};
}

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

class HttpProbe final : public Probe {
 public:
  explicit HttpProbe(HttpProbeOptions options) : options_(std::move(options)) {
    parse_url(options_.url, url_);  // checked by http_url_error() when configured
  }

  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = url_.at.name();
    std::string error;
    double v = 0;
    if (get(v, error)) {
      s.value = v;
      s.error.clear();
    } else {
      s.error = options_.url + ": " + error;
    }
  }

 private:
  bool get(double& value, std::string& error) const {
    const SteadyTime deadline = std::chrono::steady_clock::now() + options_.timeout;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(url_.at.port);
    if (const int rc = ::getaddrinfo(url_.at.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      error = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
      return false;
    }
    const std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
    Fd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      error = std::string("socket: ") + std::strerror(errno);
      return false;
    }
    if (::connect(fd.get(), found->ai_addr, found->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        error = std::string("cannot connect: ") + std::strerror(errno);
        return false;
      }
      if (!wait_for(fd.get(), POLLOUT, deadline, error)) return false;
      int so = 0;
      socklen_t len = sizeof so;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &len);
      if (so != 0) {
        error = std::string("cannot connect: ") + std::strerror(so);
        return false;
      }
    }
    const std::string request = "GET " + url_.target + " HTTP/1.0\r\nHost: " + url_.at.name() +
                                "\r\nUser-Agent: sluice-throttler\r\nAccept: text/plain\r\n"
                                "Connection: close\r\n\r\n";
    for (std::size_t sent = 0; sent < request.size();) {
      if (!wait_for(fd.get(), POLLOUT, deadline, error)) return false;
      const ssize_t n =
          ::send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        error = std::string("send: ") + std::strerror(errno);
        return false;
      }
      sent += static_cast<std::size_t>(n);
    }
    std::string response;
    for (;;) {
      if (!wait_for(fd.get(), POLLIN, deadline, error)) return false;
      char buf[4096];
      const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n < 0) {
        error = std::string("recv: ") + std::strerror(errno);
        return false;
      }
      if (n == 0) break;
      response.append(buf, static_cast<std::size_t>(n));
      if (response.size() > kMaxResponse) {
        error = "the answer is longer than 64 KiB";
        return false;
      }
    }
    return parse_response(response, value, error);
  }

  static bool parse_response(const std::string& response, double& value, std::string& error) {
    // "HTTP/1.x NNN reason\r\n" headers "\r\n\r\n" body
    const auto space = response.find(' ');
    if (response.rfind("HTTP/1.", 0) != 0 || space == std::string::npos ||
        response.size() < space + 4) {
      error = "not an HTTP answer";
      return false;
    }
    const std::string code = response.substr(space + 1, 3);
    const auto end = response.find("\r\n\r\n");
    if (end == std::string::npos) {
      error = "the answer's headers do not end";
      return false;
    }
    if (code.front() != '2') {
      error = "answered " + code;
      return false;
    }
    std::string word;
    if (!leading_number(response.substr(end + 4), value, word)) {
      error = "the body starts with '" + word.substr(0, 64) + "', not a number";
      return false;
    }
    return true;
  }

  static constexpr std::size_t kMaxResponse = 64 * 1024;
  const HttpProbeOptions options_;
  Url url_;
};

}  // namespace

std::string http_url_error(const std::string& url) {
  Url u;
  return parse_url(url, u);
}

std::unique_ptr<Probe> http_probe(HttpProbeOptions options) {
  return std::make_unique<HttpProbe>(std::move(options));
}

}  // namespace sluice::probes
