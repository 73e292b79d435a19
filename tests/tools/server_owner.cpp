// server_owner.cpp: starts a throwaway Redis and PostgreSQL (sluice::testing) and waits to be
// killed, for tests/integration/servers_test.cpp, which kills it with SIGKILL (no destructor runs)
// and checks that the servers' guards stop both servers and remove their directories.
//
// Prints, once both are up: "redis PID DIR" and "postgres PID DIR", one line each, then
// "ready". Exits 1 with the error on stderr when a server does not start.
#include <unistd.h>

#include <cstdio>

#include "sluice/testing/servers.h"

int main() {
  sluice::testing::RedisServer redis;
  sluice::testing::PostgresServer postgres;
  if (const sluice::Status s = redis.start(); !s.ok()) {
    std::fprintf(stderr, "redis: %s\n", s.to_string().c_str());
    return 1;
  }
  if (const sluice::Status s = postgres.start(); !s.ok()) {
    std::fprintf(stderr, "postgres: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("redis %d %s\npostgres %d %s\nready\n", static_cast<int>(redis.pid()),
              redis.dir().c_str(), static_cast<int>(postgres.pid()), postgres.dir().c_str());
  std::fflush(stdout);
  for (;;) ::pause();
}
