// shared_rate.h: a `rate` policy whose keys are kept at a coordinator (src/server/policies/
// shared_rate.cpp), so that every server that serves it decides each key on one state.
//
//   kind: rate
//   strategy: gcra                # as a local rate policy: fixed-window, sliding-window, gcra
//   limit: 100
//   period: 1s
//   burst: 20
//   coordinator: shared           # a coordinator of the config (redis, or memory: this process)
//   budget: <name>                # the keys' name at the coordinator, shared by the servers
//                                 #   that serve it; default the policy's name. No ':'
//   coordinator_timeout: 100ms    # each coordinator call's bound
//   retry_backoff: 1s             # after a failed call, answer without calling for this long
//   outage: fail-closed           # fail-closed (default: refuse, reason coordinator_unreachable,
//                                 #   HTTP 503) or fail-open (admit) while the coordinator fails
//   refusal_cache: true           # refuse a refused key here until its retry_after (default on)
//   io_threads: 2                 # coordinator calls in flight at once (each a batch)
//   max_keys: 1000000             # keys the refusal cache (and the leases) hold at once
//   lease: 10                     # GCRA only: take up to this many hits of a key at once and
//                                 #   spend them here without a call (default 0: every check is
//                                 #   decided at the coordinator, exactly)
//   lease_hold: 250ms             # leased hits not spent within this are given back
//
// Decisions: each check is one call to the coordinator (sluice/core/shared_rate.h), the calls of
// concurrent checks batched (up to 64 per script call on Redis, the batches pipelined). A
// decision is the local strategy's, exactly, on the key's one state, whichever server asks.
//
// The refusal cache: a check of `hits` refused with retry_after r, sent at t, makes this server
// refuse checks of that key of at least `hits` until t + r without a call. The coordinator
// decided at or after t, so the same request would have been refused there until then too: the
// cache refuses nothing the coordinator would have admitted, unless another server refunded hits
// of the key meanwhile (refusals are always safe). A cached refusal repeats the one it was made
// from (its limit, remaining and reset_after as of then, reset_after and retry_after counted
// down).
//
// The leased mode (lease: N): a check that finds no leased hit of its key takes up to
// max(N, hits) at the coordinator (one call: as many as fit now, debited at once) and spends them
// here until lease_hold has passed since the take was sent; what is left then is refunded. A
// leased hit is spent at most lease_hold after the coordinator counted it, so the admissions of
// any interval of length w are at most what exact GCRA allows in w + lease_hold: burst + (w +
// lease_hold) x limit / period, an overshoot of at most lease_hold x limit / period hits over any
// interval (tests/integration/shared_rate_policy_test.cpp measures it with three servers).
// Leased hits held by one server are not available to another until given back, so a key may
// also be refused somewhat earlier than exact GCRA would. A check of more hits than it takes is
// refused (the hits taken stay leased), with a retry_after estimated from the rate.
//
// Reload: a changed rate policy is rebuilt (its state is at the coordinator, which carries each
// key to the new limit, or, for a new strategy or period, starts it afresh).
#pragma once

#include <memory>
#include <string>

#include "server/registry.h"
#include "sluice/core/shared_rate.h"

namespace sluice::server {

struct SharedRateSettings {
  std::string coordinator;
  std::string budget;  // the policy's name when not set
  Nanos coordinator_timeout = std::chrono::milliseconds(100);
  Nanos retry_backoff = std::chrono::seconds(1);
  bool fail_open = false;
  bool refusal_cache = true;
  std::size_t io_threads = 2;
  std::uint64_t lease = 0;  // GCRA: hits leased at once and spent here; 0: every check exact
  Nanos lease_hold = std::chrono::milliseconds(250);
};

// For an operator who knows its coordinator lost nothing (a new Redis or database, which counts
// every key as spent for up to a period otherwise): `POST /admin/rate/{policy}/adopt` (admin).
// Tells the store of `policy`, a shared rate policy, that no state was lost (SharedRateStore::
// adopt). kInvalidArgument when it is not one.
[[nodiscard]] Status adopt_coordinator(Policy& policy, Nanos timeout);

// The policy for `rule` on `store`, its refusal cache holding at most `max_keys` keys.
[[nodiscard]] std::shared_ptr<Policy> make_shared_rate_policy(
    const BuildContext& c, const RateRule& rule, std::size_t max_keys,
    const SharedRateSettings& settings, std::shared_ptr<SharedRateStore> store);

}  // namespace sluice::server
