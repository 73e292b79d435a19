// The MySQL/MariaDB probe's timeout bounds a host's whole sample, below a second too: a server
// that takes the connection and never answers (a hung or SIGSTOPped MariaDB: the kernel accepts
// for it) fails the sample at the timeout, where libmariadb's blocking timeouts, whole seconds
// per phase, took a second or more for 250 ms. The real-server version (a MariaDB SIGSTOPped
// under an open connection) is in tests/throttler_db. A timing test by nature: its bound is
// 1.5 x the timeout, against the second and more it took before.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "backends/probes/probe.h"
#include "sluice/core/clock.h"

namespace sluice::probes {
namespace {

using std::chrono::milliseconds;

// A loopback port that accepts connections (the kernel's backlog) and never says a word.
class SilentListener {
 public:
  SilentListener() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
  }
  ~SilentListener() {
    if (fd_ >= 0) close(fd_);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  [[nodiscard]] int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

TEST(MysqlProbe, AServerThatNeverAnswersFailsTheSampleAtTheTimeout) {
  const SilentListener server;
  ASSERT_NE(server.port(), 0);
  MysqlProbeOptions o;
  o.measure = MysqlMeasure::kThreadsRunning;
  o.hosts = {Endpoint{"127.0.0.1", server.port()}, Endpoint{"127.0.0.1", server.port()}};
  o.user = "throttler";
  o.timeout = milliseconds(250);
  const std::unique_ptr<Probe> probe = mysql_probe(o);
  for (int round = 0; round < 2; ++round) {  // the second reconnects after the failure
    std::vector<ThrottleSample> hosts;
    const Nanos start = SteadyClock::instance().now();
    probe->sample(hosts);
    const Nanos took = SteadyClock::instance().now() - start;
    ASSERT_EQ(hosts.size(), 2u);
    for (const ThrottleSample& h : hosts)
      EXPECT_EQ(h.error, "cannot connect: no answer within 250 ms (the timeout)");
    // Each host in turn, each within its own timeout: 2 x 250 ms, at most 1.5 x that.
    EXPECT_GE(took, milliseconds(500)) << round;
    EXPECT_LT(took, milliseconds(750)) << round;
  }
}

}  // namespace
}  // namespace sluice::probes
