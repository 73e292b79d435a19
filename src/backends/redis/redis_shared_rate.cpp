#include "sluice/backends/redis_shared_rate.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/redis/loss_markers.h"
#include "backends/redis/redis_connection.h"
#include "backends/redis/shared_rate_script.h"

namespace sluice {
namespace {

using redis_detail::RedisConnection;

constexpr const char* kDefaultPrefix = "sluice:rate:";
constexpr std::uint64_t kTwo32 = std::uint64_t{1} << 32;
constexpr std::uint64_t kTwo50 = std::uint64_t{1} << 50;
constexpr std::uint64_t kTwo51 = std::uint64_t{1} << 51;
constexpr std::uint64_t kTwo52 = std::uint64_t{1} << 52;
constexpr std::size_t kPerCall = 64;  // calls per script call

// Marks the Redis as new to shared rate limits: the markers as the connected server's, the origin
// long past. KEYS: origin, server. ARGV: run_id.
const std::string& adopt_script() {
  static const std::string script = redis_detail::loss_markers_lua() + R"lua(
redis.call('SET', KEYS[1], '0')
redis.call('SET', KEYS[2], sluice_server_marker(ARGV[1]))
return 1
)lua";
  return script;
}

std::int64_t floor_us(Nanos d) { return std::chrono::floor<std::chrono::microseconds>(d).count(); }

std::string options_error(const RedisOptions& o) {
  if (std::string why = RedisConnection::options_error(o); !why.empty()) return why;
  if (o.key_prefix.empty()) return "redis: key_prefix must not be empty";
  if (o.key_prefix == RedisOptions{}.key_prefix || o.key_prefix == "sluice:fed:")
    return "redis: key_prefix must be neither the fleet's nor the federation's (\"" + o.key_prefix +
           "\"); shared rate limits' default is \"" + kDefaultPrefix + "\"";
  return {};
}

std::uint64_t burst_of(const RateRule& r) { return r.burst != 0 ? r.burst : r.limit; }

bool same_rule(const RateRule& a, const RateRule& b) {
  return a.strategy == b.strategy && a.limit == b.limit && a.period == b.period &&
         a.burst == b.burst;
}

// The hits the script is sent: as many as decide the same (header of shared_rate_script.cpp).
std::uint64_t hits_sent(const SharedRateRequest& r) {
  const auto p = static_cast<std::uint64_t>(floor_us(r.rule.period));
  const bool gcra = r.rule.strategy == RateStrategy::kGcra;
  switch (r.op) {
    case SharedRateOp::kCheck:
    case SharedRateOp::kPeek:
      return std::min(r.hits, (gcra ? burst_of(r.rule) : r.rule.limit) + 1);
    case SharedRateOp::kTake:  // never more than the remaining, itself at most this
      return std::min(r.hits, gcra ? burst_of(r.rule) : r.rule.limit);
    case SharedRateOp::kRefund:
    case SharedRateOp::kCharge:
      return std::min(r.hits, gcra ? kTwo51 / p + 1 : kTwo52);
  }
  return r.hits;
}

char op_code(SharedRateOp op) {
  switch (op) {
    case SharedRateOp::kCheck:
      return 'c';
    case SharedRateOp::kPeek:
      return 'p';
    case SharedRateOp::kRefund:
      return 'r';
    case SharedRateOp::kCharge:
      return 'h';
    case SharedRateOp::kTake:
      return 't';
  }
  return 'p';
}

char strategy_code(RateStrategy s) {
  switch (s) {
    case RateStrategy::kFixedWindow:
      return 'f';
    case RateStrategy::kSlidingWindow:
      return 's';
    case RateStrategy::kGcra:
      return 'g';
  }
  return 'f';
}

// A duration from the script's (us, ns) pair; (-1, -1) is never.
Nanos duration_of(std::int64_t us, std::int64_t ns) {
  if (us < 0) return Nanos::max();
  return std::chrono::microseconds(us) + Nanos(ns);
}

// The integers a call's reply takes: 7, a take's 8, a charge's 14.
std::size_t reply_ints(SharedRateOp op) {
  return op == SharedRateOp::kCharge ? 14 : op == SharedRateOp::kTake ? 8 : 7;
}

// One call's reply from `r`'s elements at `at` (the script's now_us is element 0).
StatusOr<SharedRateReply> reply_at(const redisReply* r, std::size_t at, SharedRateOp op) {
  const Status bad(StatusCode::kInternal, "redis: unexpected shared rate reply");
  const std::size_t n = reply_ints(op);
  if (r->type != REDIS_REPLY_ARRAY || r->elements < at + n || r->elements == 0) return bad;
  std::array<std::int64_t, 14> v{};
  for (std::size_t i = 0; i < n; ++i) {
    const redisReply* e = r->element[at + i];
    if (e->type != REDIS_REPLY_INTEGER) return bad;
    v[i] = e->integer;
  }
  if (r->element[0]->type != REDIS_REPLY_INTEGER) return bad;
  const auto u = [](std::int64_t x) {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(0, x));
  };
  SharedRateReply out;
  out.coordinator_now = std::chrono::microseconds(r->element[0]->integer);
  out.decision.allowed = v[0] == 1;
  out.decision.limit = u(v[1]);
  out.decision.remaining = u(v[2]);
  out.decision.reset_after = duration_of(v[3], v[4]);
  out.decision.retry_after = duration_of(v[5], v[6]);
  if (op == SharedRateOp::kTake) out.granted = u(v[7]);
  if (op == SharedRateOp::kCharge) {
    out.charge.limit = u(v[7]);
    out.charge.remaining = u(v[8]);
    out.charge.overdraft = u(v[9]);
    out.charge.reset_after = duration_of(v[10], v[11]);
    out.charge.retry_after = duration_of(v[12], v[13]);
  }
  return out;
}

// How long past the time it decides like a fresh key a state is kept: a second (ten minutes with
// a caller's clock, which need not keep Redis's pace).
std::int64_t margin_ms(bool caller_clock) { return caller_clock ? 600'000 : 1000; }

}  // namespace

struct RedisSharedRate::Impl {
  Impl(const RedisOptions& o, const Clock* clock)
      : lanes(o,
              {{"shared rate", redis_detail::shared_rate_script()},
               {"shared rate adopt", adopt_script()}},
              RedisConnection::noeviction_check("a shared rate limit",
                                                "an evicted key forgets what it admitted"),
              /*track_run_id=*/true),
        prefix(o.key_prefix),
        caller_clock(clock) {}

  redis_detail::RedisLanes lanes;
  RedisConnection& lane() { return lanes.lane(); }
  const std::string prefix;
  const Clock* const caller_clock;

  std::string state_key(std::string_view key, const RateRule& rule) const {
    std::string out = prefix;
    out += '{';
    out += key;
    out += '}';
    out += to_string(rule.strategy);
    out += '/';
    out += std::to_string(floor_us(rule.period));
    return out;
  }
  // Calls `calls[slot[i]]` for i in [from, to) as one script call.
  RedisConnection::EvalCall script_call(std::span<const SharedRateCall> calls,
                                        const std::vector<std::size_t>& slot, std::size_t from,
                                        std::size_t to, const std::string& run_id) const {
    RedisConnection::EvalCall c;
    c.keys.reserve(to - from + 2);
    c.args.reserve(4 + 5 + 3 * (to - from));
    c.args.push_back(caller_clock != nullptr ? std::to_string(floor_us(caller_clock->now()))
                                             : std::string());
    c.args.push_back(run_id);
    c.args.push_back(std::to_string(to - from));
    c.args.emplace_back();  // the number of rules, below
    // The rules, each sent once (a batch's calls are mostly of one policy's rule).
    std::vector<const RateRule*> rules;
    std::vector<std::size_t> rule_of(to - from);
    for (std::size_t j = from; j < to; ++j) {
      const RateRule& r = calls[slot[j]].request->rule;
      std::size_t i = 0;
      while (i < rules.size() && !same_rule(*rules[i], r)) ++i;
      if (i == rules.size()) {
        rules.push_back(&r);
        c.args.emplace_back(1, strategy_code(r.strategy));
        c.args.push_back(std::to_string(r.limit));
        c.args.push_back(std::to_string(floor_us(r.period)));
        c.args.push_back(std::to_string(r.burst));
        c.args.push_back(std::to_string(margin_ms(caller_clock != nullptr)));
      }
      rule_of[j - from] = i + 1;
    }
    c.args[3] = std::to_string(rules.size());
    for (std::size_t j = from; j < to; ++j) {
      const SharedRateCall& call = calls[slot[j]];
      c.keys.push_back(state_key(call.key, call.request->rule));
      c.args.emplace_back(1, op_code(call.request->op));
      c.args.push_back(std::to_string(rule_of[j - from]));
      c.args.push_back(std::to_string(hits_sent(*call.request)));
    }
    c.keys.push_back(prefix + "origin");
    c.keys.push_back(prefix + "server");
    return c;
  }
};

RedisSharedRate::RedisSharedRate(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
RedisSharedRate::~RedisSharedRate() = default;

RedisOptions RedisSharedRate::default_options() {
  RedisOptions o;
  o.key_prefix = kDefaultPrefix;
  return o;
}

const std::string& RedisSharedRate::script() { return redis_detail::shared_rate_script(); }

StatusOr<std::unique_ptr<RedisSharedRate>> RedisSharedRate::open(RedisOptions options,
                                                                 const Clock* caller_clock) {
  if (std::string why = options_error(options); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  return std::unique_ptr<RedisSharedRate>(
      new RedisSharedRate(std::make_unique<Impl>(options, caller_clock)));
}

StatusOr<std::unique_ptr<RedisSharedRate>> RedisSharedRate::connect(RedisOptions options,
                                                                    const Clock* caller_clock) {
  auto s = open(std::move(options), caller_clock);
  if (!s.ok()) return s;
  if (Status st = s.value()->impl_->lanes.connect(); !st.ok()) return st;
  return s;
}

std::string RedisSharedRate::rule_error(const RateRule& rule) const {
  if (std::string why = rule.validate(); !why.empty()) return why;
  if (rule.period % std::chrono::microseconds(1) != Nanos{0})
    return "period must be a whole number of microseconds on the redis coordinator";
  if (rule.limit > kTwo32 || rule.burst > kTwo32)
    return std::string(rule.limit > kTwo32 ? "limit" : "burst") +
           " must be at most 2^32 on the redis coordinator";
  const auto p = static_cast<std::uint64_t>(floor_us(rule.period));
  const auto within = [&](std::uint64_t n, const char* field, const char* what) -> std::string {
    if (n <= kTwo50 / p) return {};
    return std::string(field) + " " + what +
           " x period (in microseconds) must be at most 2^50 on " +
           "the redis coordinator, so that its script's arithmetic stays exact (here " +
           std::to_string(n) + " x " + std::to_string(p) +
           "); use a shorter period with a proportionally lower " + field + ", or a fixed window";
  };
  if (rule.strategy == RateStrategy::kSlidingWindow) return within(rule.limit, "limit", "limit");
  if (rule.strategy == RateStrategy::kGcra)
    return within(burst_of(rule), rule.burst != 0 ? "burst" : "limit",
                  rule.burst != 0 ? "burst" : "limit (the burst)");
  return {};
}

namespace {

Status call_error(std::string_view key, const SharedRateRequest& r, const SharedRateStore& s,
                  Nanos timeout) {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (std::string why = s.rule_error(r.rule); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  return {};
}

}  // namespace

StatusOr<SharedRateReply> RedisSharedRate::apply(std::string_view key,
                                                 const SharedRateRequest& request,
                                                 Nanos timeout) noexcept {
  const SharedRateCall call{key, &request};
  std::vector<StatusOr<SharedRateReply>> out = apply_many({&call, 1}, timeout);
  if (out.empty()) return Status(StatusCode::kResourceExhausted, "redis: out of memory");
  return std::move(out.front());
}

std::vector<StatusOr<SharedRateReply>> RedisSharedRate::apply_many(
    std::span<const SharedRateCall> calls, Nanos timeout) noexcept {
  std::vector<StatusOr<SharedRateReply>> out;
  try {
    out.reserve(calls.size());
    std::vector<std::size_t> slot;  // the call each sent one answers
    for (std::size_t i = 0; i < calls.size(); ++i) {
      Status bad = call_error(calls[i].key, *calls[i].request, *this, timeout);
      out.emplace_back(bad.ok() ? Status(StatusCode::kInternal, "redis: no reply") : bad);
      if (bad.ok()) slot.push_back(i);
    }
    if (slot.empty()) return out;
    const std::size_t chunks = (slot.size() + kPerCall - 1) / kPerCall;
    using Replies = std::vector<StatusOr<RedisConnection::Reply>>;
    StatusOr<Replies> replies =
        impl_->lane().call(timeout, [&](RedisConnection::Session& s) -> StatusOr<Replies> {
          auto run_id = s.server_run_id();  // connected first: the server these calls run on
          if (!run_id.ok()) return run_id.status();
          std::vector<RedisConnection::EvalCall> sent;
          sent.reserve(chunks);
          for (std::size_t c = 0; c < chunks; ++c)
            sent.push_back(impl_->script_call(calls, slot, c * kPerCall,
                                              std::min(slot.size(), (c + 1) * kPerCall),
                                              run_id.value()));
          return s.eval_many(0, sent);
        });
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t from = c * kPerCall, to = std::min(slot.size(), (c + 1) * kPerCall);
      if (!replies.ok() || !replies.value()[c].ok()) {
        const Status why = replies.ok() ? replies.value()[c].status() : replies.status();
        for (std::size_t j = from; j < to; ++j) out[slot[j]] = why;
        continue;
      }
      const redisReply* r = replies.value()[c].value().get();
      std::size_t want = 1;
      for (std::size_t j = from; j < to; ++j) want += reply_ints(calls[slot[j]].request->op);
      const bool whole = r->type == REDIS_REPLY_ARRAY && r->elements == want;
      std::size_t at = 1;
      for (std::size_t j = from; j < to; ++j) {
        const SharedRateOp op = calls[slot[j]].request->op;
        out[slot[j]] = whole ? reply_at(r, at, op)
                             : Status(StatusCode::kInternal, "redis: unexpected shared rate reply");
        at += reply_ints(op);
      }
    }
  } catch (...) {
    out.clear();
  }
  return out;
}

Status RedisSharedRate::adopt(Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  const Impl& m = *impl_;
  return impl_->lane().call(timeout, [&](RedisConnection::Session& s) -> Status {
    auto run_id = s.server_run_id();
    if (!run_id.ok()) return run_id.status();
    auto r = s.eval(1, {m.prefix + "origin", m.prefix + "server"}, {run_id.value()});
    return r.ok() ? Status() : r.status();
  });
}

Status RedisSharedRate::health(Nanos timeout) noexcept { return impl_->lane().ping(timeout); }

}  // namespace sluice
