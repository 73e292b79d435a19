// grpc_listener.h: the gRPC port, accepted by sluice's own listener (listener.h).
//
// gRPC's own listener turns SO_REUSEPORT on (two servers could share a port, each enforcing its
// own limits) and, in the gRPC this project builds with, stops accepting for good after one
// failed accept (EMFILE). So the grpc::Server is built with no listening port, and this
// listener hands it each accepted connection (grpc::AddInsecureChannelFromFd), with the cap,
// the back-off and the health of listener.h. gRPC closes a connection on its own (idle,
// keepalive, a client gone); the listener learns it when the descriptor no longer names the
// socket it accepted (same number, same inode), checked at the cap and once a second.
//
// Thread-safety: bind, start and stop from one thread.
#pragma once

#include <grpcpp/server.h>

#include <boost/asio.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "transport/listener.h"

namespace sluice::transport {

class GrpcListener {
 public:
  // `name`: the listener's in metrics and messages (two listeners need two names).
  GrpcListener(server::Engine& engine, ListenerOptions options, std::string name = "grpc");
  ~GrpcListener();
  GrpcListener(const GrpcListener&) = delete;
  GrpcListener& operator=(const GrpcListener&) = delete;

  // Binds "host:port" (port 0: any free one). An error names the address and why.
  [[nodiscard]] StatusOr<int> bind(const std::string& address);
  // Serves `server` (built and started with no listening port; it must outlive stop()).
  void start(grpc::Server* server);
  // Stops accepting (connections already handed to gRPC are gRPC's to close). Idempotent.
  void stop();

  [[nodiscard]] const Listener& listener() const { return listener_; }

 private:
  struct Handed {
    int fd;
    unsigned long inode;
    Listener::Slot slot;
  };
  void reclaim(bool force);

  server::Engine& engine_;
  const std::string name_;
  boost::asio::io_context ioc_;
  Listener listener_;
  boost::asio::steady_timer sweep_;
  std::mutex mu_;
  std::vector<Handed> handed_;  // connections given to gRPC, until seen closed (guarded by mu_)
  std::chrono::steady_clock::time_point last_reclaim_{};
  std::thread thread_;
  bool attached_ = false;
};

}  // namespace sluice::transport
