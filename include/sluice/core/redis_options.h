// redis_options.h: how to reach a Redis coordinator (sluice/backends/redis_coordinator.h).
//
// What it is: a plain value, apart from the coordinator itself, so that a config can name a
// Redis server without pulling in the Redis backend (library sluice::redis, hiredis).
#pragma once

#include <chrono>
#include <string>

#include "sluice/core/clock.h"

namespace sluice {

struct RedisOptions {
  std::string host = "127.0.0.1";                   // default 127.0.0.1
  int port = 6379;                                  // default 6379
  std::string username;                             // ACL user; empty: AUTH with the password alone
  std::string password;                             // empty: no AUTH
  int database = 0;                                 // SELECT; default 0
  Nanos connect_timeout = std::chrono::seconds(1);  // default 1 s
  std::string key_prefix = "sluice:fleet:";         // default "sluice:fleet:"
};

}  // namespace sluice
