// servers.h: throwaway Redis and PostgreSQL servers for tests and benchmarks.
//
// What it is: each class starts a real server from Debian's binaries on 127.0.0.1, on a free
// port, in a temp directory of its own, and stops it by its pid (never by name) when destroyed.
// A detached guard process stops the server and removes its directory if the process that
// started it dies without doing so (a crash, a test runner's SIGKILL on timeout).
// start() returns an error Status (with the server's log tail) instead of throwing, so a test
// can fail with a readable message.
//
// PostgreSQL runs as the `postgres` system user when the tests run as root (initdb refuses
// root), else as the current user. Both servers run without durability (no fsync, no AOF):
// they hold test data only.
//
// Thread-safety: one owner; start/stop from one thread.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::testing {

// A free TCP port on 127.0.0.1 (bound once, then released).
int free_port();

class RedisServer {
 public:
  RedisServer() = default;
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // `password` empty: no AUTH required. `port` 0: a free one. `extra` is appended to the
  // command line (e.g. {"--save", "3600 1", "--appendonly", "yes"} for persistence).
  Status start(std::string password = {}, int port = 0, std::vector<std::string> extra = {});
  void stop();
  // SIGKILL, reaped; the directory stays, with whatever the server had written to it.
  void kill();
  // A new server process on the same port, directory and command line (after kill(): it loads
  // what the old one persisted, as a restarted Redis does).
  Status restart();
  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] const std::string& password() const noexcept { return password_; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  // The server's temp directory (its data and log).
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

 private:
  Status launch(int port);

  std::string dir_;
  std::string password_;
  std::vector<std::string> extra_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// A Redis Sentinel (redis-server in sentinel mode, on 127.0.0.1, a free port) monitoring the
// primary at 127.0.0.1:primary_port under `master_name`: the primary is down once it has not
// answered for down_after_ms, and `quorum` sentinels agreeing on that start a failover.
class RedisSentinel {
 public:
  RedisSentinel() = default;
  ~RedisSentinel();
  RedisSentinel(const RedisSentinel&) = delete;
  RedisSentinel& operator=(const RedisSentinel&) = delete;

  Status start(int primary_port, const std::string& master_name = "mymaster", int quorum = 2,
               int down_after_ms = 1000, int failover_timeout_ms = 3000);
  void stop();
  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

 private:
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

class PostgresServer {
 public:
  PostgresServer() = default;
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  Status start();
  void stop();
  [[nodiscard]] int port() const noexcept { return port_; }
  // "host=127.0.0.1 port=P user=postgres dbname=postgres"
  [[nodiscard]] std::string conninfo() const;
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  // The server's temp directory (its data and log).
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

 private:
  std::string dir_;
  std::string user_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// A throwaway etcd cluster (Debian's etcd-server) of one or more members on 127.0.0.1, each on
// free client and peer ports with a data directory of its own; stopped by pid. A member can be
// killed (SIGKILL) and started again on its data (it rejoins the cluster), and the cluster
// asked which member leads (etcdctl endpoint status).
class EtcdCluster {
 public:
  EtcdCluster() = default;
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Starts `members` members and waits until every one answers as healthy (up to 20 s).
  // election_ms: etcd's --election-timeout (heartbeat a tenth of it); default etcd's own.
  // `extra` is appended to every member's command line (e.g. {"--auth-token-ttl", "1"}).
  Status start(int members = 1, int election_ms = 1000, std::vector<std::string> extra = {});
  // Before start(): the members serve clients over TLS with `cert` and `key` (PEM files), and with
  // `client_ca` non-empty ask clients for a certificate that CA signed (--client-cert-auth);
  // `ca` is what etcdctl verifies them with (and `client_cert`/`client_key` what it shows).
  void use_tls(std::string cert, std::string key, std::string ca, std::string client_ca = {},
               std::string client_cert = {}, std::string client_key = {});
  void stop();
  void kill(int member);
  Status restart(int member);  // after kill(): the same ports and data directory
  // etcdctl snapshot save into `path` (from the first member that answers).
  Status snapshot(const std::string& path);
  // Disaster recovery as etcd's guide has it: every member stopped, its data replaced by the
  // snapshot at `path` (etcdctl snapshot restore, same names, peers and token), started again.
  Status restore(const std::string& path);
  [[nodiscard]] int size() const noexcept { return static_cast<int>(members_.size()); }
  [[nodiscard]] std::string endpoint(int member) const;  // "127.0.0.1:<client port>"
  [[nodiscard]] std::vector<std::string> endpoints() const;
  [[nodiscard]] pid_t pid(int member) const;
  // The member that leads now, as the running members report it; -1 when none says it does.
  [[nodiscard]] int leader() const;
  // Runs etcdctl (API v3) against every member with `args`; its exit code, output into `out`.
  int etcdctl(const std::vector<std::string>& args, std::string* out = nullptr) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };
  Status launch(int member, bool fresh);
  Status wait_healthy(int member, int seconds);

  std::string dir_;
  std::string initial_cluster_;
  std::string token_;
  int election_ms_ = 1000;
  std::vector<std::string> extra_;
  struct Tls {
    std::string cert, key, ca, client_ca, client_cert, client_key;
  } tls_;
  // etcdctl's arguments for the client side of tls_ (none without TLS).
  [[nodiscard]] std::vector<std::string> etcdctl_tls() const;
  std::vector<Member> members_;
};

// One server shared by a gtest suite: start() in SetUpTestSuite, stop() in TearDownTestSuite,
// and `ASSERT_TRUE(server.ok()) << server.status().to_string();` in SetUp, so that a server
// that failed to start fails every test with its log instead of crashing them.
template <class Server>
class SuiteServer {
 public:
  void start() {
    server_ = std::make_unique<Server>();
    status_ = server_->start();
  }
  void stop() { server_.reset(); }
  [[nodiscard]] bool ok() const noexcept { return server_ != nullptr && status_.ok(); }
  [[nodiscard]] const Status& status() const noexcept { return status_; }
  Server* operator->() const noexcept { return server_.get(); }

 private:
  std::unique_ptr<Server> server_;
  Status status_;
};

}  // namespace sluice::testing
