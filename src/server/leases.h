// leases.h: the server's table of admitted calls (leases), each holding its permit.
//
// What it is: Admit turns a permit into a lease with a random 128-bit id (32 hex digits, from
// the kernel's CSPRNG: a client cannot guess another client's lease) and a deadline. Release
// takes the lease out and gives its permit back; Heartbeat moves its deadline; expire(now)
// takes out every lease past its deadline, so a client that vanished frees its slot one TTL
// later. A reusable lease (an adaptive policy's, chaining no rate policy) can instead be
// renewed: its call recorded and its permit kept for its client's next call (Release with
// keep). The table is sharded by id, each shard a hash map plus a min-heap of deadlines: a
// deadline moved later leaves its entry, which is pushed again with the new deadline when it
// surfaces; one moved earlier is pushed; released leases' entries are skipped.
//
// Invariants: a lease is taken out exactly once (release, expiry or clear), and its permit is
// finished exactly then (by expiry or shutdown here; the caller finishes a taken lease's
// permit); whatever the permit needs (its policy) lives as long as it does.
//
// Thread-safety: every member is safe to call concurrently. Permits are released outside the
// shard's lock.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/string_map.h"
#include "server/permit.h"
#include "sluice/core/clock.h"

namespace sluice::server {

class Policy;

struct Lease {
  LeasePermit permit;  // keeps alive whatever it needs (its policy)
  Nanos admitted_at{0};
  Nanos ttl{0};
  Nanos expires_at{0};
  // What a Release's cost is charged to: the chained rate policy the admit passed (null:
  // none), the key it checked and the hits that check took (0 when only shadow let it pass).
  std::shared_ptr<Policy> rate;
  std::string rate_key;
  std::uint64_t rate_took = 0;
  // Whether it may be renewed: its permit renews (permit.h), it chains no rate policy (each
  // call must pass that), and it was not admitted only because of shadow mode.
  bool reusable = false;
};

// A renewal's answer: whether the lease is reusable (if not, nothing was done), how long it had
// been held since its Admit or last renewal, and whether its next call is within the policy's
// limit.
struct Renewal {
  bool reusable = false;
  Nanos held{0};
  bool kept = false;
};

// 32 lowercase hex digits from getrandom(2).
[[nodiscard]] std::string new_lease_id();
// Whether `id` has the shape new_lease_id() makes.
[[nodiscard]] bool well_formed_lease_id(std::string_view id) noexcept;

class LeaseTable {
 public:
  // Stores `lease` under a fresh id and returns the id.
  std::string insert(Lease lease);
  // Takes the lease out (nullopt: no such lease, or it was released, or its deadline is <= now:
  // then it is expired here, as the sweeper would have).
  [[nodiscard]] std::optional<Lease> take(std::string_view id, Nanos now);
  // Records on a live reusable lease (Lease::reusable) the calls it carried before this one,
  // each followed by another on the same permit (`earlier`, oldest first), and with `keep` this
  // one too (`result`, `rtt`; unset: the time held): the permit stays for the client's next
  // call, the deadline moves to now + its TTL and the time held restarts. Without `keep` the
  // lease is left for the caller to take. nullopt: no such lease (or its deadline is <= now:
  // expired here). A lease that is not reusable is left as it is (Renewal::reusable false).
  std::optional<Renewal> renew(std::string_view id, std::span<const CallEnd> earlier, bool keep,
                               CallResult result, std::optional<Nanos> rtt, Nanos now);
  // Moves a live lease's deadline to now + ttl (unset: its current TTL) and returns that TTL;
  // nullopt when there is no such lease or its deadline is <= now (too late: it stays expired).
  std::optional<Nanos> extend(std::string_view id, std::optional<Nanos> ttl, Nanos now);
  // Takes out every lease whose deadline is <= now and finishes it (ignored, by expiry: the
  // client said nothing about the call). Returns how many.
  std::size_t expire(Nanos now);
  // Takes out and finishes every lease (ignored, by shutdown). Returns how many.
  std::size_t clear();
  [[nodiscard]] std::size_t size() const;
  [[nodiscard]] std::uint64_t expired_total() const noexcept {
    return expired_.load(std::memory_order_relaxed);
  }

 private:
  struct Due {
    Nanos at;
    std::string id;
    friend bool operator>(const Due& a, const Due& b) noexcept { return a.at > b.at; }
  };
  struct alignas(64) Shard {
    mutable std::mutex mu;
    StringMap<Lease> leases;
    std::priority_queue<Due, std::vector<Due>, std::greater<>> due;
  };
  static constexpr std::size_t kShards = 16;
  Shard& shard_of(std::string_view id) noexcept;
  // Sets a lease's deadline (under its shard's lock), keeping an entry at or before it.
  static void move_deadline(Shard& s, const std::string& id, Lease& lease, Nanos to);

  std::array<Shard, kShards> shards_;
  std::atomic<std::uint64_t> expired_{0};
};

}  // namespace sluice::server
