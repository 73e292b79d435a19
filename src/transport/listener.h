// listener.h: a listening TCP socket that survives its clients.
//
// What a listener owes the process that runs it, whatever its clients do:
// - One process per port. The socket is bound without SO_REUSEPORT, so a second server on a
//   busy port fails at start (EADDRINUSE) instead of silently splitting its clients.
// - A cap on open connections. Past `max_connections`, a new connection is shed at once: its
//   owner may say goodbye (HTTP answers 503) and it is closed. Idle and slow clients cannot
//   starve the process of file descriptors this way; `fd_budget` shows how the default cap
//   follows the process's descriptor limit.
// - Accept errors never spin and never kill it. Out of descriptors (EMFILE, ENFILE) it sheds the
//   waiting connection through a spare descriptor held for that purpose, then backs off
//   (5 ms doubling to 500 ms) and tries again; any other error backs off the same way.
// - Health that tells the truth. Accepting has failed for `failing_after` with no recovery:
//   problem() says since when and why (the server's /healthz answers 503 with it), until a
//   connection is accepted again or descriptors are free again.
//
// Thread-safety: bind/start/close from one thread; the accept loop runs on the io_context's
// threads; problem(), collect() and open() from any thread.
#pragma once

#include <utility>  // before asio: its headers use std::exchange without it

#include <atomic>
#include <boost/asio.hpp>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "server/engine.h"
#include "sluice/core/clock.h"
#include "sluice/core/status.h"

namespace sluice::transport {

struct ListenerOptions {
  std::size_t max_connections = 10000;            // open connections at most; later ones are shed
  Nanos failing_after = std::chrono::seconds(5);  // accepting failed this long: a problem
};

// The cap that leaves room in the process's descriptor limit (RLIMIT_NOFILE) for `listeners`
// listeners and the rest of the process (`reserve`): min(wanted, (limit - reserve) / listeners),
// at least 1. Raises the soft limit to the hard one first, as servers do.
[[nodiscard]] std::size_t fd_budget(std::size_t wanted, int listeners, std::size_t reserve = 64);

class Listener final : public server::ServerPart {
 public:
  // A connection's place under the cap: the connection counts as open while its slot lives.
  class Slot {
   public:
    Slot() = default;
    explicit Slot(std::shared_ptr<std::atomic<std::size_t>> open) : open_(std::move(open)) {}
    Slot(Slot&& o) noexcept = default;
    Slot& operator=(Slot&& o) noexcept {
      release();
      open_ = std::move(o.open_);
      return *this;
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { release(); }

   private:
    void release() {
      if (open_) open_->fetch_sub(1, std::memory_order_relaxed);
      open_.reset();
    }
    std::shared_ptr<std::atomic<std::size_t>> open_;
  };
  // Takes a connected socket (non-blocking, close-on-exec) and its slot; owns both from here.
  using Serve = std::function<void(int fd, Slot slot)>;
  // A shed connection's goodbye, best effort and without blocking, before it is closed.
  using Shed = std::function<void(int fd)>;
  // Asked at the cap, before shedding: drop the slots of served connections that ended where
  // the listener could not see (connections handed to another library).
  using Reclaim = std::function<void()>;

  // `what` names the listener in errors ("grpc", "http").
  Listener(boost::asio::io_context& ioc, std::string what, ListenerOptions options,
           const Clock& clock = SteadyClock::instance());
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Binds "host:port" (an IP address; port 0: any free one, when min_port is 0). Returns the
  // bound port; an error names the address and why (a port in use: "already in use").
  [[nodiscard]] StatusOr<int> bind(const std::string& address, int min_port = 0);
  // Starts accepting on the io_context.
  void start(Serve serve, Shed shed = {}, Reclaim reclaim = {});
  // Stops accepting and closes the socket; connections already served stay open. Call it where
  // the io_context is not running (or from one of its threads).
  void close();

  [[nodiscard]] std::size_t open_connections() const {
    return open_->load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t max_connections() const noexcept { return options_.max_connections; }
  // The bound socket's protocol (IPv4 or IPv6), for the sockets it accepts.
  [[nodiscard]] boost::asio::ip::tcp protocol() const;

  // server::ServerPart
  [[nodiscard]] std::string problem() const override;
  [[nodiscard]] std::vector<prometheus::MetricFamily> collect() const override;

 private:
  class Loop;
  void failed(int err);
  void recovered();

  const std::string what_;
  const ListenerOptions options_;
  const Clock& clock_;
  std::shared_ptr<Loop> loop_;
  std::shared_ptr<std::atomic<std::size_t>> open_ = std::make_shared<std::atomic<std::size_t>>(0);
  std::atomic<std::uint64_t> accepted_{0}, shed_full_{0}, shed_error_{0}, accept_errors_{0};
  std::atomic<bool> failing_{false};  // failing_since_ is set (read without the lock)
  mutable std::mutex mu_;
  std::optional<Nanos> failing_since_;  // accepting fails since then (guarded by mu_)
  std::string failing_why_;
};

}  // namespace sluice::transport
