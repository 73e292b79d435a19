// redis_coordinator.h: a ConcurrencyCoordinator on Redis (hiredis).
//
// What it is: each heartbeat is one EVALSHA of a Lua script that does upsert-evict-aggregate-
// split atomically on the server; the script transcribes the heartbeat core of sluice/core/fleet.h
// rule for rule and the conformance test replays one sequence through it and through the C++
// core. All of a key's data is one hash, "<prefix>{<key>}", so it lives in one hash slot
// (Redis Cluster-compatible). The script is loaded once and run by its SHA; on NOSCRIPT (a
// restarted or flushed server) it is loaded again and the call retried once. Coordinator time
// is Redis TIME (microseconds), or the caller's Clock in test mode. AUTH (password, or ACL user
// and password) and SELECT are sent on every (re)connect. Debian's hiredis 0.14 has no TLS:
// reach a remote Redis through a TLS tunnel (stunnel, a service mesh).
//
// Connection: one hiredis connection per coordinator, guarded by a mutex; a broken connection
// is re-established on the next call. Every call is bounded by its timeout (the socket
// timeout): a hanging server yields kDeadlineExceeded, an unreachable one kUnavailable.
//
// Thread-safety: every member is safe to call concurrently (calls are serialised).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "sluice/core/coordinator.h"
#include "sluice/core/redis_options.h"

namespace sluice {

class RedisCoordinator final : public ConcurrencyCoordinator {
 public:
  // Connects, authenticates and loads the script. `caller_clock` non-null: test mode.
  [[nodiscard]] static StatusOr<std::unique_ptr<RedisCoordinator>> connect(
      RedisOptions options, CoordinatorConfig config, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects (as every call after a lost connection
  // does), so a coordinator can be built while the server is down.
  [[nodiscard]] static StatusOr<std::unique_ptr<RedisCoordinator>> open(
      RedisOptions options, CoordinatorConfig config, const Clock* caller_clock = nullptr);
  ~RedisCoordinator() override;

  [[nodiscard]] StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report,
                                          Nanos timeout) noexcept override;
  [[nodiscard]] Status leave(std::string_view key, std::string_view node_id, std::uint64_t instance,
                             Nanos timeout) noexcept override;
  [[nodiscard]] const CoordinatorConfig& config() const noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "redis"; }

  // The heartbeat script (Lua) and its SHA1, e.g. for redis-benchmark in the same run.
  [[nodiscard]] static const std::string& script();
  [[nodiscard]] std::string script_sha() const;

  struct Impl;

 private:
  explicit RedisCoordinator(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
