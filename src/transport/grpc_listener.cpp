#include "transport/grpc_listener.h"

#include <grpcpp/server_posix.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sluice::transport {

namespace {

// The inode of the socket `fd` names now (0: none).
unsigned long socket_inode(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return static_cast<unsigned long>(st.st_ino);
}

}  // namespace

GrpcListener::GrpcListener(server::Engine& engine, ListenerOptions options, std::string name)
    : engine_(engine), name_(std::move(name)), listener_(ioc_, name_, options), sweep_(ioc_) {}

GrpcListener::~GrpcListener() { stop(); }

StatusOr<int> GrpcListener::bind(const std::string& address) {
  return listener_.bind(address, /*min_port=*/0);
}

void GrpcListener::start(grpc::Server* server) {
  listener_.start(
      [this, server](int fd, Listener::Slot slot) {
        const int one = 1;
        (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        const unsigned long inode = socket_inode(fd);
        {
          const std::lock_guard lock(mu_);
          handed_.push_back({fd, inode, std::move(slot)});
        }
        grpc::AddInsecureChannelFromFd(server, fd);
      },
      /*shed=*/{}, [this] { reclaim(/*force=*/false); });
  engine_.attach(name_, &listener_);
  attached_ = true;
  // Once a second, forget the connections gRPC closed, so the count (and /metrics) stays true.
  struct Sweep {
    GrpcListener* self;
    void operator()(const boost::system::error_code& ec) const {
      if (ec) return;
      self->reclaim(/*force=*/true);
      self->sweep_.expires_after(std::chrono::seconds(1));
      self->sweep_.async_wait(*this);
    }
  };
  sweep_.expires_after(std::chrono::seconds(1));
  sweep_.async_wait(Sweep{this});
  thread_ = std::thread([this] { ioc_.run(); });
}

void GrpcListener::reclaim(bool force) {
  const auto now = std::chrono::steady_clock::now();
  const std::lock_guard lock(mu_);
  // At the cap this runs on every accept: at most every 100 ms, as each pass costs one fstat
  // per connection.
  if (!force && now - last_reclaim_ < std::chrono::milliseconds(100)) return;
  last_reclaim_ = now;
  std::erase_if(handed_, [](const Handed& h) { return socket_inode(h.fd) != h.inode; });
}

void GrpcListener::stop() {
  if (thread_.joinable()) {
    ioc_.stop();
    thread_.join();
  }
  if (attached_) {
    engine_.detach(&listener_);
    attached_ = false;
  }
  listener_.close();
  const std::lock_guard lock(mu_);
  handed_.clear();
}

}  // namespace sluice::transport
