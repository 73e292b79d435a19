// servers.h: throwaway Redis and PostgreSQL servers for tests and benchmarks.
//
// What it is: each class starts a real server from Debian's binaries on 127.0.0.1, on a free
// port, in a temp directory of its own, and stops it by its pid (never by name) when destroyed.
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

#include <string>

#include "sluice/status.h"

namespace sluice::testing {

// A free TCP port on 127.0.0.1 (bound once, then released).
int free_port();

class RedisServer {
 public:
  RedisServer() = default;
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // `password` empty: no AUTH required.
  Status start(std::string password = {});
  void stop();
  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] const std::string& password() const noexcept { return password_; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

 private:
  std::string dir_;
  std::string password_;
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

 private:
  std::string dir_;
  std::string user_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace sluice::testing
