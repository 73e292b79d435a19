// The listener survives its clients (transport/listener.h): one process per port, a cap on open
// connections, no spin and no death when the process runs out of file descriptors, and health
// that says so while it lasts.
#include "transport/listener.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "transport/http_server.h"

namespace sluice::transport {
namespace {

using namespace std::chrono_literals;

// A listener on 127.0.0.1 with its io_context running on a thread of its own.
class Running {
 public:
  Running(ListenerOptions o, const Clock& clock, Listener::Serve serve, Listener::Shed shed = {})
      : listener_(ioc_, "test", o, clock) {
    auto p = listener_.bind("127.0.0.1:0");
    EXPECT_TRUE(p.ok()) << p.status().message();
    port_ = p.ok() ? p.value() : 0;
    listener_.start(std::move(serve), std::move(shed));
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~Running() {
    ioc_.stop();
    thread_.join();
    listener_.close();
  }
  Listener& listener() { return listener_; }
  int port() const { return port_; }

 private:
  boost::asio::io_context ioc_;
  Listener listener_;
  int port_ = 0;
  std::thread thread_;
};

// Connects the client socket `fd` to the listener on `port`.
bool connect_fd(int fd, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
}

// GET /healthz of a server whose engine has `part` attached: its status and body.
std::pair<unsigned, std::string> healthz(server::Engine& engine) {
  HttpExchange x;
  x.method = "GET";
  x.target = "/healthz";
  x.peer = "127.0.0.1:1";
  handle_http(engine, nullptr, x);
  return {x.status, x.response};
}

// A connected client socket (-1: the process had no descriptor for it).
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (!connect_fd(fd, port)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd`'s connection within `within` (a read sees EOF or a reset).
bool closed_by_server(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) <= 0) return false;
  char buf[512];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN;
  }
}

template <class F>
bool eventually(F f, std::chrono::milliseconds within = 5000ms) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return f();
}

// Connections served and held open by the test (their descriptors and slots).
struct Held {
  std::mutex mu;
  std::vector<std::pair<int, Listener::Slot>> conns;
  std::atomic<int> served{0};
  Listener::Serve serve() {
    return [this](int fd, Listener::Slot slot) {
      const std::lock_guard lock(mu);
      conns.emplace_back(fd, std::move(slot));
      served.fetch_add(1);
    };
  }
  void drop_one() {
    const std::lock_guard lock(mu);
    ASSERT_FALSE(conns.empty());
    ::close(conns.back().first);
    conns.pop_back();  // its slot goes with it
  }
  ~Held() {
    for (auto& c : conns) ::close(c.first);
  }
};

TEST(Listener, ASecondListenerOnABusyPortFailsNamingIt) {
  boost::asio::io_context ioc;
  Listener a(ioc, "grpc", {});
  auto port = a.bind("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status().message();
  Listener b(ioc, "grpc", {});
  const std::string address = "127.0.0.1:" + std::to_string(port.value());
  auto second = b.bind(address);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(),
            "grpc: cannot listen on " + address +
                ": the address is already in use (is another server running?)");
}

TEST(Listener, RefusesAnOutOfRangePortAndANameThatIsNotAnAddress) {
  boost::asio::io_context ioc;
  Listener l(ioc, "grpc", {});
  auto r = l.bind("0.0.0.0:99999");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "grpc address: must be host:port with a port in 0..65535, not '0.0.0.0:99999'");
  r = l.bind("localhost:80");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "grpc address: 'localhost' is not an IP address");
}

TEST(Listener, BindsAnIPv6AddressInBrackets) {
  boost::asio::io_context ioc;
  Listener l(ioc, "http", {});
  auto r = l.bind("[::1]:0");
  if (!r.ok() && r.status().message().find("Cannot assign") != std::string::npos)
    GTEST_SKIP() << "no IPv6 loopback here";
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GT(r.value(), 0);
}

TEST(Listener, ShedsConnectionsPastItsCapUntilOneCloses) {
  ListenerOptions o;
  o.max_connections = 2;
  Held held;
  std::atomic<int> shed{0};
  Running run(o, SteadyClock::instance(), held.serve(), [&](int fd) {
    shed.fetch_add(1);
    (void)::send(fd, "full", 4, MSG_NOSIGNAL);
  });
  const int c1 = connect_to(run.port());
  const int c2 = connect_to(run.port());
  ASSERT_TRUE(eventually([&] { return held.served.load() == 2; }));
  EXPECT_EQ(run.listener().open_connections(), 2u);
  const int c3 = connect_to(run.port());
  ASSERT_TRUE(eventually([&] { return shed.load() == 1; }));
  char buf[8] = {};
  EXPECT_EQ(::recv(c3, buf, sizeof buf, MSG_WAITALL), 4);
  EXPECT_EQ(std::string(buf, 4), "full");  // told why, then closed
  EXPECT_TRUE(closed_by_server(c3, 2000ms));
  held.drop_one();  // one connection ends: its slot is free again
  EXPECT_EQ(run.listener().open_connections(), 1u);
  const int c4 = connect_to(run.port());
  EXPECT_TRUE(eventually([&] { return held.served.load() == 3; }));
  EXPECT_EQ(shed.load(), 1);
  for (int fd : {c1, c2, c3, c4}) ::close(fd);
}

int open_descriptors() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

TEST(Listener, OutOfDescriptorsItShedsBacksOffReportsAndRecovers) {
  ManualClock clock;
  ListenerOptions o;
  o.failing_after = 1s;
  Held held;
  auto served_then_closed = [&](int fd, Listener::Slot) {
    ::close(fd);
    held.served.fetch_add(1);
  };
  Running run(o, clock, served_then_closed);
  // The server's engine, with this listener attached as the HTTP port: /healthz tells its
  // problem.
  const server::PolicyRegistry kinds = server::PolicyRegistry::builtin();
  ConfigLoad load = load_config("policies:\n  r: {kind: rate, limit: 5, period: 1s}\n", kinds);
  ASSERT_TRUE(load.config.has_value());
  auto engine = server::Engine::create(*load.config, clock, kinds);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  engine.value()->attach("http listener", &run.listener());
  EXPECT_EQ(healthz(*engine.value()), (std::pair<unsigned, std::string>{200, "ok\n"}));
  // A low descriptor limit for this process (its own test process), restored at the end.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(open_descriptors() + 32);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> filler;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
  ASSERT_EQ(errno, EMFILE);
  // Three descriptors for three clients; none is left for the listener to accept with. The
  // sockets are all made before the first connects: shedding a connection frees the listener's
  // spare descriptor and takes it again, which a socket made meanwhile could take instead.
  std::vector<int> clients;
  for (int i = 0; i < 3; ++i) {
    ::close(filler.back());
    filler.pop_back();
    clients.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_GE(clients.back(), 0);
  }
  for (int fd : clients) ASSERT_TRUE(connect_fd(fd, run.port()));
  // Each waiting connection is shed through the spare descriptor: none stays stuck.
  for (int fd : clients) EXPECT_TRUE(closed_by_server(fd, 3000ms));
  EXPECT_EQ(held.served.load(), 0);
  // It backs off instead of spinning: a few failed accepts, not thousands.
  std::this_thread::sleep_for(300ms);
  const auto text = [&] {
    std::string out;
    for (const auto& f : run.listener().collect())
      for (const auto& m : f.metric) {
        out += f.name;
        for (const auto& l : m.label) out += "{" + l.name + "=" + l.value + "}";
        out += " " + std::to_string(static_cast<long long>(m.counter.value + m.gauge.value)) + "\n";
      }
    return out;
  };
  const std::string metrics = text();
  EXPECT_NE(metrics.find("sluice_connections_shed_total{reason=descriptors} 3"), std::string::npos)
      << metrics;
  const std::size_t at = metrics.find("sluice_accept_errors_total ");
  ASSERT_NE(at, std::string::npos) << metrics;
  const long errors = std::stol(metrics.substr(at + 27));
  EXPECT_GE(errors, 3);
  EXPECT_LE(errors, 20) << "accept is retried without backing off";
  // Health: a problem only once it has lasted failing_after.
  EXPECT_EQ(run.listener().problem(), "");
  EXPECT_EQ(healthz(*engine.value()).first, 200u);
  clock.advance(2s);
  EXPECT_EQ(run.listener().problem(), "cannot accept connections for 2.0s: Too many open files");
  EXPECT_EQ(healthz(*engine.value()),
            (std::pair<unsigned, std::string>{
                503, "http listener: cannot accept connections for 2.0s: Too many open files\n"}));
  // Descriptors come back: the next client is served and the problem is gone.
  for (int fd : filler) ::close(fd);
  for (int fd : clients) ::close(fd);
  const int again = connect_to(run.port());
  ASSERT_GE(again, 0);
  EXPECT_TRUE(eventually([&] { return held.served.load() == 1; }));
  EXPECT_EQ(run.listener().problem(), "");
  EXPECT_EQ(healthz(*engine.value()).first, 200u);
  engine.value()->detach(&run.listener());
  ::close(again);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace sluice::transport
