#include "transport/listener.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "server/policy.h"
#include "sluice/config/config.h"
#include "sluice/core/text.h"

namespace sluice::transport {

namespace net = boost::asio;
using tcp = net::ip::tcp;

std::size_t fd_budget(std::size_t wanted, int listeners, std::size_t reserve) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return std::max<std::size_t>(wanted, 1);
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  if (lim.rlim_cur == RLIM_INFINITY) return std::max<std::size_t>(wanted, 1);
  const auto limit = static_cast<std::size_t>(lim.rlim_cur);
  const std::size_t room = limit > reserve ? (limit - reserve) / std::max(1, listeners) : 1;
  return std::max<std::size_t>(1, std::min(wanted, room));
}

// The accept loop: owned by the listener, kept alive by its pending operations.
class Listener::Loop : public std::enable_shared_from_this<Listener::Loop> {
 public:
  Loop(net::io_context& ioc, Listener& owner)
      : owner_(&owner), acceptor_(ioc), backoff_timer_(ioc) {}
  ~Loop() {
    if (spare_ >= 0) ::close(spare_);
  }

  tcp::acceptor& acceptor() { return acceptor_; }

  void start(Serve serve, Shed shed, Reclaim reclaim) {
    serve_ = std::move(serve);
    shed_ = std::move(shed);
    reclaim_ = std::move(reclaim);
    spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    wait();
  }

  void close() {
    owner_ = nullptr;
    boost::system::error_code ec;
    backoff_timer_.cancel();
    acceptor_.close(ec);
  }

 private:
  void wait() {
    acceptor_.async_wait(tcp::acceptor::wait_read,
                         [self = shared_from_this()](const boost::system::error_code& ec) {
                           if (!ec) self->drain();
                         });
  }

  void back_off() {
    backoff_ = std::min(backoff_ == Nanos{0} ? std::chrono::milliseconds(5) : backoff_ * 2,
                        Nanos{std::chrono::milliseconds(500)});
    backoff_timer_.expires_after(backoff_);
    backoff_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->drain();
    });
  }

  // Whether one more descriptor could be opened now (the process is out of them no more).
  [[nodiscard]] bool descriptors_free() {
    if (spare_ < 0) spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (spare_ < 0) return false;
    const int probe = ::fcntl(spare_, F_DUPFD_CLOEXEC, 0);
    if (probe < 0) return false;
    ::close(probe);
    return true;
  }

  // Accepts every connection waiting, then waits for more (or backs off after an error).
  void drain() {
    if (owner_ == nullptr || !acceptor_.is_open()) return;
    const int lfd = acceptor_.native_handle();
    for (int i = 0; i < 256; ++i) {  // a bounded batch: other work on this thread runs too
      const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        backoff_ = Nanos{0};
        owner_->recovered();
        owner_->accepted_.fetch_add(1, std::memory_order_relaxed);
        if (owner_->open_connections() >= owner_->options_.max_connections && reclaim_) reclaim_();
        if (owner_->open_connections() >= owner_->options_.max_connections) {
          owner_->shed_full_.fetch_add(1, std::memory_order_relaxed);
          if (shed_) shed_(fd);
          ::close(fd);
          continue;
        }
        owner_->open_->fetch_add(1, std::memory_order_relaxed);
        serve_(fd, Slot(owner_->open_));
        continue;
      }
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        if (descriptors_free()) owner_->recovered();
        return wait();
      }
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      owner_->accept_errors_.fetch_add(1, std::memory_order_relaxed);
      owner_->failed(err);
      if ((err == EMFILE || err == ENFILE) && spare_ >= 0) {
        // Out of descriptors: the waiting connection would stay in the backlog and wake us
        // again at once. Free the spare, take the connection with it and close it.
        ::close(spare_);
        spare_ = -1;
        if (const int shed = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            shed >= 0) {
          owner_->shed_error_.fetch_add(1, std::memory_order_relaxed);
          ::close(shed);
        }
        spare_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      }
      return back_off();
    }
    net::post(acceptor_.get_executor(), [self = shared_from_this()] { self->drain(); });
  }

  Listener* owner_;  // null once closed
  tcp::acceptor acceptor_;
  net::steady_timer backoff_timer_;
  Nanos backoff_{0};
  int spare_ = -1;  // a descriptor kept to shed a connection with when the process has none
  Serve serve_;
  Shed shed_;
  Reclaim reclaim_;
};

Listener::Listener(net::io_context& ioc, std::string what, ListenerOptions options,
                   const Clock& clock)
    : what_(std::move(what)),
      options_(options),
      clock_(clock),
      loop_(std::make_shared<Loop>(ioc, *this)) {}

Listener::~Listener() { close(); }

StatusOr<int> Listener::bind(const std::string& address, int min_port) {
  HostPort hp;
  if (!parse_host_port(address, hp, min_port).empty())
    return Status(StatusCode::kInvalidArgument,
                  what_ + " address: must be host:port with a port in " + std::to_string(min_port) +
                      "..65535, not '" + address + "'");
  const std::string& host = hp.host;  // "[::1]:port" gives "::1"
  const int port = hp.port;
  boost::system::error_code ec;
  const auto ip = net::ip::make_address(host, ec);
  if (ec)
    return Status(StatusCode::kInvalidArgument,
                  what_ + " address: '" + host + "' is not an IP address");
  const tcp::endpoint ep(ip, static_cast<unsigned short>(port));
  tcp::acceptor& a = loop_->acceptor();
  a.open(ep.protocol(), ec);
  // SO_REUSEADDR only (a restart may bind while old connections sit in TIME_WAIT); never
  // SO_REUSEPORT, which would let a second server share the port.
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (!ec) a.non_blocking(true, ec);
  if (ec) {
    boost::system::error_code ignored;
    a.close(ignored);
    const std::string why = ec == net::error::address_in_use
                                ? "the address is already in use (is another server running?)"
                                : ec.message();
    return Status(StatusCode::kUnavailable, what_ + ": cannot listen on " + address + ": " + why);
  }
  return static_cast<int>(a.local_endpoint().port());
}

tcp Listener::protocol() const {
  boost::system::error_code ec;
  const tcp::endpoint ep = loop_->acceptor().local_endpoint(ec);
  return !ec && ep.address().is_v6() ? tcp::v6() : tcp::v4();
}

void Listener::start(Serve serve, Shed shed, Reclaim reclaim) {
  loop_->start(std::move(serve), std::move(shed), std::move(reclaim));
}

void Listener::close() {
  if (loop_) loop_->close();
}

void Listener::failed(int err) {
  failing_.store(true, std::memory_order_relaxed);
  const std::lock_guard lock(mu_);
  if (!failing_since_) failing_since_ = clock_.now();
  failing_why_ = std::strerror(err);
}

void Listener::recovered() {
  // Every accept calls this: the lock only while there is a failure to clear.
  if (!failing_.load(std::memory_order_relaxed)) return;
  const std::lock_guard lock(mu_);
  failing_since_.reset();
  failing_.store(false, std::memory_order_relaxed);
}

std::string Listener::problem() const {
  const std::lock_guard lock(mu_);
  if (!failing_since_) return {};
  const Nanos failing = clock_.now() - *failing_since_;
  if (failing < options_.failing_after) return {};
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", std::chrono::duration<double>(failing).count());
  return std::string("cannot accept connections for ") + seconds + "s: " + failing_why_;
}

std::vector<prometheus::MetricFamily> Listener::collect() const {
  using prometheus::MetricType;
  const auto load = [](const std::atomic<std::uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  return {
      server::one("sluice_connections", "Connections open now", MetricType::Gauge,
                  static_cast<double>(open_connections())),
      server::one("sluice_connections_max", "Connections open at most (later ones are shed)",
                  MetricType::Gauge, static_cast<double>(options_.max_connections)),
      server::one("sluice_connections_accepted_total", "Connections accepted", MetricType::Counter,
                  static_cast<double>(load(accepted_))),
      server::by_label("sluice_connections_shed_total",
                       "Connections closed at once: the cap was reached (full) or the process "
                       "was out of file descriptors (descriptors)",
                       "reason", {{"full", load(shed_full_)}, {"descriptors", load(shed_error_)}}),
      server::one("sluice_accept_errors_total", "Failed accepts (each backs off)",
                  MetricType::Counter, static_cast<double>(load(accept_errors_))),
      server::one("sluice_listener_failing", "1 while accepting has failed for failing_after",
                  MetricType::Gauge, problem().empty() ? 0 : 1),
  };
}

}  // namespace sluice::transport
