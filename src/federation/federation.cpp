#include "sluice/federation/federation.h"

#include <algorithm>
#include <deque>
#include <future>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "core/string_map.h"

namespace sluice {

std::string_view to_string(FederatedReason r) noexcept {
  switch (r) {
    case FederatedReason::kAdmitted:
      return "admitted";
    case FederatedReason::kBudgetSpent:
      return "budget_spent";
    case FederatedReason::kCoordinatorUnreachable:
      return "coordinator_unreachable";
    case FederatedReason::kCoordinatorRestarted:
      return "coordinator_restarted";
    case FederatedReason::kSpecMismatch:
      return "spec_mismatch";
    case FederatedReason::kNeverFits:
      return "never_fits";
    case FederatedReason::kKeyCapacity:
      return "key_capacity";
    case FederatedReason::kRegionalBalanceSpent:
      return "regional_balance_spent";
    case FederatedReason::kBudgetShort:
      return "budget_short";
  }
  return "unknown";
}

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
constexpr std::int64_t kNever = INT64_MIN;
// A refill asks for at most this many batches.
constexpr std::uint64_t kMaxBatches = 16;
// Leases sent in one lease_many() call, at most.
constexpr std::size_t kPipeline = 64;
// drain_leases() running at once, at most: with two, the coordinator has the next batch while
// one batch's replies are handled (cold keys on Redis: bench/README.md).
constexpr int kDrainers = 2;
}  // namespace

struct FederatedLimiter::Waiter {
  std::uint64_t hits;
  Callback done;
};

struct FederatedLimiter::Outcome {
  bool outage = false;  // leased in a regional-only outage
  // Units taken from the pool, of `pool_window`, usable until `pool_expires` on this clock.
  std::uint64_t pool_units = 0;
  Nanos pool_window{kNever};
  Nanos pool_expires{kNever};
  bool pool_spent = false;                    // in an outage: the pool had nothing
  bool pool_unreachable = false;              // in an outage: nor could the pool be reached
  Nanos sent_at{0};                           // when the coordinator's lease was sent
  std::optional<StatusOr<LeaseReply>> reply;  // the coordinator's, when it was asked
};

struct FederatedLimiter::Key {
  Escrow escrow;
  bool leasing = false;
  std::uint64_t global_left = UINT64_MAX;  // budget left at the last reply (max: not known)
  Nanos window_end{kNever};                // the last window's end on this clock (no allowance)
  Nanos closed_until{kNever};              // no lease before this: the window is spent
  FederatedReason closed_reason = FederatedReason::kBudgetSpent;
  Nanos unreachable_until{kNever};  // no lease before this: the coordinator failed
  // Until this, a check needing more than the escrow and global_left hold is refused here
  // (kBudgetShort) without a lease: the coordinator said so, and only give-backs add to it.
  Nanos short_until{kNever};
  std::deque<Waiter> waiters;  // FIFO; answered by the lease in flight
  // The last lease refused for a spec mismatch: the spec in force, and the window told of it.
  std::optional<BudgetSpec> spec_in_force;
  Nanos mismatch_told{kNever};
  // The drift allowance the escrow's expiry was computed with: a larger one in force since
  // (a measured drift) makes that expiry unsafe, so the next grant's replaces it.
  std::uint32_t expiry_ppm = 0;
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
      refill_below_(options_.refill_below != 0 ? options_.refill_below
                                               : std::max<std::uint64_t>(1, options_.batch / 4)),
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

std::uint64_t FederatedLimiter::refill_size(const Key& k, Nanos now) const {
  // What the key is expected to spend here before its window ends, at the rate it has spent
  // since the window began, capped by what it was granted so far in the window (so refills at
  // most double) and by kMaxBatches batches; never less than a batch. A key that spends
  // thousands a window costs a few leases, not one per batch, while what a region holds when
  // the window ends stays about what it would have spent (the coordinator's taper still cuts
  // every ask when the budget runs low). No window known yet (escrow served by the pool in a
  // regional-only outage only): a batch.
  if (k.window_end.count() == kNever) return options_.batch;
  const Nanos elapsed = now - (k.window_end - options_.budget.period);
  const Nanos left = k.window_end - now;
  if (elapsed <= Nanos{0} || left <= Nanos{0}) return options_.batch;
  __extension__ typedef unsigned __int128 Wide;
  const auto expected = static_cast<std::uint64_t>(
      std::min<Wide>(static_cast<Wide>(k.escrow.spent) * static_cast<std::uint64_t>(left.count()) /
                         static_cast<std::uint64_t>(elapsed.count()),
                     UINT64_MAX));
  const std::uint64_t cap = std::min(k.escrow.granted, kMaxBatches * options_.batch);
  return std::max(options_.batch, std::min(expected, cap));
}

std::uint64_t FederatedLimiter::first_batch(const Key& k, Nanos now) const {
  // The key's last escrow is of the window that just ended (it expired less than a window
  // ago): what this region spent in it is its demand, and a key that spent less than a batch
  // leases only that much. Whatever it leased and did not spend would be stranded at the window's
  // end, out of every other region's reach. A key whose demand grew gets the rest from the
  // leases that follow (they ask for every check queued, at least a batch).
  const bool last_window = k.escrow.window_start != kNever && now >= k.escrow.expires_at &&
                           now - k.escrow.expires_at < options_.budget.period;
  if (!last_window || k.escrow.spent >= options_.batch) return options_.batch;
  return std::max<std::uint64_t>(1, k.escrow.spent);
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

namespace {
// Time from `now` to `t`, at least 1 ns (also for a time not set: kNever, long past).
Nanos until(Nanos t, Nanos now) { return t > now ? t - now : Nanos{1}; }
}  // namespace

FederatedDecision FederatedLimiter::decide_from(const Key& k, std::uint64_t hits, bool allowed,
                                                FederatedReason reason, Nanos now) const {
  FederatedDecision d;
  d.reason = reason;
  d.rate.allowed = allowed;
  if (!allowed) d.rate.reason = to_string(reason);
  d.rate.limit = options_.budget.limit;
  const std::uint64_t here = usable(k.escrow, now);
  // Not leased yet: as far as this region knows, the whole budget.
  const std::uint64_t there = k.global_left == UINT64_MAX ? options_.budget.limit : k.global_left;
  d.rate.remaining = std::min(options_.budget.limit, here + std::min(there, options_.budget.limit));
  d.rate.reset_after = k.window_end.count() == kNever ? options_.budget.period
                                                      : std::max(Nanos{0}, k.window_end - now);
  if (!allowed) {
    if (reason == FederatedReason::kNeverFits || hits > options_.budget.limit)
      d.rate.retry_after = Nanos::max();
    else if (reason == FederatedReason::kCoordinatorUnreachable)
      d.rate.retry_after = until(k.unreachable_until, now);
    else if (reason == FederatedReason::kKeyCapacity)
      d.rate.retry_after = options_.budget.period;  // keys are forgotten a window or two idle
    else if (reason == FederatedReason::kBudgetShort)
      d.rate.retry_after = until(k.short_until, now);
    else
      d.rate.retry_after = until(k.closed_until, now);
  }
  return d;
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
  Outcome o;
  const std::string gk = global_key(key);
  o.outage = options_.outage == FederationOutage::kRegionalOnly &&
             in_outage_.load(std::memory_order_relaxed);
  const auto pool_failed = [&](Nanos at) {
    pool_failures_.fetch_add(1, std::memory_order_relaxed);
    pool_down_until_.store((at + options_.retry_backoff).count(), std::memory_order_relaxed);
  };
  std::uint64_t ask = want;
  bool refiller = false;
  Nanos pool_now{0}, seen{0};
  if (clock_.now().count() >= pool_down_until_.load(std::memory_order_relaxed)) {
    const Nanos sent = clock_.now();
    StatusOr<PoolReply> t =
        pool_->take(gk, want, 2 * options_.lease_timeout, o.outage, options_.lease_timeout);
    seen = clock_.now();
    if (t.ok()) {
      const PoolReply& p = t.value();
      if (p.granted > 0) {
        o.pool_units = p.granted;
        o.pool_window = p.window_start;
        o.pool_expires = taken_expiry(p, sent, options_.drift_ppm);
        // Past its window (the outage mode): usable until the next probe is due at least.
        if (o.outage)
          o.pool_expires = std::max(o.pool_expires, seen + options_.coordinator_health_check);
      }
      if (o.outage) {
        o.pool_spent = p.granted == 0;
        return o;  // the coordinator is down: what the pool had is all there is
      }
      if (p.granted >= want) return o;
      ask = want - p.granted;
      if (p.refill) {
        refiller = true;
        pool_now = p.now;
        ask = std::max(ask, regional_refill_size(p, options_.budget.period, regional_batch_));
      }
    } else {
      pool_failed(seen);
      if (o.outage) {
        o.pool_unreachable = true;
        return o;
      }
    }
  } else if (o.outage) {
    o.pool_unreachable = true;
    return o;
  }
  // Straight to the coordinator: for the pool too when this process is its refiller. What the
  // pool gave counts toward the need.
  Outcome direct = lease_direct(key, ask, need - std::min(need, o.pool_units));
  o.sent_at = direct.sent_at;
  o.reply = std::move(direct.reply);
  if (!refiller) return o;
  std::uint64_t extra = 0;
  if (o.reply->ok()) {
    const LeaseReply& r = o.reply->value();
    extra = r.granted - std::min(r.granted, want - o.pool_units);
  }
  if (extra == 0) {
    // End the refill in flight, so that another process may become the refiller at once.
    StatusOr<PoolReply> f = pool_->refill(gk, Nanos{kNever}, 0, Nanos{0}, options_.lease_timeout);
    if (!f.ok()) pool_failed(clock_.now());
    return o;
  }
  LeaseReply& r = o.reply->value();
  const Nanos expires_at = pool_expiry(
      pool_now, seen, escrow_expiry(r, o.sent_at, drift_in_force_.load(std::memory_order_relaxed)),
      options_.drift_ppm);
  StatusOr<PoolReply> f =
      pool_->refill(gk, r.window_start, extra, expires_at, options_.lease_timeout);
  if (f.ok() && f.value().granted == extra) {
    r.granted -= extra;  // this process keeps the rest
    pool_refilled_.fetch_add(extra, std::memory_order_relaxed);
  } else if (!f.ok()) {
    // A failed call may still have been applied (a reply lost or late after the pool ran it):
    // the units may be in the pool, so this process must not spend them too. Given up.
    pool_failed(clock_.now());
    r.granted -= extra;
    forfeited_.fetch_add(extra, std::memory_order_relaxed);
    granted_.fetch_add(extra, std::memory_order_relaxed);
  }
  return o;
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

void FederatedLimiter::forfeit(const std::string& key, Key& k, Nanos now, bool expired_only,
                               Tasks& io) {
  if (k.escrow.units == 0 || (expired_only && now < k.escrow.expires_at)) return;
  const std::uint64_t units = k.escrow.units;
  const std::uint64_t total = relinquish(k.escrow);
  forfeited_.fetch_add(units, std::memory_order_relaxed);
  const Nanos w{k.escrow.window_start};
  if (pool_ != nullptr)
    io.push_back([this, key, w, units] { send_release(key, w, units); });
  else
    io.push_back([this, key, w, total] { send_reconcile(key, w, total); });
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
  std::optional<FederatedDecision> d;
  std::uint64_t lease_want = 0, lease_need = 0;
  std::string lease_key;
  Tasks reconciles;
  {
    const std::lock_guard lock(s.mu);
    auto it = s.keys.find(key);
    if (it == s.keys.end()) {
      // A new key: what needs no state is answered without it, and none is added past max_keys.
      static const Key none;
      if (hits == 0 || hits > options_.budget.limit)
        return decide_from(none, hits, hits == 0,
                           hits == 0 ? FederatedReason::kAdmitted : FederatedReason::kNeverFits,
                           now);
      if (keys_.load(std::memory_order_relaxed) >= options_.max_keys) {
        FederatedDecision full = decide_from(none, hits, false, FederatedReason::kKeyCapacity, now);
        full.rate.key_capacity = true;
        return full;
      }
      it = s.keys.emplace(std::string(key), Key{}).first;
      keys_.fetch_add(1, std::memory_order_relaxed);
    }
    Key& k = it->second;
    forfeit(it->first, k, now, true, reconciles);
    if (hits > options_.budget.limit) {
      d = decide_from(k, hits, false, FederatedReason::kNeverFits, now);
    } else if (hits == 0) {
      d = decide_from(k, 0, true, FederatedReason::kAdmitted, now);
    } else if (k.waiters.empty() && spend(k.escrow, hits, now)) {
      spent_.fetch_add(hits, std::memory_order_relaxed);
      d = decide_from(k, hits, true, FederatedReason::kAdmitted, now);
      // A busy key (a batch or more leased in this window) refills before it runs dry; a quiet
      // one, leased only what it needed, leases again when it needs more. A check of a batch or
      // more that ran the escrow down says nothing of the next one: it leases what that needs
      // when it comes, rather than holding units here that a check elsewhere could spend.
      if (hits < options_.batch && usable(k.escrow, now) < refill_below_ &&
          k.escrow.granted >= options_.batch && !k.leasing && now >= k.closed_until &&
          now >= k.unreachable_until && k.global_left > 0) {
        k.leasing = true;
        lease_want = refill_size(k, now);
        lease_key = it->first;
      }
    } else if (now < k.closed_until) {
      d = decide_from(k, hits, false, k.closed_reason, now);
    } else if (now < k.unreachable_until) {
      d = decide_from(k, hits, false, FederatedReason::kCoordinatorUnreachable, now);
    } else if (k.waiters.empty() && now < k.short_until && k.global_left != UINT64_MAX &&
               hits > usable(k.escrow, now) + k.global_left) {
      d = decide_from(k, hits, false, FederatedReason::kBudgetShort, now);
    } else {
      // It needs a lease: parked behind the key's lease call (started here if none is in
      // flight), or, for try_check, left undecided (the lease is started all the same). The
      // lease asks for at least what the first waiter lacks, and for nothing less.
      if (park != nullptr) k.waiters.push_back({hits, std::move(*park)});
      if (!k.leasing) {
        k.leasing = true;
        const std::uint64_t first = k.waiters.empty() ? hits : k.waiters.front().hits;
        lease_need = first - std::min(first, usable(k.escrow, now));
        lease_want = std::max(first_batch(k, now), hits - std::min(hits, usable(k.escrow, now)));
        lease_want = std::max(lease_want, lease_need);
        lease_key = it->first;
      }
    }
  }
  for (auto& r : reconciles) r();
  if (lease_want > 0) lease_async(std::move(lease_key), lease_want, lease_need);
  return d;
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
  static const Key none;  // a key not held: nothing known here
  const Key& k = it == s.keys.end() ? none : it->second;
  if (hits > options_.budget.limit)
    return decide_from(k, hits, false, FederatedReason::kNeverFits, now);
  const std::uint64_t here = usable(k.escrow, now);
  if (here >= hits) return decide_from(k, hits, true, FederatedReason::kAdmitted, now);
  if (now < k.closed_until) return decide_from(k, hits, false, k.closed_reason, now);
  if (now < k.unreachable_until)
    return decide_from(k, hits, false, FederatedReason::kCoordinatorUnreachable, now);
  const bool may = k.global_left == UINT64_MAX || here + k.global_left >= hits;
  return decide_from(k, hits, may, may ? FederatedReason::kAdmitted : FederatedReason::kBudgetSpent,
                     now);
}

void FederatedLimiter::on_lease(const std::string& key, Outcome o) {
  Shard& s = shard_of(key);
  std::vector<std::pair<Callback, FederatedDecision>> decided;
  std::uint64_t again = 0, again_need = 0;
  Tasks reconciles;
  std::optional<BudgetSpec> mismatch;  // to tell, after the lock
  std::optional<std::uint32_t> drift;  // likewise
  {
    const std::lock_guard lock(s.mu);
    auto it = s.keys.find(key);
    if (it == s.keys.end()) return;  // never: a key with a lease in flight is kept
    Key& k = it->second;
    k.leasing = false;
    const Nanos now = clock_.now();
    if (o.pool_units > 0) {
      granted_.fetch_add(o.pool_units, std::memory_order_relaxed);
      pool_taken_.fetch_add(o.pool_units, std::memory_order_relaxed);
      LeaseReply taken;
      taken.granted = o.pool_units;
      // Past its window in an outage: added to whatever window this escrow holds.
      taken.window_start = std::max(o.pool_window, Nanos{k.escrow.window_start});
      if (o.outage && k.escrow.units > 0 && o.pool_expires > k.escrow.expires_at) {
        // What this process still holds of its own leases must not take the later expiry of
        // units served past their window: given up (not to the pool), so that an outage serves
        // beyond the windows' own grants no more than the pools held at its onset.
        forfeited_.fetch_add(k.escrow.units, std::memory_order_relaxed);
        (void)relinquish(k.escrow);
      }
      if (taken.window_start.count() > k.escrow.window_start)
        forfeit(key, k, now, false, reconciles);
      forfeited_.fetch_add(add_grant(k.escrow, taken, o.pool_expires), std::memory_order_relaxed);
      if (!o.outage) k.window_end = std::max(k.window_end, o.pool_expires);
    }
    if (o.pool_spent) {
      k.closed_until = now + options_.retry_backoff;
      k.closed_reason = FederatedReason::kRegionalBalanceSpent;
    }
    if (o.pool_unreachable) k.unreachable_until = now + options_.retry_backoff;
    const Nanos sent_at = o.sent_at;
    const bool told_left = o.reply.has_value() && o.reply->ok();  // global_left is fresh
    if (told_left && o.reply->value().status != LeaseStatus::kSpecMismatch) k.spec_in_force.reset();
    if (!o.reply.has_value()) {
      // Served by the pool alone.
    } else if (o.reply->ok()) {
      const LeaseReply& r = o.reply->value();
      drift = measure_drift(sent_at, now, r.coordinator_now);
      k.unreachable_until = Nanos{kNever};
      k.global_left = r.remaining;
      k.window_end = sent_at + (r.window_end - r.coordinator_now);
      if (r.granted > 0) {
        granted_.fetch_add(r.granted, std::memory_order_relaxed);
        const std::uint32_t ppm = drift_in_force_.load(std::memory_order_relaxed);
        const Nanos expires = escrow_expiry(r, sent_at, ppm);
        // add_grant keeps the later of two expiries of one window, each safe under the
        // allowance it was computed with; one computed with a smaller allowance than the one
        // in force now is not safe, so this grant's (safe under it) replaces it.
        if (ppm > k.expiry_ppm && r.window_start.count() == k.escrow.window_start)
          k.escrow.expires_at = std::min(k.escrow.expires_at, expires);
        k.expiry_ppm = ppm;
        // A grant of a later window replaces what is left of the last one: give that up first,
        // so its reconcile carries the window's whole running total.
        if (r.window_start.count() > k.escrow.window_start) forfeit(key, k, now, false, reconciles);
        forfeited_.fetch_add(add_grant(k.escrow, r, expires), std::memory_order_relaxed);
        // A grant that arrives after its own expiry (a round trip longer than what the window
        // had left) is no use: treat the window as over here rather than lease again at once.
        if (now >= expires) {
          k.closed_until = std::max(now + Nanos{1}, k.window_end);
          k.closed_reason = FederatedReason::kBudgetSpent;
        }
      }
      switch (r.status) {
        case LeaseStatus::kGranted:
          break;
        case LeaseStatus::kSpent:
        case LeaseStatus::kWindowEnding:
          k.closed_until = std::max(now + Nanos{1}, k.window_end);
          k.closed_reason = FederatedReason::kBudgetSpent;
          break;
        case LeaseStatus::kStateLost:
          k.closed_until = std::max(now + Nanos{1}, k.window_end);
          k.closed_reason = FederatedReason::kCoordinatorRestarted;
          break;
        case LeaseStatus::kShort:
          // Budget left, less than the first waiter needs: it and any other check needing
          // more than escrow and what is left are refused here for a while (below).
          k.short_until = short_until(k, now);
          break;
        case LeaseStatus::kSpecMismatch:
          spec_mismatches_.fetch_add(1, std::memory_order_relaxed);
          k.closed_until = now + options_.retry_backoff;
          k.closed_reason = FederatedReason::kSpecMismatch;
          k.spec_in_force = r.spec;
          if (k.mismatch_told != r.window_end) {  // once per key and window
            k.mismatch_told = r.window_end;
            mismatch = r.spec;
          }
          break;
      }
    } else {
      lease_failures_.fetch_add(1, std::memory_order_relaxed);
      if (pool_ != nullptr && options_.outage == FederationOutage::kRegionalOnly) {
        // Regional-only: the pool serves from now on (the checks still queued lease from it
        // at once, below), and checks probe the coordinator until it answers.
        if (!in_outage_.exchange(true, std::memory_order_relaxed)) {
          outages_.fetch_add(1, std::memory_order_relaxed);
          next_probe_.store((now + options_.coordinator_health_check).count(),
                            std::memory_order_relaxed);
        }
      } else {
        k.unreachable_until = now + options_.retry_backoff;
      }
    }
    while (!k.waiters.empty()) {
      Waiter& w = k.waiters.front();
      if (spend(k.escrow, w.hits, now)) {
        spent_.fetch_add(w.hits, std::memory_order_relaxed);
        decided.emplace_back(std::move(w.done),
                             decide_from(k, w.hits, true, FederatedReason::kAdmitted, now));
      } else if (now < k.closed_until) {
        decided.emplace_back(std::move(w.done),
                             decide_from(k, w.hits, false, k.closed_reason, now));
      } else if (now < k.unreachable_until) {
        decided.emplace_back(
            std::move(w.done),
            decide_from(k, w.hits, false, FederatedReason::kCoordinatorUnreachable, now));
      } else if (told_left && w.hits > usable(k.escrow, now) + k.global_left) {
        // More than escrow and the budget left hold (the coordinator's word just now): refused
        // without another lease, for a while (decide_from's retry_after); with nothing left,
        // for the rest of the window, as a kSpent reply would have it.
        if (k.global_left == 0) {
          k.closed_until = std::max(now + Nanos{1}, k.window_end);
          k.closed_reason = FederatedReason::kBudgetSpent;
        } else if (now >= k.short_until) {
          k.short_until = short_until(k, now);
        }
        decided.emplace_back(std::move(w.done),
                             decide_from(k, w.hits, false,
                                         k.global_left == 0 ? FederatedReason::kBudgetSpent
                                                            : FederatedReason::kBudgetShort,
                                         now));
      } else {
        // The budget may hold more: lease again, for the whole queue, and for at least what
        // the first waiter lacks.
        k.leasing = true;
        // A busy key's next lease is rate-sized, as its background refill would be.
        std::uint64_t queued = 0;
        for (const Waiter& q : k.waiters) queued += q.hits;
        const std::uint64_t size =
            k.escrow.granted >= options_.batch ? refill_size(k, now) : options_.batch;
        again = std::max(size, queued - std::min(queued, usable(k.escrow, now)));
        again_need = w.hits - std::min(w.hits, usable(k.escrow, now));
        break;
      }
      k.waiters.pop_front();
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
  if (mismatch && options_.on_spec_mismatch) {
    try {
      options_.on_spec_mismatch(key, *mismatch);
    } catch (...) {
      // Telling is best effort: the refusal and the count stand.
    }
  }
  for (auto& [cb, d] : decided) cb(d);
  if (again > 0) lease_async(key, again, again_need);
}

Nanos FederatedLimiter::short_until(const Key& k, Nanos now) const {
  // Never past the window's end: the next window's budget is whole.
  return std::max(now + Nanos{1}, std::min(now + options_.retry_backoff, k.window_end));
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
  return it->second.spec_in_force;
}

FederatedDecision FederatedLimiter::check_wait(std::string_view key, std::uint64_t hits) {
  auto p = std::make_shared<std::promise<FederatedDecision>>();
  std::future<FederatedDecision> f = p->get_future();
  check(key, hits, clock_.now(), [p](FederatedDecision d) { p->set_value(std::move(d)); });
  return f.get();
}

void FederatedLimiter::refund(std::string_view key, std::uint64_t hits, Nanos now) {
  Shard& s = shard_of(key);
  const std::lock_guard lock(s.mu);
  auto it = s.keys.find(key);
  if (it == s.keys.end()) return;
  const std::uint64_t before = it->second.escrow.spent;
  unspend(it->second.escrow, hits, now);
  spent_.fetch_sub(before - it->second.escrow.spent, std::memory_order_relaxed);
}

std::size_t FederatedLimiter::sweep(Nanos now) {
  std::size_t forgotten = 0;
  for (std::size_t i = 0; i < kShards; ++i) {
    Shard& s = shards_[i];
    Tasks reconciles;
    {
      const std::lock_guard lock(s.mu);
      for (auto it = s.keys.begin(); it != s.keys.end();) {
        Key& k = it->second;
        forfeit(it->first, k, now, true, reconciles);
        // Kept while its escrow's window lasts (a refund may still come for what it spent), and
        // a window longer, so that the next window's first lease is sized by its demand.
        const bool idle = !k.leasing && k.waiters.empty() && k.escrow.units == 0 &&
                          now >= k.escrow.expires_at + options_.budget.period &&
                          now >= k.closed_until && now >= k.unreachable_until;
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
  }
  return forgotten;
}

void FederatedLimiter::relinquish_all(Nanos now) {
  for (std::size_t i = 0; i < kShards; ++i) {
    Shard& s = shards_[i];
    Tasks reconciles;
    {
      const std::lock_guard lock(s.mu);
      for (auto& [key, k] : s.keys) forfeit(key, k, now, false, reconciles);
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
