#include "sluice/backends/redis_coordinator.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/redis/heartbeat_script.h"
#include "backends/redis/redis_connection.h"

namespace sluice {
namespace {

using redis_detail::RedisConnection;

std::int64_t to_us(Nanos d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

// An instance as the script stores it: 16 hex digits, "" for 0 (not said).
std::string instance_text(std::uint64_t instance) {
  if (instance == 0) return {};
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(instance));
  return out;
}

}  // namespace

struct RedisCoordinator::Impl {
  Impl(RedisOptions o, CoordinatorConfig c, const Clock* clock)
      : conn(o,
             {{"heartbeat", redis_detail::heartbeat_script()},
              {"leave", redis_detail::leave_script()}},
             {}, /*track_run_id=*/true),
        key_prefix(std::move(o.key_prefix)),
        config(c),
        caller_clock(clock) {}

  RedisConnection conn;
  const std::string key_prefix;
  const CoordinatorConfig config;
  const Clock* const caller_clock;

  std::string hash_key(std::string_view key) const {
    return key_prefix + "{" + std::string(key) + "}";
  }
  // The heartbeat script's keys for `key`: its hash, the origin marker and the server marker.
  std::vector<std::string> keys_of(std::string_view key) const {
    return {hash_key(key), key_prefix + "origin", key_prefix + "server"};
  }
};

RedisCoordinator::RedisCoordinator(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
RedisCoordinator::~RedisCoordinator() = default;

const std::string& RedisCoordinator::script() { return redis_detail::heartbeat_script(); }

std::string RedisCoordinator::script_sha() const { return impl_->conn.script_sha(0); }

const CoordinatorConfig& RedisCoordinator::config() const noexcept { return impl_->config; }

StatusOr<std::unique_ptr<RedisCoordinator>> RedisCoordinator::open(RedisOptions options,
                                                                   CoordinatorConfig config,
                                                                   const Clock* caller_clock) {
  if (std::string why = RedisConnection::options_error(options); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  if (options.key_prefix.empty())
    return Status(StatusCode::kInvalidArgument, "redis: key_prefix must not be empty");
  auto impl = std::make_unique<Impl>(std::move(options), config, caller_clock);
  return std::unique_ptr<RedisCoordinator>(new RedisCoordinator(std::move(impl)));
}

StatusOr<std::unique_ptr<RedisCoordinator>> RedisCoordinator::connect(RedisOptions options,
                                                                      CoordinatorConfig config,
                                                                      const Clock* caller_clock) {
  auto c = open(std::move(options), config, caller_clock);
  if (!c.ok()) return c;
  RedisConnection& conn = c.value()->impl_->conn;
  if (Status s = conn.connect(conn.options().connect_timeout); !s.ok()) return s;
  return c;
}

StatusOr<Grant> RedisCoordinator::heartbeat(std::string_view key, const NodeReport& report,
                                            Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  if (std::string why = validate(report); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  const Impl& m = *impl_;
  return impl_->conn.call(timeout, [&](RedisConnection::Session& s) -> StatusOr<Grant> {
    const std::int64_t now_us = m.caller_clock != nullptr ? to_us(m.caller_clock->now()) : -1;
    const std::int64_t lease_us = std::max<std::int64_t>(to_us(report.lease_ttl), 1);
    // The hash outlives every lease in it by far; an abandoned key then disappears.
    const std::int64_t key_ttl_ms = std::max<std::int64_t>(lease_us / 100, 60'000);
    auto run_id = s.server_run_id();
    if (!run_id.ok()) return run_id.status();
    auto r = s.eval(0, m.keys_of(key),
                    {report.node_id, std::to_string(report.l_local),
                     std::to_string(report.in_flight), std::to_string(report.acked_generation),
                     std::to_string(lease_us), m.config.aggregate == Aggregate::kMin ? "1" : "0",
                     m.config.allocation == Allocation::kDemandProportional ? "1" : "0",
                     m.config.acknowledged_handoff ? "1" : "0", std::to_string(now_us),
                     std::to_string(key_ttl_ms), report.estimated ? "1" : "0",
                     instance_text(report.instance), run_id.value()});
    if (!r.ok()) return r.status();
    const redisReply* reply = r.value().get();
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 3 &&
        reply->element[0]->type == REDIS_REPLY_INTEGER && reply->element[0]->integer == -1 &&
        reply->element[1]->type == REDIS_REPLY_STRING &&
        reply->element[2]->type == REDIS_REPLY_INTEGER) {
      // Another live member holds the id: the same words as the core's clash().
      return Status(StatusCode::kAlreadyExists,
                    clash_text(report.node_id, std::strtoull(reply->element[1]->str, nullptr, 16),
                               std::chrono::microseconds(reply->element[2]->integer)));
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 6)
      return Status(StatusCode::kInternal, "redis: unexpected heartbeat reply");
    Grant g;
    g.share = static_cast<std::uint32_t>(reply->element[0]->integer);
    g.l_global = static_cast<std::uint32_t>(reply->element[1]->integer);
    g.nodes = static_cast<std::uint32_t>(reply->element[2]->integer);
    g.generation = static_cast<std::uint64_t>(reply->element[3]->integer);
    g.l_aggregate = static_cast<std::uint32_t>(reply->element[4]->integer);
    g.recovering = reply->element[5]->integer != 0;
    return g;
  });
}

Status RedisCoordinator::leave(std::string_view key, std::string_view node_id,
                               std::uint64_t instance, Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (node_id.empty()) return Status(StatusCode::kInvalidArgument, "node_id must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  const Impl& m = *impl_;
  return impl_->conn.call(timeout, [&](RedisConnection::Session& s) -> Status {
    auto r = s.eval(1, {m.hash_key(key)}, {std::string(node_id), instance_text(instance)});
    if (!r.ok()) return r.status();
    return {};
  });
}

}  // namespace sluice
