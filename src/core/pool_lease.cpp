#include "sluice/core/pool_lease.h"

#include <algorithm>
#include <utility>

namespace sluice {

void start_pool_lease(PoolLease& l, std::uint64_t want, std::uint64_t need, bool outage,
                      bool pool_up, Nanos now) {
  l = PoolLease{};
  l.want = want;
  l.need = std::min(need, want);
  l.ask = want;
  l.outcome.outage = outage;
  if (pool_up) {
    l.take_sent = now;
    l.next = PoolCall::kTake;
  } else if (outage) {
    l.outcome.pool_unreachable = true;
    l.next = PoolCall::kDone;
  } else {
    l.lease_need = l.need;
    l.next = PoolCall::kLease;
  }
}

void on_pool_take(PoolLease& l, const StatusOr<PoolReply>& take, Nanos seen,
                  const PoolLeaseRules& rules) {
  l.pool_failed_at.reset();
  l.seen = seen;
  FederatedLeaseOutcome& o = l.outcome;
  if (!take.ok()) {
    l.pool_failed_at = seen;
    if (o.outage) {
      o.pool_unreachable = true;
      l.next = PoolCall::kDone;
      return;
    }
  } else {
    const PoolReply& p = take.value();
    if (p.granted > 0) {
      o.pool_units = p.granted;
      o.pool_window = p.window_start;
      o.pool_expires = taken_expiry(p, l.take_sent, rules.drift_ppm);
      // Past its window (the outage mode): usable until the next probe is due at least.
      if (o.outage)
        o.pool_expires = std::max(o.pool_expires, seen + rules.coordinator_health_check);
    }
    if (o.outage) {
      o.pool_spent = p.granted == 0;
      l.next = PoolCall::kDone;  // the coordinator is down: what the pool had is all there is
      return;
    }
    if (p.granted >= l.want) {
      l.next = PoolCall::kDone;
      return;
    }
    l.ask = l.want - p.granted;
    if (p.refill) {
      l.refiller = true;
      l.pool_now = p.now;
      l.ask = std::max(l.ask, regional_refill_size(p, rules.period, rules.regional_batch));
    }
  }
  // Straight to the coordinator: for the pool too when this process is its refiller. What the
  // pool gave counts toward the need.
  l.lease_need = l.need - std::min(l.need, o.pool_units);
  l.next = PoolCall::kLease;
}

void on_pool_lease(PoolLease& l, StatusOr<LeaseReply> reply, Nanos sent_at, std::uint32_t ppm,
                   const PoolLeaseRules& rules) {
  l.pool_failed_at.reset();
  FederatedLeaseOutcome& o = l.outcome;
  o.sent_at = sent_at;
  o.reply = std::move(reply);
  l.next = PoolCall::kDone;
  if (!l.refiller) return;
  l.extra = 0;
  l.refill_window = Nanos{kFederatedNever};
  l.refill_expires = Nanos{0};
  if (o.reply->ok()) {
    const LeaseReply& r = o.reply->value();
    l.extra = r.granted - std::min(r.granted, l.want - o.pool_units);
    if (l.extra > 0) {
      l.refill_window = r.window_start;
      l.refill_expires =
          pool_expiry(l.pool_now, l.seen, escrow_expiry(r, sent_at, ppm), rules.drift_ppm);
    }
  }
  // With nothing left over, the refill call ends the refill in flight, so that another process
  // may become the refiller at once.
  l.next = PoolCall::kRefill;
}

void on_pool_refill(PoolLease& l, const StatusOr<PoolReply>& refill, Nanos now) {
  l.pool_failed_at.reset();
  l.next = PoolCall::kDone;
  if (!refill.ok()) l.pool_failed_at = now;
  if (l.extra == 0) return;
  LeaseReply& r = l.outcome.reply->value();
  if (refill.ok() && refill.value().granted == l.extra) {
    r.granted -= l.extra;  // this process keeps the rest
    l.refilled = l.extra;
  } else if (!refill.ok()) {
    // A failed call may still have been applied: the units may be in the pool, so this process
    // must not spend them too. Given up.
    r.granted -= l.extra;
    l.forfeited = l.extra;
  }
}

}  // namespace sluice
