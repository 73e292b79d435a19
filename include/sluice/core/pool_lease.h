// pool_lease.h: one lease of a federated key through its region's pool, as steps. Pure: no lock,
// no I/O, time passed in.
//
// A process of a region that shares a pool (sluice/core/regional_escrow.h) leases for a key in
// up to three calls: it takes from the pool (P1); if that leaves it short, it leases the rest
// from the coordinator, for a regional batch when the take made it the pool's refiller; the
// refiller then puts what it does not need into the pool (P2), or ends the refill in flight when
// nothing is left over. PoolLease holds that sequence: start_pool_lease() and the on_*() steps
// each apply one call's result and say which call comes next (PoolLease::next, with its
// arguments in the lease); once it is kDone, PoolLease::outcome is what on_lease()
// (federated_key.h) applies. sluice::FederatedLimiter makes the calls; the exhaustive search of
// the pool (tests/model/federation_pool_model_test.cpp) drives the same steps.
//
// A pool call that fails sets PoolLease::pool_failed_at: the pool is left alone (leases go
// straight to the coordinator) for retry_backoff from then. A refill whose call fails may still
// have been applied (a reply lost or late after the pool ran it): the units may be in the pool,
// so the refiller gives them up rather than spend them too (PoolLease::forfeited).
//
// Thread-safety: none; plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "sluice/core/clock.h"
#include "sluice/core/escrow.h"
#include "sluice/core/federated_key.h"
#include "sluice/core/rate_coordinator.h"
#include "sluice/core/status.h"

namespace sluice {

// What the limiter's options say of leasing through a pool.
struct PoolLeaseRules {
  Nanos period{0};                   // the budget's window
  std::uint64_t regional_batch = 0;  // what a refiller leases for the pool, at most
  std::uint32_t drift_ppm = 0;       // the configured drift allowance
  // Regional-only outage: how long units the pool gives past its window may be used (until
  // the next coordinator probe is due, at least).
  Nanos coordinator_health_check{0};
};

// The call a lease through the pool makes next.
enum class PoolCall : std::uint8_t {
  kTake,    // pool take(want, outage), sent at take_sent
  kLease,   // coordinator lease(ask, need)
  kRefill,  // pool refill(refill_window, extra, refill_expires); extra == 0 ends the refill
  kDone,    // outcome is complete
};

struct PoolLease {
  PoolCall next = PoolCall::kDone;
  std::uint64_t want = 0;  // what the key asked for
  std::uint64_t need = 0;  // and of use only with at least this much
  // The take: when it was sent and its reply seen (the process's clock), the pool's clock when it
  // decided; whether it made this process the refiller.
  Nanos take_sent{0};
  Nanos seen{0};
  Nanos pool_now{0};
  bool refiller = false;
  // The coordinator's lease: asking for `ask`, of use with `lease_need`.
  std::uint64_t ask = 0;
  std::uint64_t lease_need = 0;
  // The refill: `extra` units of `refill_window` expiring at `refill_expires` on the pool's clock.
  Nanos refill_window{kFederatedNever};
  std::uint64_t extra = 0;
  Nanos refill_expires{0};
  // Set by the step whose pool call failed: the pool is left alone until this + retry_backoff.
  std::optional<Nanos> pool_failed_at;
  std::uint64_t refilled = 0;   // units put into the pool
  std::uint64_t forfeited = 0;  // units given up for a refill whose call failed
  FederatedLeaseOutcome outcome;
};

// Starts a lease of `want` (of use with `need`) at `now`. `outage`: a regional-only outage is in
// force (the coordinator is down; the pool serves past its window). `pool_up`: the pool is not
// being left alone after a failure. Next: kTake, or kLease (the pool left alone), or kDone (the
// pool left alone during an outage: outcome.pool_unreachable).
void start_pool_lease(PoolLease& l, std::uint64_t want, std::uint64_t need, bool outage,
                      bool pool_up, Nanos now);
// The take's result, seen at `seen`. Next: kDone (the pool gave all of `want`, or an outage),
// or kLease.
void on_pool_take(PoolLease& l, const StatusOr<PoolReply>& take, Nanos seen,
                  const PoolLeaseRules& rules);
// The coordinator's reply to the lease sent at `sent_at`; `ppm`: the drift allowance in force.
// Next: kDone, or kRefill for the refiller.
void on_pool_lease(PoolLease& l, StatusOr<LeaseReply> reply, Nanos sent_at, std::uint32_t ppm,
                   const PoolLeaseRules& rules);
// The refill's result at `now`. Next: kDone.
void on_pool_refill(PoolLease& l, const StatusOr<PoolReply>& refill, Nanos now);

}  // namespace sluice
