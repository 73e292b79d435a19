// etcd_rate_coordinator.h: federation's RateCoordinator on an etcd v3 cluster (library
// sluice::etcd, over gRPC).
//
// What it is: lease() and reconcile() read a key's ledger and the origin in one Txn, run the
// escrow core (sluice/core/escrow.h) here on the Ledger read, and write it back in a
// compare-and-swap Txn on both (retried with jittered backoff while other servers write first,
// until the call's timeout). Raft makes a grant durable on a quorum before it is answered, so a
// member's failure loses no grant.
//
// Time. etcd lends no clock. A window's time is its callers': a call decides at the caller's wall
// clock (unix_ns_now()), or at the ledger's clock_high when another caller's was later, so
// windows never go back. That is sound only while every server's wall clock is within
// `max_clock_offset` (ε, EtcdOptions) of true time, the assumption CockroachDB and Spanner-like
// systems state too; within it:
//   - a reply says `clock_uncertainty` = 2ε, and the region's escrow ends 2ε earlier on its own
//     clock (escrow_expiry()), so a window's units are spent within [start − ε, end − ε) of true
//     time, and two windows' never overlap; a lease asks for 2ε more of the window to be left
//     (min_window_left);
//   - a state loss's origin time is the finder's clock plus 2ε: no caller had read a later time
//     when the loss was found, so every window that may have lost a grant counts as spent;
//   - a caller whose clock is more than 2ε behind the ledger's clock_high (one server's clock, or
//     another's, is outside ε) is refused with kFailedPrecondition naming both times, and its
//     federated policies follow their outage mode: the skew is found, not absorbed. Detection
//     only: with a clock outside ε the bound does not hold, refusal or not (spin's
//     -DBROKEN_SKEW: the clock ahead spends a window early).
// Proof, with callers on different clocks: the exhaustive search
// (tests/model/federation_model_test.cpp, FederationModel.RegionsOnTheirOwnClocks...) and spin
// (spec/federation_escrow.pml -DCALLER_CLOCKS) hold, and catch escrow not shortened and a loss's
// origin at the finder's clock; `sluice sim federation` measures it (docs/simulations/
// federation.md, "On its callers' clocks").
//
// Keys, under key_prefix (default "sluice/fed/"): a key's ledger is
// "<prefix><length of key>:<key>/ledger" (sluice.etcd.LedgerRecord), on a lease shared by the
// coordinator's writes that lasts at least max(3 periods, 1 minute) from the write, so an idle
// key disappears (as on Redis: its window has long ended). "<prefix>origin"
// (sluice.etcd.OriginRecord) holds the cluster id the ledgers were written on and the time of the
// last loss found.
//
// State loss (escrow.h rule 3): a lease finds a loss when there is no origin (a first use, a wiped
// prefix), another cluster's id, or a revision lower than one this coordinator saw (the cluster
// was restored from a snapshot, which keeps its id); it writes the origin in the same Txn as its
// ledger, and every key's window containing the origin time counts as spent until it ends. What it
// does not find: a restore before any lease of a server that had seen the later revisions (every
// server restarted with the cluster); after restoring an etcd snapshot, delete "<prefix>origin"
// (etcdctl del) before the servers' next lease to count the windows in progress as spent.
//
// Test mode (`caller_clock` non-null): the caller's clock in place of the wall clock, so that the
// conformance test replays one sequence on every backend (with max_clock_offset 0, replies are
// identical to the memory coordinator's).
//
// Thread-safety: every member is safe to call concurrently.
#pragma once

#include <memory>
#include <string>

#include "sluice/core/clock.h"
#include "sluice/core/etcd_options.h"
#include "sluice/core/rate_coordinator.h"

namespace sluice {

class EtcdRateCoordinator final : public RateCoordinator {
 public:
  // The options' defaults with key_prefix "sluice/fed/".
  [[nodiscard]] static EtcdOptions default_options();
  // Checks the options (also max_clock_offset >= 0) and waits (at most connect_timeout) for a
  // member in touch with a quorum.
  [[nodiscard]] static StatusOr<std::unique_ptr<EtcdRateCoordinator>> connect(
      EtcdOptions options, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects.
  [[nodiscard]] static StatusOr<std::unique_ptr<EtcdRateCoordinator>> open(
      EtcdOptions options, const Clock* caller_clock = nullptr);
  ~EtcdRateCoordinator() override;

  [[nodiscard]] StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& request,
                                           Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region,
                                                  Nanos window_start, std::uint64_t relinquished,
                                                  Nanos timeout) noexcept override;
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "etcd"; }

  // Compare-and-swap Txns that failed because another server wrote first (each was retried).
  [[nodiscard]] std::uint64_t conflicts() const noexcept;

  struct Impl;

 private:
  explicit EtcdRateCoordinator(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
