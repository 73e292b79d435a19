#include "sluice/core/federated_key.h"

#include <algorithm>

namespace sluice {

namespace {
// A refill asks for at most this many batches.
constexpr std::uint64_t kMaxBatches = 16;

// Time from `now` to `t`, at least 1 ns (also for a time not set: long past).
Nanos until(Nanos t, Nanos now) { return t > now ? t - now : Nanos{1}; }

// Until when a key the coordinator said is short of a check's need refuses such checks here:
// never past the window's end (the next window's budget is whole).
Nanos short_until(const FederatedKey& k, Nanos now, const FederatedKeyRules& rules) {
  return std::max(now + Nanos{1}, std::min(now + rules.retry_backoff, k.window_end));
}

// The window is over here: no lease before its end (and not before the next nanosecond).
void close_window(FederatedKey& k, Nanos now, FederatedReason why) {
  k.closed_until = std::max(now + Nanos{1}, k.window_end);
  k.closed_reason = why;
}

// The size of a busy key's background refill: what the key is expected to spend here before
// its window ends, at the rate it has spent since the window began, capped by what it was
// granted so far in the window (so refills at most double) and by kMaxBatches batches; never
// less than a batch. A key that spends thousands a window costs a few leases, not one per
// batch, while what a region holds when the window ends stays about what it would have spent
// (the coordinator's taper still cuts every ask when the budget runs low). No window known yet
// (escrow served by the pool in a regional-only outage only): a batch.
std::uint64_t refill_size(const FederatedKey& k, Nanos now, const FederatedKeyRules& rules) {
  if (k.window_end.count() == kFederatedNever) return rules.batch;
  const Nanos elapsed = now - (k.window_end - rules.budget.period);
  const Nanos left = k.window_end - now;
  if (elapsed <= Nanos{0} || left <= Nanos{0}) return rules.batch;
  __extension__ typedef unsigned __int128 Wide;
  const auto expected = static_cast<std::uint64_t>(
      std::min<Wide>(static_cast<Wide>(k.escrow.spent) * static_cast<std::uint64_t>(left.count()) /
                         static_cast<std::uint64_t>(elapsed.count()),
                     UINT64_MAX));
  const std::uint64_t cap = std::min(k.escrow.granted, kMaxBatches * rules.batch);
  return std::max(rules.batch, std::min(expected, cap));
}

// The size of a key's first lease in a window. The key's last escrow is of the window that
// just ended (it expired less than a window ago): what this region spent in it is its demand,
// and a key that spent less than a batch leases only that much. Whatever it leased and did not
// spend would be stranded at the window's end, out of every other region's reach. A key whose
// demand grew gets the rest from the leases that follow (they ask for every check queued, at
// least a batch).
std::uint64_t first_batch(const FederatedKey& k, Nanos now, const FederatedKeyRules& rules) {
  const bool last_window = k.escrow.window_start != kFederatedNever && now >= k.escrow.expires_at &&
                           now - k.escrow.expires_at < rules.budget.period;
  if (!last_window || k.escrow.spent >= rules.batch) return rules.batch;
  return std::max<std::uint64_t>(1, k.escrow.spent);
}

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

// The key's window is known to be spent here (until it ends).
bool window_spent(const FederatedKey& k, Nanos now) {
  return now < k.closed_until && (k.closed_reason == FederatedReason::kBudgetSpent ||
                                  k.closed_reason == FederatedReason::kCoordinatorRestarted);
}

void forgive_owed(FederatedKey& k, KeyEffects& out) {
  out.forgiven += k.owed;
  k.owed = 0;
  k.owed_until = Nanos{kFederatedNever};
}

// What is owed past its window, or in a window whose budget is known to be spent: forgiven.
void settle_owed(FederatedKey& k, Nanos now, KeyEffects& out) {
  if (k.owed > 0 && (now >= k.owed_until || window_spent(k, now))) forgive_owed(k, out);
}

// Pays what the key owes from its escrow, as far as it goes.
void pay_owed(FederatedKey& k, Nanos now, KeyEffects& out) {
  const std::uint64_t pay = std::min(k.owed, usable(k.escrow, now));
  if (pay > 0 && spend(k.escrow, pay, now)) {
    k.owed -= pay;
    out.spent += pay;
  }
  if (k.owed == 0) k.owed_until = Nanos{kFederatedNever};
}

}  // namespace

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

FederatedDecision decide_from(const FederatedKey& k, std::uint64_t hits, bool allowed,
                              FederatedReason reason, Nanos now, const FederatedKeyRules& rules) {
  FederatedDecision d;
  d.reason = reason;
  d.rate.allowed = allowed;
  if (!allowed) d.rate.reason = to_string(reason);
  const std::uint64_t limit = rules.budget.limit;
  d.rate.limit = limit;
  const std::uint64_t here = usable(k.escrow, now);
  // Not leased yet: as far as this region knows, the whole budget.
  const std::uint64_t there = k.global_left == UINT64_MAX ? limit : k.global_left;
  // What the key owes comes first (charges, charge_key).
  const std::uint64_t whole = std::min(limit, here + std::min(there, limit));
  d.rate.remaining = whole - std::min(whole, k.owed);
  d.rate.reset_after = k.window_end.count() == kFederatedNever
                           ? rules.budget.period
                           : std::max(Nanos{0}, k.window_end - now);
  if (!allowed) {
    if (reason == FederatedReason::kNeverFits || hits > limit)
      d.rate.retry_after = Nanos::max();
    else if (reason == FederatedReason::kCoordinatorUnreachable)
      d.rate.retry_after = until(k.unreachable_until, now);
    else if (reason == FederatedReason::kKeyCapacity)
      d.rate.retry_after = rules.budget.period;  // keys are forgotten a window or two idle
    else if (reason == FederatedReason::kBudgetShort)
      d.rate.retry_after = until(k.short_until, now);
    else
      d.rate.retry_after = until(k.closed_until, now);
  }
  return d;
}

FederatedDecision peek_key(const FederatedKey& k, std::uint64_t hits, Nanos now,
                           const FederatedKeyRules& rules) {
  if (hits > rules.budget.limit)
    return decide_from(k, hits, false, FederatedReason::kNeverFits, now, rules);
  if (hits == 0 && window_spent(k, now))  // as check_key answers it
    return decide_from(k, 0, false, k.closed_reason, now, rules);
  const std::uint64_t here = usable(k.escrow, now);
  if (here >= hits) return decide_from(k, hits, true, FederatedReason::kAdmitted, now, rules);
  if (now < k.closed_until) return decide_from(k, hits, false, k.closed_reason, now, rules);
  if (now < k.unreachable_until)
    return decide_from(k, hits, false, FederatedReason::kCoordinatorUnreachable, now, rules);
  const bool may =
      k.global_left == UINT64_MAX || sat_add(here, k.global_left) >= sat_add(hits, k.owed);
  return decide_from(k, hits, may, may ? FederatedReason::kAdmitted : FederatedReason::kBudgetSpent,
                     now, rules);
}

void give_up(FederatedKey& k, Nanos now, bool expired_only, KeyEffects& out) {
  if (k.escrow.units == 0 || (expired_only && now < k.escrow.expires_at)) return;
  const std::uint64_t units = k.escrow.units;
  const std::uint64_t total = relinquish(k.escrow);
  out.forfeited += units;
  out.given_up.push_back(GivenUp{Nanos{k.escrow.window_start}, units, total});
}

void check_key(FederatedKey& k, std::uint64_t hits, Nanos now, bool park,
               const FederatedKeyRules& rules, KeyEffects& out) {
  give_up(k, now, true, out);
  settle_owed(k, now, out);
  if (hits > rules.budget.limit) {
    out.decision = decide_from(k, hits, false, FederatedReason::kNeverFits, now, rules);
  } else if (hits == 0) {
    // Spends nothing: allowed unless the window is known to be spent here (a charge may have
    // overdrawn it), so that a check of no hits asks whether anything is left at all.
    const bool spent = window_spent(k, now);
    out.decision =
        decide_from(k, 0, !spent, spent ? k.closed_reason : FederatedReason::kAdmitted, now, rules);
  } else if (k.owed == 0 && k.waiting.empty() && spend(k.escrow, hits, now)) {
    out.spent += hits;
    out.decision = decide_from(k, hits, true, FederatedReason::kAdmitted, now, rules);
    // A busy key (a batch or more leased in this window) refills before it runs dry; a quiet
    // one, leased only what it needed, leases again when it needs more. A check of a batch or
    // more that ran the escrow down says nothing of the next one: it leases what that needs
    // when it comes, rather than holding units here that a check elsewhere could spend.
    if (hits < rules.batch && usable(k.escrow, now) < rules.refill_below &&
        k.escrow.granted >= rules.batch && !k.leasing && now >= k.closed_until &&
        now >= k.unreachable_until && k.global_left > 0) {
      k.leasing = true;
      out.lease_want = refill_size(k, now, rules);
    }
  } else if (now < k.closed_until) {
    out.decision = decide_from(k, hits, false, k.closed_reason, now, rules);
  } else if (now < k.unreachable_until) {
    out.decision =
        decide_from(k, hits, false, FederatedReason::kCoordinatorUnreachable, now, rules);
  } else if (k.waiting.empty() && now < k.short_until && k.global_left != UINT64_MAX &&
             sat_add(hits, k.owed) > usable(k.escrow, now) + k.global_left) {
    out.decision = decide_from(k, hits, false, FederatedReason::kBudgetShort, now, rules);
  } else {
    // It needs a lease: parked behind the key's lease (asked for here if none is in flight),
    // or left undecided. The lease asks for at least what the first waiter lacks (after what
    // the key owes), and for nothing less.
    if (park) k.waiting.push_back(hits);
    if (!k.leasing) {
      k.leasing = true;
      const std::uint64_t first = sat_add(k.waiting.empty() ? hits : k.waiting.front(), k.owed);
      const std::uint64_t here = usable(k.escrow, now);
      out.lease_need = first - std::min(first, here);
      const std::uint64_t all = sat_add(hits, k.owed);
      out.lease_want = std::max(first_batch(k, now, rules), all - std::min(all, here));
      out.lease_want = std::max(out.lease_want, out.lease_need);
    }
  }
}

void on_lease(FederatedKey& k, const FederatedLeaseOutcome& o, Nanos now, std::uint32_t ppm,
              const FederatedKeyRules& rules, KeyEffects& out) {
  k.leasing = false;
  if (o.pool_units > 0) {
    out.granted += o.pool_units;
    out.pool_taken += o.pool_units;
    LeaseReply taken;
    taken.granted = o.pool_units;
    // Past its window in an outage: added to whatever window this escrow holds.
    taken.window_start = std::max(o.pool_window, Nanos{k.escrow.window_start});
    if (o.outage && k.escrow.units > 0 && o.pool_expires > k.escrow.expires_at) {
      // What this process still holds of its own leases must not take the later expiry of
      // units served past their window: given up (not to the pool), so that an outage serves
      // beyond the windows' own grants no more than the pools held at its onset.
      out.forfeited += k.escrow.units;
      (void)relinquish(k.escrow);
    }
    if (taken.window_start.count() > k.escrow.window_start) give_up(k, now, false, out);
    out.forfeited += add_grant(k.escrow, taken, o.pool_expires);
    if (!o.outage) k.window_end = std::max(k.window_end, o.pool_expires);
  }
  if (o.pool_spent) {
    k.closed_until = now + rules.retry_backoff;
    k.closed_reason = FederatedReason::kRegionalBalanceSpent;
  }
  if (o.pool_unreachable) k.unreachable_until = now + rules.retry_backoff;
  const Nanos sent_at = o.sent_at;
  const bool told_left = o.reply.has_value() && o.reply->ok();  // global_left is fresh
  if (told_left && o.reply->value().status != LeaseStatus::kSpecMismatch) k.spec_in_force.reset();
  if (!o.reply.has_value()) {
    // Served by the pool alone.
  } else if (o.reply->ok()) {
    const LeaseReply& r = o.reply->value();
    k.unreachable_until = Nanos{kFederatedNever};
    k.global_left = r.remaining;
    k.window_end = sent_at + (r.window_end - r.coordinator_now);
    if (r.granted > 0) {
      out.granted += r.granted;
      const Nanos expires = escrow_expiry(r, sent_at, ppm);
      // add_grant keeps the later of two expiries of one window, each safe under the
      // allowance it was computed with; one computed with a smaller allowance than the one in
      // force now is not safe, so this grant's (safe under it) replaces it.
      if (ppm > k.expiry_ppm && r.window_start.count() == k.escrow.window_start)
        k.escrow.expires_at = std::min(k.escrow.expires_at, expires);
      k.expiry_ppm = ppm;
      // A grant of a later window replaces what is left of the last one: give that up first,
      // so its reconcile carries the window's whole running total.
      if (r.window_start.count() > k.escrow.window_start) give_up(k, now, false, out);
      out.forfeited += add_grant(k.escrow, r, expires);
      // A grant that arrives after its own expiry (a round trip longer than what the window
      // had left) is no use: treat the window as over here rather than lease again at once.
      if (now >= expires) close_window(k, now, FederatedReason::kBudgetSpent);
    }
    switch (r.status) {
      case LeaseStatus::kGranted:
        break;
      case LeaseStatus::kSpent:
      case LeaseStatus::kWindowEnding:
        close_window(k, now, FederatedReason::kBudgetSpent);
        break;
      case LeaseStatus::kStateLost:
        close_window(k, now, FederatedReason::kCoordinatorRestarted);
        break;
      case LeaseStatus::kShort:
        // Budget left, less than the first waiter needs: it and any other check needing more
        // than escrow and what is left are refused here for a while (below).
        k.short_until = short_until(k, now, rules);
        break;
      case LeaseStatus::kSpecMismatch:
        out.spec_mismatch = true;
        k.closed_until = now + rules.retry_backoff;
        k.closed_reason = FederatedReason::kSpecMismatch;
        k.spec_in_force = r.spec;
        if (k.mismatch_told != r.window_end) {  // once per key and window
          k.mismatch_told = r.window_end;
          out.tell_mismatch = r.spec;
        }
        break;
    }
  } else {
    out.lease_failed = true;
    // Regional-only: the pool serves from now on (the checks still parked lease from it at
    // once, below), and the caller probes the coordinator until it answers.
    if (!rules.regional_only) k.unreachable_until = now + rules.retry_backoff;
  }
  // Charges first: they were spent before any check now parked asked.
  settle_owed(k, now, out);
  pay_owed(k, now, out);
  while (!k.waiting.empty()) {
    const std::uint64_t hits = k.waiting.front();
    if (k.owed == 0 && spend(k.escrow, hits, now)) {
      out.spent += hits;
      out.decided.push_back(decide_from(k, hits, true, FederatedReason::kAdmitted, now, rules));
    } else if (now < k.closed_until) {
      out.decided.push_back(decide_from(k, hits, false, k.closed_reason, now, rules));
    } else if (now < k.unreachable_until) {
      out.decided.push_back(
          decide_from(k, hits, false, FederatedReason::kCoordinatorUnreachable, now, rules));
    } else if (told_left && sat_add(hits, k.owed) > usable(k.escrow, now) + k.global_left) {
      // More than escrow and the budget left hold (the coordinator's word just now): refused
      // without another lease, for a while (decide_from's retry_after); with nothing left, for
      // the rest of the window, as a kSpent reply would have it.
      if (k.global_left == 0)
        close_window(k, now, FederatedReason::kBudgetSpent);
      else if (now >= k.short_until)
        k.short_until = short_until(k, now, rules);
      out.decided.push_back(decide_from(
          k, hits, false,
          k.global_left == 0 ? FederatedReason::kBudgetSpent : FederatedReason::kBudgetShort, now,
          rules));
    } else {
      // The budget may hold more: lease again, for the whole queue, and for at least what the
      // first waiter lacks. A busy key's next lease is rate-sized, as its background refill
      // would be.
      k.leasing = true;
      std::uint64_t queued = k.owed;
      for (const std::uint64_t q : k.waiting) queued = sat_add(queued, q);
      const std::uint64_t size =
          k.escrow.granted >= rules.batch ? refill_size(k, now, rules) : rules.batch;
      const std::uint64_t here = usable(k.escrow, now);
      const std::uint64_t first = sat_add(hits, k.owed);
      out.lease_want = std::max(size, queued - std::min(queued, here));
      out.lease_need = first - std::min(first, here);
      break;
    }
    k.waiting.pop_front();
  }
  if (k.owed > 0 && !k.leasing) {
    if (told_left && k.global_left == 0) {
      // Nothing left in the window: what is still owed is past its limit, forgiven at its end.
      close_window(k, now, FederatedReason::kBudgetSpent);
      forgive_owed(k, out);
    } else {
      lease_owed(k, now, out);
    }
  }
}

RateCharge charge_key(FederatedKey& k, std::uint64_t hits, Nanos now,
                      const FederatedKeyRules& rules, KeyEffects& out) {
  give_up(k, now, true, out);
  settle_owed(k, now, out);
  const std::uint64_t forgiven_before = out.forgiven;
  const std::uint64_t take = k.owed == 0 ? std::min(hits, usable(k.escrow, now)) : 0;
  if (take > 0 && spend(k.escrow, take, now)) out.spent += take;
  if (const std::uint64_t rest = hits - take; rest > 0) {
    if (window_spent(k, now)) {
      out.forgiven += rest;
    } else {
      if (k.owed == 0) k.owed_until = k.window_end > now ? k.window_end : now + rules.budget.period;
      k.owed = sat_add(k.owed, rest);
      lease_owed(k, now, out);
    }
  }
  const FederatedDecision none = decide_from(k, 0, true, FederatedReason::kAdmitted, now, rules);
  const FederatedDecision one = peek_key(k, 1, now, rules);
  RateCharge c;
  c.limit = none.rate.limit;
  c.remaining = none.rate.remaining;
  c.reset_after = none.rate.reset_after;
  c.retry_after = one.rate.allowed ? Nanos{0} : one.rate.retry_after;
  c.pending = k.owed;
  c.overdraft = out.forgiven - forgiven_before;
  return c;
}

std::uint64_t give_back_key(FederatedKey& k, std::uint64_t hits, Nanos now) noexcept {
  const std::uint64_t from_owed = std::min(hits, k.owed);
  k.owed -= from_owed;
  if (k.owed == 0) k.owed_until = Nanos{kFederatedNever};
  const std::uint64_t before = k.escrow.spent;
  unspend(k.escrow, hits - from_owed, now);
  return before - k.escrow.spent;
}

void lease_owed(FederatedKey& k, Nanos now, KeyEffects& out) {
  settle_owed(k, now, out);
  if (k.owed == 0 || k.leasing || now < k.closed_until || now < k.unreachable_until) return;
  k.leasing = true;
  // Of use only when it pays all that is owed, or all the budget the last reply said is left
  // (smaller pieces would cost a round trip each).
  const bool known = k.global_left != UINT64_MAX && k.global_left > 0;
  out.lease_want = k.owed;
  out.lease_need = known ? std::min(k.owed, k.global_left) : k.owed;
}

bool forgettable(const FederatedKey& k, Nanos now, const FederatedKeyRules& rules) noexcept {
  // Kept while its escrow's window lasts (a refund may still come for what it spent), and a
  // window longer, so that the next window's first lease is sized by its demand.
  return !k.leasing && k.waiting.empty() && k.escrow.units == 0 && k.owed == 0 &&
         now >= k.escrow.expires_at + rules.budget.period && now >= k.closed_until &&
         now >= k.unreachable_until;
}

}  // namespace sluice
