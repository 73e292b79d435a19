// redis_options.h: how to reach a Redis coordinator (sluice/backends/redis_coordinator.h).
//
// What it is: a plain value, apart from the coordinator itself, so that a config can name a
// Redis server without pulling in the Redis backend (library sluice::redis, hiredis).
//
// One server by its address (host, port), or the primary a set of Redis Sentinels names for
// `master_name`: every (re)connect asks the sentinels in turn which address is the primary
// (SENTINEL get-master-addr-by-name; each gets an equal part, with those not asked yet, of what
// is left of connect_timeout), connects there and checks that the server says it is a
// primary (ROLE); a server that turned into a replica under an open connection (its reply
// READONLY) drops it, and the next call asks again. host and port are then not read.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "sluice/core/clock.h"

namespace sluice {

struct RedisAddress {
  std::string host;
  int port = 0;
};

struct RedisOptions {
  std::string host = "127.0.0.1";                   // default 127.0.0.1
  int port = 6379;                                  // default 6379
  std::string username;                             // ACL user; empty: AUTH with the password alone
  std::string password;                             // empty: no AUTH
  int database = 0;                                 // SELECT; default 0
  Nanos connect_timeout = std::chrono::seconds(1);  // default 1 s
  std::string key_prefix = "sluice:fleet:";         // default "sluice:fleet:"
  // Sentinels (none: the server at host:port), asked in this order, and the name they monitor
  // the primary under; sentinel_password: AUTH to the sentinels (empty: none).
  std::vector<RedisAddress> sentinels;
  std::string master_name;
  std::string sentinel_password;
};

}  // namespace sluice
