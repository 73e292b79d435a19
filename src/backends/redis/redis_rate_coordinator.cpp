#include "sluice/redis_rate_coordinator.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/redis/escrow_script.h"
#include "backends/redis/redis_connection.h"

namespace sluice {
namespace {

using redis_detail::RedisConnection;

constexpr const char* kDefaultPrefix = "sluice:fed:";
constexpr std::uint64_t kMaxExact = std::uint64_t{1} << 53;  // Lua doubles are exact below
constexpr std::int64_t kMinTtlMs = 60'000;                   // an idle key's ledger lives at least
constexpr std::size_t kPerCall = 64;                         // leases per "many" script call

// Nanoseconds to whole microseconds, rounded down (also before the epoch).
std::int64_t floor_us(Nanos d) { return std::chrono::floor<std::chrono::microseconds>(d).count(); }

std::string text_of(const redisReply* r) { return std::string(r->str, r->len); }

// Why the options cannot be used (empty when they can).
std::string options_error(const RedisOptions& o) {
  if (std::string why = RedisConnection::options_error(o); !why.empty()) return why;
  if (o.key_prefix.empty()) return "redis: key_prefix must not be empty";
  if (o.key_prefix == RedisOptions{}.key_prefix)
    return "redis: key_prefix must not be the fleet coordinator's \"" + o.key_prefix +
           "\" (the federation's default is \"" + kDefaultPrefix + "\")";
  return {};
}

// The script's status codes, in its order.
constexpr LeaseStatus kStatuses[] = {LeaseStatus::kGranted,      LeaseStatus::kSpent,
                                     LeaseStatus::kWindowEnding, LeaseStatus::kStateLost,
                                     LeaseStatus::kSpecMismatch, LeaseStatus::kShort};

// The lease reply in `r`'s elements [at, at + 8) (a "many" call's replies follow each other).
StatusOr<LeaseReply> lease_reply_of(const redisReply* r, std::size_t at = 0,
                                    std::size_t replies = 1) {
  const Status bad(StatusCode::kInternal, "redis: unexpected lease reply");
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 8 * replies) return bad;
  std::int64_t v[8];
  for (std::size_t i = 0; i < 8; ++i) {
    if (r->element[at + i]->type != REDIS_REPLY_INTEGER) return bad;
    v[i] = r->element[at + i]->integer;
  }
  if (v[0] < 0 || v[0] >= static_cast<std::int64_t>(std::size(kStatuses)) || v[1] < 0 || v[5] < 0 ||
      v[6] < 0)
    return bad;
  const auto us = [](std::int64_t x) { return Nanos{std::chrono::microseconds(x)}; };
  LeaseReply out;
  out.status = kStatuses[v[0]];
  out.granted = static_cast<std::uint64_t>(v[1]);
  out.window_start = us(v[2]);
  out.window_end = us(v[3]);
  out.coordinator_now = us(v[4]);
  out.remaining = static_cast<std::uint64_t>(v[5]);
  out.spec = BudgetSpec{static_cast<std::uint64_t>(v[6]), us(v[7])};
  return out;
}

}  // namespace

struct RedisRateCoordinator::Impl {
  Impl(RedisOptions o, const Clock* clock)
      : conn(o, {{"escrow", redis_detail::escrow_script()}},
             {{"CONFIG", "GET", "maxmemory-policy"}, &eviction_policy_ok}, /*track_run_id=*/true),
        ledger_prefix(std::move(o.key_prefix)),
        caller_clock(clock) {}

  RedisConnection conn;
  const std::string ledger_prefix;
  const Clock* const caller_clock;

  // An evicted ledger would forget what it granted: only noeviction will do (the reply to
  // CONFIG GET maxmemory-policy, checked on every (re)connect).
  static Status eviction_policy_ok(const redisReply& reply) {
    if (reply.type == REDIS_REPLY_ERROR)
      return Status(
          StatusCode::kFailedPrecondition,
          "redis: cannot check maxmemory-policy (CONFIG GET maxmemory-policy: " + text_of(&reply) +
              "): the federation coordinator needs maxmemory-policy noeviction and "
              "must be able to verify it; allow CONFIG GET for this user (ACL: "
              "+config|get) and do not rename CONFIG");
    if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 ||
        reply.element[1]->type != REDIS_REPLY_STRING)
      return Status(StatusCode::kInternal, "redis: unexpected CONFIG GET maxmemory-policy reply");
    const std::string policy = text_of(reply.element[1]);
    if (policy == "noeviction") return {};
    return Status(StatusCode::kFailedPrecondition,
                  "redis: maxmemory-policy is " + policy +
                      ": the federation coordinator needs maxmemory-policy noeviction (an "
                      "evicted ledger forgets what it granted); set it with CONFIG SET "
                      "maxmemory-policy noeviction or in redis.conf");
  }

  // The script's keys for `key`: its ledger, the origin marker and the server marker.
  std::vector<std::string> keys_of(std::string_view key) const {
    return {ledger_prefix + "{" + std::string(key) + "}", ledger_prefix + "origin",
            ledger_prefix + "server"};
  }
  // Runs the script with `args` on the key's ledger and the origin marker.
  StatusOr<RedisConnection::Reply> run_script(RedisConnection::Session& s, std::string_view key,
                                              const std::vector<std::string>& args) const {
    return s.eval(0, keys_of(key), args);
  }
  // A lease's script call (the request checked by lease_error()) to the server `run_id`.
  RedisConnection::EvalCall lease_call(std::string_view key, const LeaseRequest& request,
                                       const std::string& run_id) const;
  // Leases `calls[slot[i]]` for i in [from, to) in one script call ("many").
  RedisConnection::EvalCall many_call(std::span<const LeaseCall> calls,
                                      const std::vector<std::size_t>& slot, std::size_t from,
                                      std::size_t to, const std::string& run_id) const;

  // The caller's time in test mode; empty: the script reads Redis TIME.
  std::string now_arg() const {
    return caller_clock != nullptr ? std::to_string(floor_us(caller_clock->now())) : std::string();
  }
};

RedisRateCoordinator::RedisRateCoordinator(std::unique_ptr<Impl> impl) noexcept
    : impl_(std::move(impl)) {}
RedisRateCoordinator::~RedisRateCoordinator() = default;

RedisOptions RedisRateCoordinator::default_options() {
  RedisOptions o;
  o.key_prefix = kDefaultPrefix;
  return o;
}

const std::string& RedisRateCoordinator::script() { return redis_detail::escrow_script(); }

StatusOr<std::unique_ptr<RedisRateCoordinator>> RedisRateCoordinator::open(
    RedisOptions options, const Clock* caller_clock) {
  if (std::string why = options_error(options); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  auto impl = std::make_unique<Impl>(std::move(options), caller_clock);
  return std::unique_ptr<RedisRateCoordinator>(new RedisRateCoordinator(std::move(impl)));
}

StatusOr<std::unique_ptr<RedisRateCoordinator>> RedisRateCoordinator::connect(
    RedisOptions options, const Clock* caller_clock) {
  auto c = open(std::move(options), caller_clock);
  if (!c.ok()) return c;
  RedisConnection& conn = c.value()->impl_->conn;
  if (Status s = conn.connect(conn.options().connect_timeout); !s.ok()) return s;
  return c;
}

namespace {

// Why a lease cannot be sent (ok when it can).
Status lease_error(std::string_view key, const LeaseRequest& request) {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (std::string why = validate(request); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  if (request.spec.period % std::chrono::microseconds(1) != Nanos{0})
    return Status(StatusCode::kInvalidArgument,
                  "period: must be a whole number of microseconds on the redis coordinator");
  if (request.spec.limit > kMaxExact)
    return Status(StatusCode::kInvalidArgument,
                  "limit: must be at most 2^53 on the redis coordinator");
  return {};
}

}  // namespace

RedisConnection::EvalCall RedisRateCoordinator::Impl::lease_call(std::string_view key,
                                                                 const LeaseRequest& request,
                                                                 const std::string& run_id) const {
  // A grant never exceeds the limit, so a larger want asks for the same, and a need over the
  // limit is never met, as one of limit + 1 is not (the numbers stay exact in Lua).
  const std::uint64_t want = std::min(request.want, request.spec.limit);
  const std::uint64_t need = std::min(request.need, request.spec.limit + 1);
  const auto min_left = std::chrono::ceil<std::chrono::microseconds>(request.min_window_left);
  return {keys_of(key),
          {"lease", now_arg(), std::to_string(kMinTtlMs), request.region,
           std::to_string(request.spec.limit), std::to_string(floor_us(request.spec.period)),
           std::to_string(want), std::to_string(min_left.count()), run_id, std::to_string(need)}};
}

RedisConnection::EvalCall RedisRateCoordinator::Impl::many_call(
    std::span<const LeaseCall> calls, const std::vector<std::size_t>& slot, std::size_t from,
    std::size_t to, const std::string& run_id) const {
  RedisConnection::EvalCall c;
  c.keys.reserve(to - from + 2);
  c.args.reserve(5 + 6 * (to - from));
  c.args = {"many", now_arg(), std::to_string(kMinTtlMs), run_id, std::to_string(to - from)};
  for (std::size_t j = from; j < to; ++j) {
    const LeaseCall& call = calls[slot[j]];
    RedisConnection::EvalCall one = lease_call(call.key, *call.request, run_id);
    c.keys.push_back(std::move(one.keys[0]));
    // One's arguments: lease, now, min_ttl, region, limit, period, want, min_left, run_id, need.
    constexpr std::size_t kPerLease[] = {3, 4, 5, 6, 7, 9};
    for (const std::size_t a : kPerLease) c.args.push_back(std::move(one.args[a]));
  }
  c.keys.push_back(ledger_prefix + "origin");
  c.keys.push_back(ledger_prefix + "server");
  return c;
}

StatusOr<LeaseReply> RedisRateCoordinator::lease(std::string_view key, const LeaseRequest& request,
                                                 Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  if (Status bad = lease_error(key, request); !bad.ok()) return bad;
  const Impl& m = *impl_;
  return impl_->conn.call(timeout, [&](RedisConnection::Session& s) -> StatusOr<LeaseReply> {
    // Connected first: the run_id is the server's this call runs on.
    auto run_id = s.server_run_id();
    if (!run_id.ok()) return run_id.status();
    RedisConnection::EvalCall c = m.lease_call(key, request, run_id.value());
    auto r = s.eval(0, c.keys, c.args);
    if (!r.ok()) return r.status();
    return lease_reply_of(r.value().get());
  });
}

std::vector<StatusOr<LeaseReply>> RedisRateCoordinator::lease_many(std::span<const LeaseCall> calls,
                                                                   Nanos timeout) noexcept {
  std::vector<StatusOr<LeaseReply>> out;
  try {
    out.reserve(calls.size());
    std::vector<std::size_t> slot;  // the call each sent lease answers
    for (std::size_t i = 0; i < calls.size(); ++i) {
      Status bad = timeout <= Nanos{0}
                       ? Status(StatusCode::kInvalidArgument, "timeout: must be > 0")
                       : lease_error(calls[i].key, *calls[i].request);
      out.emplace_back(bad.ok() ? Status(StatusCode::kInternal, "redis: no reply") : bad);
      if (bad.ok()) slot.push_back(i);
    }
    if (slot.empty()) return out;
    // Up to kPerCall leases per script call (the markers read once for them all), the calls
    // pipelined (one round trip).
    const std::size_t chunks = (slot.size() + kPerCall - 1) / kPerCall;
    const auto chunk_of = [&](std::size_t c) {
      return std::pair{c * kPerCall, std::min(slot.size(), (c + 1) * kPerCall)};
    };
    using Replies = std::vector<StatusOr<RedisConnection::Reply>>;
    StatusOr<Replies> replies =
        impl_->conn.call(timeout, [&](RedisConnection::Session& s) -> StatusOr<Replies> {
          // Connected first: the run_id is the server's these calls run on.
          auto run_id = s.server_run_id();
          if (!run_id.ok()) return run_id.status();
          std::vector<RedisConnection::EvalCall> sent;
          sent.reserve(chunks);
          for (std::size_t c = 0; c < chunks; ++c) {
            const auto [from, to] = chunk_of(c);
            sent.push_back(impl_->many_call(calls, slot, from, to, run_id.value()));
          }
          return s.eval_many(0, sent);
        });
    for (std::size_t c = 0; c < chunks; ++c) {
      const auto [from, to] = chunk_of(c);
      for (std::size_t j = from; j < to; ++j) {
        if (!replies.ok())
          out[slot[j]] = replies.status();
        else if (!replies.value()[c].ok())
          out[slot[j]] = replies.value()[c].status();
        else
          out[slot[j]] =
              lease_reply_of(replies.value()[c].value().get(), 8 * (j - from), to - from);
      }
    }
  } catch (...) {
    out.clear();
  }
  return out;
}

StatusOr<std::uint64_t> RedisRateCoordinator::reconcile(std::string_view key,
                                                        std::string_view region, Nanos window_start,
                                                        std::uint64_t relinquished,
                                                        Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (region.empty()) return Status(StatusCode::kInvalidArgument, "region: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  if (window_start % std::chrono::microseconds(1) != Nanos{0})
    return Status(StatusCode::kInvalidArgument,
                  "window_start: must be a window this coordinator leased (whole microseconds)");
  const Impl& m = *impl_;
  return impl_->conn.call(timeout, [&](RedisConnection::Session& s) -> StatusOr<std::uint64_t> {
    // Never more than any limit: a larger total gives back the same (what the region held).
    const std::uint64_t total = std::min(relinquished, kMaxExact);
    auto r = m.run_script(s, key,
                          {"reconcile", m.now_arg(), std::to_string(kMinTtlMs), std::string(region),
                           std::to_string(floor_us(window_start)), std::to_string(total)});
    if (!r.ok()) return r.status();
    const redisReply* reply = r.value().get();
    if (reply->type != REDIS_REPLY_INTEGER || reply->integer < 0)
      return Status(StatusCode::kInternal, "redis: unexpected reconcile reply");
    return static_cast<std::uint64_t>(reply->integer);
  });
}

Status RedisRateCoordinator::health(Nanos timeout) noexcept { return impl_->conn.ping(timeout); }

}  // namespace sluice
