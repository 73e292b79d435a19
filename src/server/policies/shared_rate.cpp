// A rate policy on a SharedRateStore: each check one coordinator call (batched with concurrent
// ones), refusals cached until their retry_after, an outage answered by the configured mode.
#include "server/policies/shared_rate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "core/string_map.h"
#include "server/completion.h"
#include "server/policies/rate.h"

namespace sluice::server {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr std::size_t kBatch = 256;         // calls taken off the queue at once
constexpr std::size_t kMaxQueued = 65'536;  // calls waiting for a coordinator call, at most
constexpr std::string_view kUnreachable = "coordinator_unreachable";
constexpr std::string_view kBacklog = "coordinator_backlog";

using Done = Once<void(StatusOr<SharedRateReply>)>;

struct Pending {
  std::string key;  // the store's: "<budget>:<key>"
  SharedRateRequest request;
  Nanos queued{0};
  Done done;
};

// A few threads that send what is queued to the store in batches (one apply_many() each), so
// that a busy policy makes one round trip for many checks. A call that waited longer than the
// timeout before its batch went out fails without being sent.
class Batcher {
 public:
  Batcher(SharedRateStore& store, const Clock& clock, Nanos timeout, std::size_t threads)
      : store_(store), clock_(clock), timeout_(timeout) {
    for (std::size_t i = 0; i < std::max<std::size_t>(1, threads); ++i)
      workers_.emplace_back([this] { work(); });
  }
  // Sends what is queued (each call is answered), then joins.
  ~Batcher() {
    {
      const std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues `p` (moved from) unless kMaxQueued calls wait already: false, and `p` is untouched.
  bool post(Pending& p) {
    {
      const std::lock_guard lock(mu_);
      if (queue_.size() >= kMaxQueued) return false;
      queue_.push_back(std::move(p));
    }
    cv_.notify_one();
    return true;
  }

 private:
  void work() {
    std::vector<Pending> batch;
    std::vector<SharedRateCall> calls;
    std::vector<std::size_t> sent;
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      batch.clear();
      while (!queue_.empty() && batch.size() < kBatch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      lock.unlock();
      const Nanos now = clock_.now();
      calls.clear();
      sent.clear();
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (now - batch[i].queued > timeout_) {
          batch[i].done(Status(StatusCode::kDeadlineExceeded,
                               "waited longer than coordinator_timeout for a coordinator call"));
          continue;
        }
        calls.push_back({batch[i].key, &batch[i].request});
        sent.push_back(i);
      }
      if (!calls.empty()) {
        std::vector<StatusOr<SharedRateReply>> replies = store_.apply_many(calls, timeout_);
        for (std::size_t j = 0; j < sent.size(); ++j)
          batch[sent[j]].done(replies.size() == calls.size()
                                  ? std::move(replies[j])
                                  : StatusOr<SharedRateReply>(
                                        Status(StatusCode::kResourceExhausted, "out of memory")));
      }
      lock.lock();
    }
  }

  SharedRateStore& store_;
  const Clock& clock_;
  const Nanos timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// Refusals by key, each until its retry_after: a check of at least that many hits is refused
// without a call. Sharded; at most max_keys keys (past it, a refusal is not cached).
class RefusalCache {
 public:
  explicit RefusalCache(std::size_t max_keys)
      : per_shard_(std::max<std::size_t>(1, max_keys / kShards)) {}

  std::optional<RateDecision> find(std::string_view key, std::uint64_t hits, Nanos now) {
    Shard& s = shard(key);
    const std::lock_guard lock(s.mu);
    auto it = s.map.find(key);
    if (it == s.map.end()) return std::nullopt;
    const Entry& e = it->second;
    if (now >= e.until) {
      s.map.erase(it);
      return std::nullopt;
    }
    if (hits < e.hits) return std::nullopt;
    RateDecision d = e.decision;
    d.retry_after = e.until - now;
    d.reset_after = std::max(Nanos{0}, d.reset_after - (now - e.at));
    return d;
  }
  // `d`, a refusal of `hits` sent at `at`.
  void put(std::string_view key, std::uint64_t hits, Nanos at, const RateDecision& d) {
    if (d.retry_after == Nanos::max() || d.retry_after <= Nanos{0}) return;
    const Entry e{hits, at + d.retry_after, at, d};
    Shard& s = shard(key);
    const std::lock_guard lock(s.mu);
    auto it = s.map.find(key);
    if (it != s.map.end()) {
      // Kept when it still refuses more (fewer hits) than this one would.
      if (it->second.until > at && it->second.hits < hits) return;
      it->second = e;
      return;
    }
    if (s.map.size() >= per_shard_) {
      std::erase_if(s.map, [at](const auto& kv) { return kv.second.until <= at; });
      if (s.map.size() >= per_shard_) return;
    }
    s.map.emplace(std::string(key), e);
  }
  void erase(std::string_view key) {
    Shard& s = shard(key);
    const std::lock_guard lock(s.mu);
    if (auto it = s.map.find(key); it != s.map.end()) s.map.erase(it);
  }
  void sweep(Nanos now) {
    for (Shard& s : shards_) {
      const std::lock_guard lock(s.mu);
      std::erase_if(s.map, [now](const auto& kv) { return kv.second.until <= now; });
    }
  }
  [[nodiscard]] std::size_t size() {
    std::size_t n = 0;
    for (Shard& s : shards_) {
      const std::lock_guard lock(s.mu);
      n += s.map.size();
    }
    return n;
  }

 private:
  static constexpr std::size_t kShards = 16;
  struct Entry {
    std::uint64_t hits;
    Nanos until;
    Nanos at;
    RateDecision decision;
  };
  struct Shard {
    std::mutex mu;
    StringMap<Entry> map;
  };
  Shard& shard(std::string_view key) { return shards_[StringHash{}(key) % kShards]; }

  const std::size_t per_shard_;
  std::array<Shard, kShards> shards_;
};

// Leased hits by key (the leased mode), each lot until its expiry: spent here without a call.
class LeaseBook {
 public:
  explicit LeaseBook(std::size_t max_keys)
      : per_shard_(std::max<std::size_t>(1, max_keys / kShards)) {}

  // `hits` spent from the key's lease: the decision, or nullopt when it has too few. An expired
  // lease is dropped and what it held added to `give_back`.
  std::optional<RateDecision> spend(std::string_view key, std::uint64_t hits, Nanos now,
                                    std::uint64_t& give_back) {
    Shard& s = shard(key);
    const std::lock_guard lock(s.mu);
    auto it = s.map.find(key);
    if (it == s.map.end()) return std::nullopt;
    Held& h = it->second;
    if (now >= h.expires) {
      give_back += h.left;
      s.map.erase(it);
      return std::nullopt;
    }
    if (h.left < hits) return std::nullopt;
    h.left -= hits;
    RateDecision d = h.last;
    d.allowed = true;
    d.remaining = h.left;
    d.retry_after = Nanos{0};
    d.reset_after = std::max(Nanos{0}, d.reset_after - (now - h.at));
    return d;
  }
  // Adds `n` leased hits that expire at `expires`; false (nothing added) when the book is full.
  bool add(std::string_view key, std::uint64_t n, Nanos expires, Nanos at, const RateDecision& d) {
    Shard& s = shard(key);
    const std::lock_guard lock(s.mu);
    auto it = s.map.find(key);
    if (it != s.map.end()) {
      // One lot: the earlier expiry, so that no hit is spent later than its own allows.
      it->second.left += n;
      it->second.expires = std::min(it->second.expires, expires);
      it->second.last = d;
      it->second.at = at;
      return true;
    }
    if (s.map.size() >= per_shard_) return false;
    s.map.emplace(std::string(key), Held{n, expires, at, d});
    return true;
  }
  // Removes the leases expired at `now` (all when `now` is Nanos::max()): (key, hits unspent).
  std::vector<std::pair<std::string, std::uint64_t>> expired(Nanos now) {
    std::vector<std::pair<std::string, std::uint64_t>> out;
    for (Shard& s : shards_) {
      const std::lock_guard lock(s.mu);
      for (auto it = s.map.begin(); it != s.map.end();) {
        if (now >= it->second.expires) {
          if (it->second.left > 0) out.emplace_back(it->first, it->second.left);
          it = s.map.erase(it);
        } else {
          ++it;
        }
      }
    }
    return out;
  }
  [[nodiscard]] std::uint64_t held() {
    std::uint64_t n = 0;
    for (Shard& s : shards_) {
      const std::lock_guard lock(s.mu);
      for (const auto& kv : s.map) n += kv.second.left;
    }
    return n;
  }

 private:
  static constexpr std::size_t kShards = 16;
  struct Held {
    std::uint64_t left;
    Nanos expires;
    Nanos at;  // when `last` was decided (sent)
    RateDecision last;
  };
  struct Shard {
    std::mutex mu;
    StringMap<Held> map;
  };
  Shard& shard(std::string_view key) { return shards_[StringHash{}(key) % kShards]; }

  const std::size_t per_shard_;
  std::array<Shard, kShards> shards_;
};

class SharedRatePolicy final : public Policy, public RateFamily {
 public:
  SharedRatePolicy(const BuildContext& c, const RateRule& rule, std::size_t max_keys,
                   const SharedRateSettings& s, std::shared_ptr<SharedRateStore> store)
      : Policy(c.name, "rate", c.spec.rate),
        rule_(rule),
        settings_(s),
        budget_(s.budget.empty() ? c.name : s.budget),
        max_keys_(max_keys),
        store_(std::move(store)),
        clock_(c.clock),
        cache_(max_keys),
        leases_(max_keys),
        batcher_(*store_, c.clock, s.coordinator_timeout, s.io_threads) {
    const Nanos every = settings_.lease > 0
                            ? std::min<Nanos>(settings_.lease_hold, std::chrono::seconds(1))
                            : std::chrono::seconds(1);
    start_loop(c.clock, [this, every](Nanos now) {
      cache_.sweep(now);
      give_back(leases_.expired(now), now);
      return now + every;
    });
  }
  // The loop first; then what is leased is given back, and the batcher (the last member) sends
  // what it holds.
  ~SharedRatePolicy() override {
    retire();
    give_back(leases_.expired(Nanos::max()), clock_.now());
  }
  SharedRatePolicy(const SharedRatePolicy&) = delete;
  SharedRatePolicy& operator=(const SharedRatePolicy&) = delete;

  // Rebuilt on any change: the state is the coordinator's, which carries each key to the new rule.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& /*c*/) override {
    return Reconfiguration{};
  }

  [[nodiscard]] RateFamily* rate_family() noexcept override { return this; }

  Status adopt(Nanos timeout) {
    Status s = store_->adopt(timeout);
    if (s.ok()) cache_.sweep(Nanos::max());  // refusals made before may be a loss's
    return s;
  }

  Decided<RateDecision> check_or_defer(std::string_view key, std::uint64_t hits, Nanos now,
                                       Deferral<RateDecision>& later) override {
    if (auto d = without_call(key, hits, now)) return count(*d);
    if (retired()) return Status(StatusCode::kUnavailable, "policy " + name() + " was retired");
    auto h = std::make_shared<Handoff<RateDecision>>();
    if (!send(key, hits, now, [this, h](RateDecision d) {
          std::unique_lock lock(h->mu);
          if (!h->returned) {
            h->early = d;
            return;
          }
          Completion<RateDecision> done = std::move(h->later);
          lock.unlock();
          done(count(d));
        }))
      return count(outage(now, kBacklog));
    const std::lock_guard lock(h->mu);
    h->returned = true;
    if (h->early) return count(*h->early);
    h->later = later.defer();
    return std::nullopt;
  }
  // The inline answer (a chained admit's gate): waits for the call, at most its timeout.
  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    if (auto d = without_call(key, hits, now)) return count(*d);
    OneShot<RateDecision> done;
    auto set = std::make_shared<Once<void(RateDecision)>>(done.setter());
    if (!send(key, hits, now, [set](RateDecision d) { (*set)(d); }))
      return count(outage(now, kBacklog));
    return count(done.get());
  }
  RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const override {
    SharedRateRequest r{SharedRateOp::kPeek, rule_, hits};
    auto reply = store_->apply(store_key(key), r, settings_.coordinator_timeout);
    if (!reply.ok()) return outage(now, kUnreachable);
    return reply.value().decision;
  }
  // Sent in the background: until it lands the key is stricter than it needs to be, never
  // laxer. A refusal cached for the key is dropped.
  void refund(std::string_view key, std::uint64_t hits, Nanos now) override {
    cache_.erase(key);
    Pending p{
        store_key(key), {SharedRateOp::kRefund, rule_, hits}, now, [](StatusOr<SharedRateReply>) {
        }};
    (void)batcher_.post(p);
  }
  StatusOr<RateCharge> charge(std::string_view key, std::uint64_t hits, Nanos now) override {
    OneShot<StatusOr<SharedRateReply>> done;
    auto set = std::make_shared<Once<void(StatusOr<SharedRateReply>)>>(done.setter());
    Pending p{store_key(key),
              {SharedRateOp::kCharge, rule_, hits},
              now,
              [set](StatusOr<SharedRateReply> r) { (*set)(std::move(r)); }};
    if (!batcher_.post(p))
      return Status(StatusCode::kUnavailable, "rate policy " + name() +
                                                  ": too many calls wait for the coordinator; "
                                                  "the charge was not recorded");
    StatusOr<SharedRateReply> r = done.get();
    if (!r.ok()) {
      failed(r.status());
      return Status(StatusCode::kUnavailable,
                    "rate policy " + name() + ": the coordinator (" +
                        std::string(store_->backend()) +
                        ") did not record the charge: " + r.status().message());
    }
    cache_.erase(key);
    charged_.fetch_add(hits, std::memory_order_relaxed);
    if (hits > 0 && r.value().charge.overdraft > 0)
      overdrawn_.fetch_add(1, std::memory_order_relaxed);
    return r.value().charge;
  }
  Rejection refusal(std::string_view key, const RateDecision& d) const override {
    std::ostringstream detail;
    detail << "Rate policy " << name() << " allows " << rule_.limit << " per "
           << seconds_of(rule_.period) << "s for key '" << key << "' across every server";
    if (d.reason == kUnreachable)
      detail << " (coordinator_unreachable: its coordinator (" << store_->backend()
             << ") did not answer, and outage is fail-closed)";
    else if (d.reason == kBacklog)
      detail << " (coordinator_backlog: more calls wait for its coordinator than this server "
                "queues)";
    Rejection out = rate_refusal(name(), detail.str(), d);
    if (d.reason == kUnreachable || d.reason == kBacklog) out.status = 503;
    return out;
  }
  PolicyReadiness readiness() const override {
    if (!in_backoff(clock_.now())) return {};
    if (settings_.fail_open)
      return {true, "coordinator " + settings_.coordinator +
                        " unreachable: admitting every check (outage: fail-open)"};
    return {false, "coordinator " + settings_.coordinator +
                       " unreachable: refusing every check (outage: fail-closed)"};
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    info.limit = rule_.limit;
    j["strategy"] = std::string(to_string(rule_.strategy));
    j["limit"] = rule_.limit;
    j["period_seconds"] = seconds_of(rule_.period);
    if (rule_.burst != 0) j["burst"] = rule_.burst;
    j["coordinator"] = std::string(store_->backend());
    j["scope"] = store_->backend() == "memory" ? "process" : "shared";
    j["budget"] = budget_;
    j["outage"] = settings_.fail_open ? "fail-open" : "fail-closed";
    j["in_outage"] = in_backoff(clock_.now());
    j["refusal_cache"] = settings_.refusal_cache;
    j["cached_refusal_keys"] = cache_.size();
    j["max_keys"] = max_keys_;
    j["allowed"] = allowed_.load(std::memory_order_relaxed);
    j["denied"] = denied_.load(std::memory_order_relaxed);
    j["refused_from_cache"] = cached_.load(std::memory_order_relaxed);
    j["coordinator_calls"] = calls_.load(std::memory_order_relaxed);
    j["coordinator_failures"] = failures_.load(std::memory_order_relaxed);
    j["outage_answers"] = outage_answers_.load(std::memory_order_relaxed);
    j["charged"] = charged_.load(std::memory_order_relaxed);
    j["overdrawn"] = overdrawn_.load(std::memory_order_relaxed);
    if (settings_.lease > 0) {
      j["lease"] = settings_.lease;
      j["lease_hold_seconds"] = seconds_of(settings_.lease_hold);
      j["leased_hits"] = leased_.load(std::memory_order_relaxed);
      j["allowed_from_lease"] = from_lease_.load(std::memory_order_relaxed);
      j["given_back_hits"] = given_back_.load(std::memory_order_relaxed);
      j["held_hits"] = leases_.held();
    }
  }
  void metrics(std::vector<MetricFamily>& out) const override {
    out.push_back(by_label("sluice_rate_decisions_total", "Rate checks by decision", "decision",
                           {{"allowed", allowed_.load()}, {"denied", denied_.load()}}));
    out.push_back(one("sluice_rate_limit", "Hits per period", MetricType::Gauge,
                      static_cast<double>(rule_.limit)));
    out.push_back(one("sluice_rate_refusal_cache_hits_total",
                      "Checks refused from the refusal cache, without a coordinator call",
                      MetricType::Counter, static_cast<double>(cached_.load())));
    out.push_back(one("sluice_rate_refusal_cache_keys", "Keys with a cached refusal",
                      MetricType::Gauge, static_cast<double>(cache_.size())));
    out.push_back(one("sluice_rate_coordinator_calls_total",
                      "Checks sent to the coordinator of a shared rate policy", MetricType::Counter,
                      static_cast<double>(calls_.load())));
    out.push_back(one("sluice_rate_coordinator_failures_total",
                      "Checks whose coordinator call failed or timed out", MetricType::Counter,
                      static_cast<double>(failures_.load())));
    out.push_back(one("sluice_rate_outage_answers_total",
                      "Checks answered by the outage mode (coordinator unreachable or backlogged)",
                      MetricType::Counter, static_cast<double>(outage_answers_.load())));
    out.push_back(one("sluice_rate_charged_hits_total", "Hits charged after the fact (Charge)",
                      MetricType::Counter, static_cast<double>(charged_.load())));
    out.push_back(one("sluice_rate_overdrawn_total",
                      "Charges that left their key past its limit (an overdraft)",
                      MetricType::Counter, static_cast<double>(overdrawn_.load())));
  }

 private:
  std::string store_key(std::string_view key) const {
    std::string out;
    out.reserve(budget_.size() + 1 + key.size());
    out += budget_;
    out += ':';
    out += key;
    return out;
  }
  bool in_backoff(Nanos now) const {
    return now.count() < down_until_.load(std::memory_order_relaxed);
  }
  // The answer without a call: a cached refusal, or the outage mode during a backoff.
  std::optional<RateDecision> without_call(std::string_view key, std::uint64_t hits, Nanos now) {
    if (settings_.refusal_cache)
      if (auto d = cache_.find(key, hits, now)) {
        cached_.fetch_add(1, std::memory_order_relaxed);
        return d;
      }
    if (settings_.lease > 0) {
      std::uint64_t expired = 0;
      std::optional<RateDecision> d = leases_.spend(key, hits, now, expired);
      if (expired > 0) give_back({{std::string(key), expired}}, now);
      if (d) {
        from_lease_.fetch_add(1, std::memory_order_relaxed);
        return d;
      }
    }
    if (in_backoff(now)) return outage(now, kUnreachable);
    return std::nullopt;
  }
  RateDecision outage(Nanos now, std::string_view reason) const {
    outage_answers_.fetch_add(1, std::memory_order_relaxed);
    RateDecision d;
    d.limit = rule_.strategy == RateStrategy::kGcra && rule_.burst != 0 ? rule_.burst : rule_.limit;
    if (settings_.fail_open) {
      d.allowed = true;
      return d;
    }
    d.reason = reason;
    d.retry_after = std::max(Nanos{1}, Nanos{down_until_.load(std::memory_order_relaxed)} - now);
    if (reason == kBacklog) d.retry_after = settings_.coordinator_timeout;
    return d;
  }
  void failed(const Status& /*why*/) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    down_until_.store((clock_.now() + settings_.retry_backoff).count(), std::memory_order_relaxed);
  }
  // Queues a check; `answer` gets its decision (on a worker thread). False: the queue is full.
  template <class F>
  bool send(std::string_view key, std::uint64_t hits, Nanos now, F answer) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    const bool take = settings_.lease > 0 && hits <= burst();
    Pending p{store_key(key),
              {take ? SharedRateOp::kTake : SharedRateOp::kCheck, rule_,
               take ? std::max(settings_.lease, hits) : hits},
              now,
              [this, key = std::string(key), hits, now, take,
               answer = std::move(answer)](StatusOr<SharedRateReply> r) mutable {
                answer(take ? leased(key, hits, now, r) : decided(key, hits, now, r));
              }};
    return batcher_.post(p);
  }
  RateDecision decided(std::string_view key, std::uint64_t hits, Nanos sent,
                       const StatusOr<SharedRateReply>& r) {
    if (!r.ok()) {
      failed(r.status());
      return outage(sent, kUnreachable);
    }
    const RateDecision& d = r.value().decision;
    if (!d.allowed && settings_.refusal_cache) cache_.put(key, hits, sent, d);
    return d;
  }
  // A take's reply for a check of `hits` sent at `sent`: the check admitted from what it took, the
  // rest leased until sent + lease_hold.
  RateDecision leased(std::string_view key, std::uint64_t hits, Nanos sent,
                      const StatusOr<SharedRateReply>& r) {
    if (!r.ok()) {
      failed(r.status());
      return outage(sent, kUnreachable);
    }
    const std::uint64_t g = r.value().granted;
    RateDecision d = r.value().decision;
    if (g == 0) {  // the coordinator's refusal of one hit: exact for one, safe for more
      if (settings_.refusal_cache) cache_.put(key, hits, sent, d);
      return d;
    }
    const std::uint64_t left = g >= hits ? g - hits : g;
    if (left > 0 && !leases_.add(key, left, sent + settings_.lease_hold, sent, d))
      give_back({{std::string(key), left}}, sent);  // the book is full: not kept
    leased_.fetch_add(g, std::memory_order_relaxed);
    if (g >= hits) {
      d.remaining += left;  // the coordinator's, and this server's lease
      return d;
    }
    // Fewer than asked: refused, the hits taken kept for smaller checks; retry_after estimated
    // from the rate (the time the missing hits take to come back).
    d.allowed = false;
    d.remaining = g;
    const auto missing = static_cast<double>(hits - g);
    d.retry_after = Nanos{static_cast<std::int64_t>(std::ceil(
        missing * static_cast<double>(rule_.period.count()) / static_cast<double>(rule_.limit)))};
    return d;
  }
  // Refunds unspent leased hits (in the background: never laxer while they are on their way).
  void give_back(const std::vector<std::pair<std::string, std::uint64_t>>& lots, Nanos now) {
    for (const auto& [key, n] : lots) {
      given_back_.fetch_add(n, std::memory_order_relaxed);
      Pending p{
          store_key(key), {SharedRateOp::kRefund, rule_, n}, now, [](StatusOr<SharedRateReply>) {}};
      (void)batcher_.post(p);
    }
  }
  std::uint64_t burst() const { return rule_.burst != 0 ? rule_.burst : rule_.limit; }
  const RateDecision& count(const RateDecision& d) {
    (d.allowed ? allowed_ : denied_).fetch_add(1, std::memory_order_relaxed);
    return d;
  }

  const RateRule rule_;
  const SharedRateSettings settings_;
  const std::string budget_;
  const std::size_t max_keys_;
  std::shared_ptr<SharedRateStore> store_;
  const Clock& clock_;
  // mutable: state() and metrics() read their sizes
  mutable RefusalCache cache_;
  mutable LeaseBook leases_;
  std::atomic<std::uint64_t> leased_{0}, from_lease_{0}, given_back_{0};
  std::atomic<std::int64_t> down_until_{INT64_MIN};  // no call before this (ns); a backoff
  std::atomic<std::uint64_t> allowed_{0}, denied_{0}, cached_{0}, calls_{0}, failures_{0};
  mutable std::atomic<std::uint64_t> outage_answers_{0};
  std::atomic<std::uint64_t> charged_{0}, overdrawn_{0};
  // Last: destroyed first, it answers what it still holds while the rest is alive.
  Batcher batcher_;
};

}  // namespace

Status adopt_coordinator(Policy& policy, Nanos timeout) {
  auto* shared = dynamic_cast<SharedRatePolicy*>(&policy);
  if (shared == nullptr)
    return Status(StatusCode::kInvalidArgument,
                  "policy: " + policy.name() + " keeps no keys at a coordinator");
  return shared->adopt(timeout);
}

std::shared_ptr<Policy> make_shared_rate_policy(const BuildContext& c, const RateRule& rule,
                                                std::size_t max_keys,
                                                const SharedRateSettings& settings,
                                                std::shared_ptr<SharedRateStore> store) {
  return std::make_shared<SharedRatePolicy>(c, rule, max_keys, settings, std::move(store));
}

}  // namespace sluice::server
