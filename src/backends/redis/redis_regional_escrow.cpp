#include "sluice/backends/redis_regional_escrow.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/redis/pool_script.h"
#include "backends/redis/redis_connection.h"

namespace sluice {
namespace {

using redis_detail::RedisConnection;

constexpr const char* kDefaultPrefix = "sluice:pool:";
constexpr std::uint64_t kMaxExact = std::uint64_t{1} << 53;  // Lua doubles are exact below
constexpr std::int64_t kKeepMs = 3'600'000;                  // a pool outlives its expiry by

std::int64_t floor_us(Nanos d) { return std::chrono::floor<std::chrono::microseconds>(d).count(); }
std::int64_t ceil_us(Nanos d) { return std::chrono::ceil<std::chrono::microseconds>(d).count(); }

std::string options_error(const RedisOptions& o) {
  if (std::string why = RedisConnection::options_error(o); !why.empty()) return why;
  if (o.key_prefix.empty()) return "redis: key_prefix must not be empty";
  if (o.key_prefix == RedisOptions{}.key_prefix)
    return "redis: key_prefix must not be the fleet coordinator's \"" + o.key_prefix +
           "\" (the regional pool's default is \"" + kDefaultPrefix + "\")";
  return {};
}

StatusOr<PoolReply> pool_reply_of(const redisReply* r) {
  const Status bad(StatusCode::kInternal, "redis: unexpected regional pool reply");
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 8) return bad;
  std::int64_t v[8];
  for (std::size_t i = 0; i < 8; ++i) {
    if (r->element[i]->type != REDIS_REPLY_INTEGER) return bad;
    v[i] = r->element[i]->integer;
  }
  if (v[0] < 0 || v[1] < 0 || (v[2] != 0 && v[2] != 1) || (v[6] != 0 && v[6] != 1) || v[7] < 0)
    return bad;
  const auto us = [](std::int64_t x) { return Nanos{std::chrono::microseconds(x)}; };
  PoolReply out;
  out.granted = static_cast<std::uint64_t>(v[0]);
  out.balance = static_cast<std::uint64_t>(v[1]);
  out.window_start = v[2] == 1 ? us(v[3]) : Nanos{INT64_MIN};
  out.expires_in = us(v[4]);
  out.now = us(v[5]);
  out.refill = v[6] == 1;
  out.demand = static_cast<std::uint64_t>(v[7]);
  return out;
}

}  // namespace

struct RedisRegionalEscrow::Impl {
  Impl(RedisOptions o, const Clock* clock)
      : conn(o, {{"regional pool", redis_detail::pool_script()}}, {}, /*track_run_id=*/true),
        prefix(std::move(o.key_prefix)),
        caller_clock(clock) {}

  RedisConnection conn;
  const std::string prefix;
  const Clock* const caller_clock;

  StatusOr<PoolReply> run(std::string_view key, std::vector<std::string> args, Nanos timeout) {
    if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
    if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
    // The caller's time in test mode; empty: the script reads Redis TIME.
    const std::string now =
        caller_clock != nullptr ? std::to_string(floor_us(caller_clock->now())) : std::string();
    const std::string hash = prefix + "{" + std::string(key) + "}";
    return conn.call(timeout, [&](RedisConnection::Session& s) -> StatusOr<PoolReply> {
      // Connected first: the run_id is the server's this call runs on.
      auto run_id = s.server_run_id();
      if (!run_id.ok()) return run_id.status();
      std::vector<std::string> full = args;
      full.insert(full.begin() + 1, {now, std::to_string(kKeepMs), run_id.value()});
      auto r = s.eval(0, {hash}, full);
      if (!r.ok()) return r.status();
      return pool_reply_of(r.value().get());
    });
  }
};

RedisRegionalEscrow::RedisRegionalEscrow(std::unique_ptr<Impl> impl) noexcept
    : impl_(std::move(impl)) {}
RedisRegionalEscrow::~RedisRegionalEscrow() = default;

RedisOptions RedisRegionalEscrow::default_options() {
  RedisOptions o;
  o.key_prefix = kDefaultPrefix;
  return o;
}

StatusOr<std::unique_ptr<RedisRegionalEscrow>> RedisRegionalEscrow::open(
    RedisOptions options, const Clock* caller_clock) {
  if (std::string why = options_error(options); !why.empty())
    return Status(StatusCode::kInvalidArgument, why);
  try {
    return std::unique_ptr<RedisRegionalEscrow>(
        new RedisRegionalEscrow(std::make_unique<Impl>(std::move(options), caller_clock)));
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("redis: ") + e.what());
  }
}

StatusOr<std::unique_ptr<RedisRegionalEscrow>> RedisRegionalEscrow::connect(
    RedisOptions options, const Clock* caller_clock) {
  auto p = open(std::move(options), caller_clock);
  if (!p.ok()) return p.status();
  RedisConnection& conn = p.value()->impl_->conn;
  if (Status s = conn.connect(conn.options().connect_timeout); !s.ok()) return s;
  return p;
}

StatusOr<PoolReply> RedisRegionalEscrow::take(std::string_view key, std::uint64_t want,
                                              Nanos refill_hold, bool past_expiry,
                                              Nanos timeout) noexcept {
  if (want == 0) return Status(StatusCode::kInvalidArgument, "want: must be at least 1");
  if (refill_hold <= Nanos{0})
    return Status(StatusCode::kInvalidArgument, "refill_hold: must be positive");
  try {
    return impl_->run(key,
                      {"take", std::to_string(std::min(want, kMaxExact)),
                       std::to_string(ceil_us(refill_hold)), past_expiry ? "1" : "0"},
                      timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("redis: take: ") + e.what());
  }
}

StatusOr<PoolReply> RedisRegionalEscrow::refill(std::string_view key, Nanos window_start,
                                                std::uint64_t units, Nanos expires_at,
                                                Nanos timeout) noexcept {
  if (units > kMaxExact)
    return Status(StatusCode::kInvalidArgument, "units: must be at most 2^53 on redis");
  if (units > 0 && window_start % std::chrono::microseconds(1) != Nanos{0})
    return Status(StatusCode::kInvalidArgument,
                  "window_start: must be a coordinator window (whole microseconds)");
  try {
    // An empty refill only ends the refill in flight: its window and expiry are not read.
    return impl_->run(
        key,
        {"refill", units > 0 ? std::to_string(floor_us(window_start)) : "0", std::to_string(units),
         units > 0 ? std::to_string(floor_us(expires_at)) : "0"},
        timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("redis: refill: ") + e.what());
  }
}

StatusOr<PoolReply> RedisRegionalEscrow::release(std::string_view key, Nanos window_start,
                                                 std::uint64_t units, Nanos timeout) noexcept {
  if (units > kMaxExact)
    return Status(StatusCode::kInvalidArgument, "units: must be at most 2^53 on redis");
  try {
    return impl_->run(
        key, {"release", std::to_string(floor_us(window_start)), std::to_string(units)}, timeout);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("redis: release: ") + e.what());
  }
}

Status RedisRegionalEscrow::health(Nanos timeout) noexcept { return impl_->conn.ping(timeout); }

}  // namespace sluice
