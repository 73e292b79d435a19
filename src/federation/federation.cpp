#include "sluice/federation/federation.h"

#include <algorithm>
#include <deque>
#include <future>
#include <iterator>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "core/string_map.h"
#include "sluice/core/pool_lease.h"

namespace sluice {

std::string_view to_string(FederationOutage o) noexcept {
  return o == FederationOutage::kRegionalOnly ? "regional-only" : "fail-closed";
}

std::string FederationOptions::validate() const {
  if (region.empty()) return "region: must not be empty";
  if (budget_id.find(':') != std::string::npos) return "budget: must not contain ':'";
  if (budget.limit == 0) return "limit: must be at least 1";
  if (budget.period <= Nanos{0}) return "window: must be positive";
  if (budget.period > kMaxRatePeriod) return "window: must be at most 100 years";
  if (batch == 0) return "batch: must be at least 1";
  if (lease_timeout <= Nanos{0}) return "lease_timeout: must be positive";
  if (retry_backoff <= Nanos{0}) return "retry_backoff: must be positive";
  if (drift_ppm >= 1'000'000) return "drift_ppm: must be below 1000000";
  if (min_window_left < Nanos{0}) return "min_window_left: must not be negative";
  if (max_keys == 0) return "max_keys: must be at least 1";
  if (coordinator_health_check <= Nanos{0}) return "coordinator_health_check: must be positive";
  return {};
}

namespace {
constexpr std::size_t kShards = 16;
// Leases sent in one lease_many() call, at most.
constexpr std::size_t kPipeline = 64;
// drain_leases() running at once, at most: with two, the coordinator has the next batch while
// one batch's replies are handled (cold keys on Redis: bench/README.md).
constexpr int kDrainers = 2;
}  // namespace

// A key's state (the core's) and the callbacks of its parked checks, one per state.waiting entry.
struct FederatedLimiter::Key {
  FederatedKey state;
  std::deque<Callback> parked;
};

struct FederatedLimiter::Shard {
  mutable std::mutex mu;
  StringMap<Key> keys;
};

FederatedLimiter::FederatedLimiter(RateCoordinator& coordinator, RegionalEscrow* pool,
                                   const Clock& clock, FederationOptions options, IoExecutor io)
    : coordinator_(coordinator),
      pool_(pool),
      clock_(clock),
      options_(std::move(options)),
      rules_{options_.budget, options_.batch,
             options_.refill_below != 0 ? options_.refill_below
                                        : std::max<std::uint64_t>(1, options_.batch / 4),
             options_.retry_backoff,
             pool != nullptr && options_.outage == FederationOutage::kRegionalOnly},
      regional_batch_(options_.regional_batch != 0 ? options_.regional_batch : 4 * options_.batch),
      io_(std::move(io)),
      shards_(std::make_unique<Shard[]>(kShards)) {
  drift_in_force_.store(options_.drift_ppm, std::memory_order_relaxed);
}

FederatedLimiter::~FederatedLimiter() {
  std::unique_lock lock(io_mu_);
  io_cv_.wait(lock, [&] { return io_pending_ == 0; });
}

std::string FederatedLimiter::global_key(const std::string& key) const {
  return options_.budget_id.empty() ? key : options_.budget_id + ":" + key;
}

FederatedLimiter::Shard& FederatedLimiter::shard_of(std::string_view key) noexcept {
  return shards_[StringHash{}(key) % kShards];
}

void FederatedLimiter::post(std::function<void()> task) {
  {
    const std::lock_guard lock(io_mu_);
    ++io_pending_;
  }
  io_([this, task = std::move(task)] {
    task();
    const std::lock_guard lock(io_mu_);
    if (--io_pending_ == 0) io_cv_.notify_all();
  });
}

void FederatedLimiter::lease_async(std::string key, std::uint64_t want, std::uint64_t need) {
  leases_.fetch_add(1, std::memory_order_relaxed);
  need = std::min(need, want);
  if (pool_ != nullptr) {
    post([this, key = std::move(key), want, need] {
      on_lease(key, lease_through_pool(key, want, need));
    });
    return;
  }
  bool start = false;
  {
    const std::lock_guard lock(lease_mu_);
    lease_queue_.push_back({std::move(key), want, need});
    start = starting_ == 0 && drainers_ < kDrainers;
    if (start) {
      ++drainers_;
      ++starting_;
    }
  }
  if (start) post([this] { drain_leases(); });
}

void FederatedLimiter::drain_leases() {
  std::vector<QueuedLease> batch;
  for (bool first = true;; first = false) {
    batch.clear();
    {
      const std::lock_guard lock(lease_mu_);
      if (first) --starting_;
      if (lease_queue_.empty()) {
        --drainers_;
        return;
      }
      const std::size_t n = std::min(lease_queue_.size(), kPipeline);
      batch.assign(std::make_move_iterator(lease_queue_.begin()),
                   std::make_move_iterator(lease_queue_.begin() + static_cast<long>(n)));
      lease_queue_.erase(lease_queue_.begin(), lease_queue_.begin() + static_cast<long>(n));
    }
    if (batch.size() == 1) {
      on_lease(batch[0].key, lease_direct(batch[0].key, batch[0].want, batch[0].need));
      continue;
    }
    std::vector<std::string> keys;
    std::vector<LeaseRequest> requests(batch.size());
    std::vector<LeaseCall> calls(batch.size());
    keys.reserve(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      keys.push_back(global_key(batch[i].key));
      requests[i].region = options_.region;
      requests[i].spec = options_.budget;
      requests[i].want = batch[i].want;
      requests[i].need = batch[i].need;
      requests[i].min_window_left = options_.min_window_left;
      calls[i] = LeaseCall{keys[i], &requests[i]};
    }
    const Nanos sent_at = clock_.now();  // no reply can be decided before this
    std::vector<StatusOr<LeaseReply>> replies =
        coordinator_.lease_many(calls, options_.lease_timeout);
    for (std::size_t i = 0; i < batch.size(); ++i) {
      Outcome o;
      o.sent_at = sent_at;
      if (i < replies.size())
        o.reply = std::move(replies[i]);
      else
        o.reply = StatusOr<LeaseReply>(Status(StatusCode::kInternal, "lease_many: no reply"));
      on_lease(batch[i].key, std::move(o));
    }
  }
}

FederatedLimiter::Outcome FederatedLimiter::lease_direct(const std::string& key, std::uint64_t want,
                                                         std::uint64_t need) {
  Outcome o;
  LeaseRequest req;
  req.region = options_.region;
  req.spec = options_.budget;
  req.want = want;
  req.need = need;
  req.min_window_left = options_.min_window_left;
  o.sent_at = clock_.now();  // the reply cannot be decided before this
  o.reply = coordinator_.lease(global_key(key), req, options_.lease_timeout);
  return o;
}

FederatedLimiter::Outcome FederatedLimiter::lease_through_pool(const std::string& key,
                                                               std::uint64_t want,
                                                               std::uint64_t need) {
  // The calls PoolLease (sluice/core/pool_lease.h) asks for, in turn.
  const std::string gk = global_key(key);
  const PoolLeaseRules rules{options_.budget.period, regional_batch_, options_.drift_ppm,
                             options_.coordinator_health_check};
  const bool outage = options_.outage == FederationOutage::kRegionalOnly &&
                      in_outage_.load(std::memory_order_relaxed);
  const Nanos now = clock_.now();
  PoolLease l;
  start_pool_lease(l, want, need, outage,
                   now.count() >= pool_down_until_.load(std::memory_order_relaxed), now);
  while (l.next != PoolCall::kDone) {
    switch (l.next) {
      case PoolCall::kTake: {
        StatusOr<PoolReply> t = pool_->take(gk, l.want, 2 * options_.lease_timeout,
                                            l.outcome.outage, options_.lease_timeout);
        on_pool_take(l, t, clock_.now(), rules);
        break;
      }
      case PoolCall::kLease: {
        Outcome direct = lease_direct(key, l.ask, l.lease_need);
        on_pool_lease(l, std::move(*direct.reply), direct.sent_at,
                      drift_in_force_.load(std::memory_order_relaxed), rules);
        break;
      }
      case PoolCall::kRefill: {
        StatusOr<PoolReply> f =
            pool_->refill(gk, l.refill_window, l.extra, l.refill_expires, options_.lease_timeout);
        on_pool_refill(l, f, clock_.now());
        break;
      }
      case PoolCall::kDone:
        break;
    }
    if (l.pool_failed_at) {
      pool_failures_.fetch_add(1, std::memory_order_relaxed);
      pool_down_until_.store((*l.pool_failed_at + options_.retry_backoff).count(),
                             std::memory_order_relaxed);
    }
  }
  if (l.refilled > 0) pool_refilled_.fetch_add(l.refilled, std::memory_order_relaxed);
  if (l.forfeited > 0) {
    forfeited_.fetch_add(l.forfeited, std::memory_order_relaxed);
    granted_.fetch_add(l.forfeited, std::memory_order_relaxed);
  }
  return std::move(l.outcome);
}

void FederatedLimiter::maybe_probe(Nanos now) {
  if (!in_outage_.load(std::memory_order_relaxed)) return;
  std::int64_t due = next_probe_.load(std::memory_order_relaxed);
  if (now.count() < due) return;
  // One probe per interval: the check that moves the next probe's time makes this one.
  if (!next_probe_.compare_exchange_strong(due, (now + options_.coordinator_health_check).count(),
                                           std::memory_order_relaxed))
    return;
  post([this] {
    if (coordinator_.health(options_.lease_timeout).ok())
      in_outage_.store(false, std::memory_order_relaxed);
  });
}

void FederatedLimiter::apply(const std::string& key, const KeyEffects& e, Tasks& io) {
  if (e.granted > 0) granted_.fetch_add(e.granted, std::memory_order_relaxed);
  if (e.pool_taken > 0) pool_taken_.fetch_add(e.pool_taken, std::memory_order_relaxed);
  if (e.forfeited > 0) forfeited_.fetch_add(e.forfeited, std::memory_order_relaxed);
  if (e.spent > 0) spent_.fetch_add(e.spent, std::memory_order_relaxed);
  if (e.spec_mismatch) spec_mismatches_.fetch_add(1, std::memory_order_relaxed);
  if (e.forgiven > 0) forgiven_.fetch_add(e.forgiven, std::memory_order_relaxed);
  for (const GivenUp& g : e.given_up) {
    if (pool_ != nullptr)
      io.push_back(
          [this, key, w = g.window_start, units = g.units] { send_release(key, w, units); });
    else
      io.push_back(
          [this, key, w = g.window_start, total = g.total] { send_reconcile(key, w, total); });
  }
}

void FederatedLimiter::send_release(const std::string& key, Nanos window_start,
                                    std::uint64_t units) {
  post([this, key, window_start, units] {
    StatusOr<PoolReply> r =
        pool_->release(global_key(key), window_start, units, options_.lease_timeout);
    if (!r.ok())
      pool_failures_.fetch_add(1, std::memory_order_relaxed);
    else
      pool_refilled_.fetch_add(r.value().granted, std::memory_order_relaxed);
  });
}

void FederatedLimiter::send_reconcile(const std::string& key, Nanos window_start,
                                      std::uint64_t total) {
  post([this, key, window_start, total] {
    StatusOr<std::uint64_t> r = coordinator_.reconcile(global_key(key), options_.region,
                                                       window_start, total, options_.lease_timeout);
    if (!r.ok()) reconcile_failures_.fetch_add(1, std::memory_order_relaxed);
  });
}

std::optional<FederatedDecision> FederatedLimiter::decide(std::string_view key, std::uint64_t hits,
                                                          Nanos now, Callback* park) {
  maybe_probe(now);
  Shard& s = shard_of(key);
  KeyEffects e;
  std::string lease_key;
  Tasks reconciles;
  {
    const std::lock_guard lock(s.mu);
    auto it = s.keys.find(key);
    if (it == s.keys.end()) {
      // A new key: what needs no state is answered without it, and none is added past max_keys.
      static const FederatedKey none;
      if (hits == 0 || hits > options_.budget.limit)
        return decide_from(none, hits, hits == 0,
                           hits == 0 ? FederatedReason::kAdmitted : FederatedReason::kNeverFits,
                           now, rules_);
      if (keys_.load(std::memory_order_relaxed) >= options_.max_keys) {
        FederatedDecision full =
            decide_from(none, hits, false, FederatedReason::kKeyCapacity, now, rules_);
        full.rate.key_capacity = true;
        return full;
      }
      it = s.keys.emplace(std::string(key), Key{}).first;
      keys_.fetch_add(1, std::memory_order_relaxed);
    }
    Key& k = it->second;
    check_key(k.state, hits, now, park != nullptr, rules_, e);
    // Parked (check_key() added its hits to the state's queue): its callback beside them.
    if (!e.decision && park != nullptr) k.parked.push_back(std::move(*park));
    apply(it->first, e, reconciles);
    if (e.lease_want > 0) lease_key = it->first;
  }
  for (auto& r : reconciles) r();
  if (e.lease_want > 0) lease_async(std::move(lease_key), e.lease_want, e.lease_need);
  return e.decision;
}

void FederatedLimiter::check(std::string_view key, std::uint64_t hits, Nanos now, Callback done) {
  if (std::optional<FederatedDecision> d = decide(key, hits, now, &done)) done(*d);
}

std::optional<FederatedDecision> FederatedLimiter::try_check(std::string_view key,
                                                             std::uint64_t hits, Nanos now) {
  return decide(key, hits, now, nullptr);
}

FederatedDecision FederatedLimiter::peek(std::string_view key, std::uint64_t hits,
                                         Nanos now) const {
  const Shard& s = shards_[StringHash{}(key) % kShards];
  const std::lock_guard lock(s.mu);
  auto it = s.keys.find(key);
  static const FederatedKey none;  // a key not held: nothing known here
  return peek_key(it == s.keys.end() ? none : it->second.state, hits, now, rules_);
}

void FederatedLimiter::on_lease(const std::string& key, Outcome o) {
  Shard& s = shard_of(key);
  std::vector<std::pair<Callback, FederatedDecision>> decided;
  KeyEffects e;
  Tasks reconciles;
  std::optional<std::uint32_t> drift;  // to tell, after the lock
  {
    const std::lock_guard lock(s.mu);
    auto it = s.keys.find(key);
    if (it == s.keys.end()) return;  // never: a key with a lease in flight is kept
    Key& k = it->second;
    const Nanos now = clock_.now();
    // The reply's clock reading first: a grant's expiry takes the allowance it leaves in force.
    // A coordinator whose time is its callers' clocks (a clock uncertainty) has no rate of its
    // own to measure: its readings jump between the callers' offsets, and its replies' expiries
    // allow for them instead.
    if (o.reply.has_value() && o.reply->ok() && o.reply->value().clock_uncertainty == Nanos{0})
      drift = measure_drift(o.sent_at, now, o.reply->value().coordinator_now);
    sluice::on_lease(k.state, o, now, drift_in_force_.load(std::memory_order_relaxed), rules_, e);
    if (e.lease_failed) {
      lease_failures_.fetch_add(1, std::memory_order_relaxed);
      // Regional-only: the pool serves from now on, and checks probe the coordinator until it
      // answers.
      if (rules_.regional_only && !in_outage_.exchange(true, std::memory_order_relaxed)) {
        outages_.fetch_add(1, std::memory_order_relaxed);
        next_probe_.store((now + options_.coordinator_health_check).count(),
                          std::memory_order_relaxed);
      }
    }
    apply(key, e, reconciles);
    decided.reserve(e.decided.size());
    for (FederatedDecision& d : e.decided) {
      decided.emplace_back(std::move(k.parked.front()), std::move(d));
      k.parked.pop_front();
    }
  }
  for (auto& r : reconciles) r();
  if (drift && options_.on_drift) {
    try {
      options_.on_drift(*drift);
    } catch (...) {
      // Best effort, as below.
    }
  }
  if (e.tell_mismatch && options_.on_spec_mismatch) {
    try {
      options_.on_spec_mismatch(key, *e.tell_mismatch);
    } catch (...) {
      // Telling is best effort: the refusal and the count stand.
    }
  }
  for (auto& [cb, d] : decided) cb(d);
  if (e.lease_want > 0) lease_async(key, e.lease_want, e.lease_need);
}

std::optional<std::uint32_t> FederatedLimiter::measure_drift(Nanos sent, Nanos received,
                                                             Nanos coordinator_now) {
  const std::lock_guard lock(drift_mu_);
  drift_.sample(sent, received, coordinator_now);
  if (!drift_.measured()) return std::nullopt;
  drift_high_.store(drift_.high_ppm(), std::memory_order_relaxed);
  const std::uint32_t now = drift_in_force(drift_, options_.drift_ppm);
  const std::uint32_t was = drift_in_force_.exchange(now, std::memory_order_relaxed);
  const bool over = now != options_.drift_ppm, over_before = was != options_.drift_ppm;
  if (over == over_before) return std::nullopt;
  return over ? now : 0;  // told when it goes over, and when it is back
}

std::optional<BudgetSpec> FederatedLimiter::spec_in_force(std::string_view key) const {
  const Shard& s = shards_[StringHash{}(key) % kShards];
  const std::lock_guard lock(s.mu);
  const auto it = s.keys.find(key);
  if (it == s.keys.end()) return std::nullopt;
  return it->second.state.spec_in_force;
}

FederatedDecision FederatedLimiter::check_wait(std::string_view key, std::uint64_t hits) {
  auto p = std::make_shared<std::promise<FederatedDecision>>();
  std::future<FederatedDecision> f = p->get_future();
  check(key, hits, clock_.now(), [p](FederatedDecision d) { p->set_value(std::move(d)); });
  return f.get();
}

RateCharge FederatedLimiter::charge(std::string_view key, std::uint64_t hits, Nanos now) {
  maybe_probe(now);
  Shard& s = shard_of(key);
  KeyEffects e;
  std::string lease_key;
  Tasks reconciles;
  RateCharge c;
  {
    const std::lock_guard lock(s.mu);
    auto it = s.keys.find(key);
    if (it == s.keys.end() &&
        (hits == 0 || keys_.load(std::memory_order_relaxed) >= options_.max_keys)) {
      FederatedKey none;
      KeyEffects nothing;
      c = charge_key(none, 0, now, rules_, nothing);
      if (hits > 0) {
        c.recorded = false;
        c.reason = "key_capacity";
      }
      return c;
    }
    if (it == s.keys.end()) {
      it = s.keys.emplace(std::string(key), Key{}).first;
      keys_.fetch_add(1, std::memory_order_relaxed);
    }
    c = charge_key(it->second.state, hits, now, rules_, e);
    charged_.fetch_add(hits, std::memory_order_relaxed);
    apply(it->first, e, reconciles);
    if (e.lease_want > 0) lease_key = it->first;
  }
  for (auto& r : reconciles) r();
  if (e.lease_want > 0) lease_async(std::move(lease_key), e.lease_want, e.lease_need);
  return c;
}

void FederatedLimiter::refund(std::string_view key, std::uint64_t hits, Nanos now) {
  Shard& s = shard_of(key);
  const std::lock_guard lock(s.mu);
  auto it = s.keys.find(key);
  if (it == s.keys.end()) return;
  spent_.fetch_sub(give_back_key(it->second.state, hits, now), std::memory_order_relaxed);
}

std::size_t FederatedLimiter::sweep(Nanos now) {
  std::size_t forgotten = 0;
  for (std::size_t i = 0; i < kShards; ++i) {
    Shard& s = shards_[i];
    Tasks reconciles;
    std::vector<std::tuple<std::string, std::uint64_t, std::uint64_t>> owed;  // leases to send
    {
      const std::lock_guard lock(s.mu);
      for (auto it = s.keys.begin(); it != s.keys.end();) {
        KeyEffects e;
        give_up(it->second.state, now, true, e);
        // A charge still owed after a failed lease asks again (or is forgiven with its window).
        lease_owed(it->second.state, now, e);
        if (e.lease_want > 0) owed.emplace_back(it->first, e.lease_want, e.lease_need);
        apply(it->first, e, reconciles);
        const bool idle = forgettable(it->second.state, now, rules_);
        if (idle) {
          it = s.keys.erase(it);
          keys_.fetch_sub(1, std::memory_order_relaxed);
          ++forgotten;
        } else {
          ++it;
        }
      }
    }
    for (auto& r : reconciles) r();
    for (auto& [key, want, need] : owed) lease_async(std::move(key), want, need);
  }
  return forgotten;
}

void FederatedLimiter::relinquish_all(Nanos now) {
  for (std::size_t i = 0; i < kShards; ++i) {
    Shard& s = shards_[i];
    Tasks reconciles;
    {
      const std::lock_guard lock(s.mu);
      for (auto& [key, k] : s.keys) {
        KeyEffects e;
        give_up(k.state, now, false, e);
        apply(key, e, reconciles);
      }
    }
    for (auto& r : reconciles) r();
  }
}

FederationStats FederatedLimiter::stats() const {
  FederationStats st;
  st.leases = leases_.load(std::memory_order_relaxed);
  st.lease_failures = lease_failures_.load(std::memory_order_relaxed);
  st.granted = granted_.load(std::memory_order_relaxed);
  st.spent = spent_.load(std::memory_order_relaxed);
  st.forfeited = forfeited_.load(std::memory_order_relaxed);
  st.charged = charged_.load(std::memory_order_relaxed);
  st.forgiven = forgiven_.load(std::memory_order_relaxed);
  st.reconcile_failures = reconcile_failures_.load(std::memory_order_relaxed);
  st.spec_mismatches = spec_mismatches_.load(std::memory_order_relaxed);
  st.clock_drift_ppm = drift_high_.load(std::memory_order_relaxed);
  st.drift_ppm_in_force = drift_in_force_.load(std::memory_order_relaxed);
  st.keys = keys_.load(std::memory_order_relaxed);
  st.pool_taken = pool_taken_.load(std::memory_order_relaxed);
  st.pool_refilled = pool_refilled_.load(std::memory_order_relaxed);
  st.pool_failures = pool_failures_.load(std::memory_order_relaxed);
  st.outages = outages_.load(std::memory_order_relaxed);
  st.in_outage = in_outage_.load(std::memory_order_relaxed);
  return st;
}

}  // namespace sluice
