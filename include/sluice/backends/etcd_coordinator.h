// etcd_coordinator.h: a ConcurrencyCoordinator on an etcd v3 cluster (gRPC).
//
// What it is: each heartbeat reads the key's state and its members' liveness in one Txn (one
// revision), runs the heartbeat core of sluice/core/fleet.h on it here, and writes the result
// back in a compare-and-swap Txn that holds only if nothing it read has changed since; when
// another server wrote first, it reads again and retries, after a jittered pause that grows with
// each conflict, until the call's timeout. Raft commits a write on a quorum before etcd
// acknowledges it, so a grant outlives any minority of members.
//
// Liveness follows the cluster, not a server's clock: each node's record comes with a key on an
// etcd lease of at least lease_ttl (whole seconds, rounded up; etcd's own minimum where it is
// larger), granted before the heartbeat it carries was read, so that it expires no earlier than
// the node's fence. A node whose lease key is gone is evicted by the next heartbeat; nothing
// compares two servers' clocks. Leases are shared by a coordinator's heartbeats while they can
// still cover a full lease_ttl (one LeaseGrant per second or so, not one per heartbeat), and are
// left to expire. A member's leader change only makes etcd's leases last longer.
//
// Keys, under key_prefix (default "sluice/fleet/"), with each fleet key K written as
// "<length of K>:<K>" so that no key's names fall under another's: "<K'>/state" (the FleetState,
// sluice.etcd.FleetRecord), "<K'>/live/<node id>" (on the node's lease: the member's instance),
// "origin" (the cluster id the records were written on and, in test mode, when a loss was found)
// and "recovering" (on a lease of a lease_ttl: the window after a loss was found).
//
// Loss: raft loses no acknowledged write while a quorum keeps its disks. What it can lose is the
// whole of it: an empty cluster (a first use, a wiped one), another cluster (the origin's cluster
// id differs), or a restore from an etcd snapshot, which keeps the cluster id. A restore is found
// by the first heartbeat of a coordinator that has seen a later revision than the member now
// answers at, or of a node that acknowledges a later generation than the key's record holds
// (both went back in time). Each is a loss as fleet.h defines it: for one lease_ttl from then
// every grant is share 0, and says recovering. What neither finds: a heartbeat from a server
// started after the restore, of a node granted nothing since the snapshot, before any other; its
// grant can overlap, for up to one heartbeat interval, a grant of a node that was granted since
// the snapshot (whose next heartbeat finds the loss). A coordinator that found a restore by the
// revision forgets the revisions it had seen once the loss is written to the records, so the
// share-0 window is one lease_ttl, however many writes the snapshot missed.
//
// Test mode (`caller_clock` non-null): time comes from the caller's clock, as on the other
// backends: a record lives until its expires_at (its lease must also still be there; test-mode
// leases are a minute longer), and the origin keeps when a loss was found, so that every backend
// gives identical grants for one sequence (the conformance test).
//
// Thread-safety: every member is safe to call concurrently.
#pragma once

#include <memory>
#include <string>

#include "sluice/core/coordinator.h"
#include "sluice/core/etcd_options.h"

namespace sluice {

class EtcdCoordinator final : public ConcurrencyCoordinator {
 public:
  // Checks the options and waits (at most connect_timeout) for a member in touch with a quorum.
  [[nodiscard]] static StatusOr<std::unique_ptr<EtcdCoordinator>> connect(
      EtcdOptions options, CoordinatorConfig config, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects.
  [[nodiscard]] static StatusOr<std::unique_ptr<EtcdCoordinator>> open(
      EtcdOptions options, CoordinatorConfig config, const Clock* caller_clock = nullptr);
  ~EtcdCoordinator() override;

  [[nodiscard]] StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report,
                                          Nanos timeout) noexcept override;
  [[nodiscard]] Status leave(std::string_view key, std::string_view node_id, std::uint64_t instance,
                             Nanos timeout) noexcept override;
  [[nodiscard]] const CoordinatorConfig& config() const noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "etcd"; }

  // Compare-and-swap Txns that failed because another server wrote first (each was retried).
  [[nodiscard]] std::uint64_t conflicts() const noexcept;
  // LeaseGrant calls made.
  [[nodiscard]] std::uint64_t leases_granted() const noexcept;

  struct Impl;

 private:
  explicit EtcdCoordinator(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
