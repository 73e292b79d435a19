#include "sluice/backends/redis_rate_coordinator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
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

// The lease reply in `r`'s elements from `at` on (a "many" call's replies follow each other):
// five numbers, seven when the status is a spec mismatch (the ledger's limit and period); the
// others are the request's spec, `asked`. `at` is moved past it.
StatusOr<LeaseReply> lease_reply_at(const redisReply* r, std::size_t& at, const BudgetSpec& asked) {
  const Status bad(StatusCode::kInternal, "redis: unexpected lease reply");
  if (r->type != REDIS_REPLY_ARRAY) return bad;
  std::int64_t v[7];
  const auto take = [&](std::size_t n) {
    if (r->elements < at + n) return false;
    for (std::size_t i = 0; i < n; ++i) {
      const redisReply* e = r->element[at + i];
      if (e->type != REDIS_REPLY_INTEGER) return false;
      v[i] = e->integer;
    }
    return true;
  };
  if (!take(5) || v[0] < 0 || v[0] >= static_cast<std::int64_t>(std::size(kStatuses)) || v[1] < 0 ||
      v[4] < 0)
    return bad;
  const LeaseStatus status = kStatuses[v[0]];
  const std::size_t n = status == LeaseStatus::kSpecMismatch ? 7 : 5;
  if (n == 7 && (!take(7) || v[5] < 0 || v[6] < 0)) return bad;
  at += n;
  const auto us = [](std::int64_t x) { return Nanos{std::chrono::microseconds(x)}; };
  LeaseReply out;
  out.status = status;
  out.granted = static_cast<std::uint64_t>(v[1]);
  out.spec = n == 7 ? BudgetSpec{static_cast<std::uint64_t>(v[5]), us(v[6])} : asked;
  out.window_start = us(v[2]);
  out.window_end = out.window_start + out.spec.period;
  out.coordinator_now = us(v[3]);
  out.remaining = static_cast<std::uint64_t>(v[4]);
  return out;
}

}  // namespace

struct RedisRateCoordinator::Impl {
  Impl(const RedisOptions& o, const Clock* clock)
      : lanes(o, {{"escrow", redis_detail::escrow_script()}},
              RedisConnection::noeviction_check("the federation coordinator",
                                                "an evicted ledger forgets what it granted"),
              /*track_run_id=*/true),
        ledger_prefix(o.key_prefix),
        caller_clock(clock) {}

  redis_detail::RedisLanes lanes;
  RedisConnection& lane() { return lanes.lane(); }
  const std::string ledger_prefix;
  const Clock* const caller_clock;

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
  if (Status s = c.value()->impl_->lanes.connect(); !s.ok()) return s;
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

namespace {

// A grant never exceeds the limit, so a larger want asks for the same, and a need over the limit
// is never met, as one of limit + 1 is not (the numbers stay exact in Lua).
std::uint64_t want_of(const LeaseRequest& r) { return std::min(r.want, r.spec.limit); }
std::uint64_t need_of(const LeaseRequest& r) { return std::min(r.need, r.spec.limit + 1); }
std::int64_t min_left_us(const LeaseRequest& r) {
  return std::chrono::ceil<std::chrono::microseconds>(r.min_window_left).count();
}
// Whether two leases can share a "many" call: the same region, budget and window left.
bool same_call(const LeaseRequest& a, const LeaseRequest& b) {
  return a.region == b.region && a.spec.limit == b.spec.limit && a.spec.period == b.spec.period &&
         min_left_us(a) == min_left_us(b);
}

}  // namespace

RedisConnection::EvalCall RedisRateCoordinator::Impl::lease_call(std::string_view key,
                                                                 const LeaseRequest& request,
                                                                 const std::string& run_id) const {
  return {keys_of(key),
          {"lease", now_arg(), std::to_string(kMinTtlMs), request.region,
           std::to_string(request.spec.limit), std::to_string(floor_us(request.spec.period)),
           std::to_string(want_of(request)), std::to_string(min_left_us(request)), run_id,
           std::to_string(need_of(request))}};
}

RedisConnection::EvalCall RedisRateCoordinator::Impl::many_call(
    std::span<const LeaseCall> calls, const std::vector<std::size_t>& slot, std::size_t from,
    std::size_t to, const std::string& run_id) const {
  const LeaseRequest& first = *calls[slot[from]].request;  // shared by all (same_call)
  RedisConnection::EvalCall c;
  c.keys.reserve(to - from + 2);
  c.args.reserve(9 + 2 * (to - from));
  c.args = {"many",
            now_arg(),
            std::to_string(kMinTtlMs),
            run_id,
            std::to_string(to - from),
            first.region,
            std::to_string(first.spec.limit),
            std::to_string(floor_us(first.spec.period)),
            std::to_string(min_left_us(first))};
  for (std::size_t j = from; j < to; ++j) {
    const LeaseCall& call = calls[slot[j]];
    c.keys.push_back(keys_of(call.key)[0]);
    c.args.push_back(std::to_string(want_of(*call.request)));
    c.args.push_back(std::to_string(need_of(*call.request)));
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
  return impl_->lane().call(timeout, [&](RedisConnection::Session& s) -> StatusOr<LeaseReply> {
    // Connected first: the run_id is the server's this call runs on.
    auto run_id = s.server_run_id();
    if (!run_id.ok()) return run_id.status();
    RedisConnection::EvalCall c = m.lease_call(key, request, run_id.value());
    auto r = s.eval(0, c.keys, c.args);
    if (!r.ok()) return r.status();
    std::size_t at = 0;
    StatusOr<LeaseReply> out = lease_reply_at(r.value().get(), at, request.spec);
    if (out.ok() && at != r.value()->elements)
      return Status(StatusCode::kInternal, "redis: unexpected lease reply");
    return out;
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
    // Script calls of up to kPerCall leases that share a region and budget (the markers read
    // once for them all, the shared arguments sent once), the calls pipelined (one round trip).
    std::vector<std::pair<std::size_t, std::size_t>> chunks;  // [from, to) in `slot`
    for (std::size_t j = 0; j < slot.size(); ++j) {
      if (chunks.empty() || chunks.back().second - chunks.back().first == kPerCall ||
          !same_call(*calls[slot[chunks.back().first]].request, *calls[slot[j]].request))
        chunks.emplace_back(j, j);
      chunks.back().second = j + 1;
    }
    using Replies = std::vector<StatusOr<RedisConnection::Reply>>;
    StatusOr<Replies> replies =
        impl_->lane().call(timeout, [&](RedisConnection::Session& s) -> StatusOr<Replies> {
          // Connected first: the run_id is the server's these calls run on.
          auto run_id = s.server_run_id();
          if (!run_id.ok()) return run_id.status();
          std::vector<RedisConnection::EvalCall> sent;
          sent.reserve(chunks.size());
          for (const auto& [from, to] : chunks)
            sent.push_back(impl_->many_call(calls, slot, from, to, run_id.value()));
          return s.eval_many(0, sent);
        });
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const auto [from, to] = chunks[c];
      if (!replies.ok() || !replies.value()[c].ok()) {
        const Status why = replies.ok() ? replies.value()[c].status() : replies.status();
        for (std::size_t j = from; j < to; ++j) out[slot[j]] = why;
        continue;
      }
      const redisReply* r = replies.value()[c].value().get();
      std::size_t at = 0;
      for (std::size_t j = from; j < to; ++j)
        out[slot[j]] = lease_reply_at(r, at, calls[slot[j]].request->spec);
      if (r->type != REDIS_REPLY_ARRAY || at != r->elements)  // a reply of another length
        for (std::size_t j = from; j < to; ++j)
          out[slot[j]] = Status(StatusCode::kInternal, "redis: unexpected lease reply");
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
  return impl_->lane().call(timeout, [&](RedisConnection::Session& s) -> StatusOr<std::uint64_t> {
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

Status RedisRateCoordinator::health(Nanos timeout) noexcept { return impl_->lane().ping(timeout); }

}  // namespace sluice
