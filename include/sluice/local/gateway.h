// gateway.h: concurrency limits of a multi-tenant gateway (tenant, upstream, route levels).
//
// What it is: every state the config describes is built once, up front (a semaphore per
// tenant, per upstream pool, per stricter binding, per (tenant, upstream) with per_tenant_max,
// per limited route). A call resolves its (tenant, upstream, route) names to a Target once and
// then acquires on it:
//
//   tenant global -> upstream pool (shared, or a private binding's own) -> binding (a
//   descendant's stricter limit) -> per-tenant-on-upstream -> route
//
// All levels or none: a level that refuses gives back the units taken before it, and the
// Rejection names that level. Each level is a sluice::Semaphore, so a level is never pushed
// past its max, under any interleaving, not even for an instant (admission is one atomic
// read-modify-write per level, never check-then-act). Sharing semantics: gateway_merge.h.
//
// Strategy queue: an upstream pool with strategy kQueue keeps a bounded FIFO of waiters.
// A waiter holds its tenant unit while it waits. Releasing a pool unit while waiters exist hands
// it straight to the head waiter (FIFO, one waiter woken per unit, and arrivals never barge
// ahead of waiters). A waiter leaves the queue when served, cancelled, or expired by tick(now).
// No lost wake-up: every decrement of a queue pool's count (a release, or the rollback of a
// refused claim) is followed by a read of its `waiters` counter and, if that is non-zero, a
// drain under the pool's mutex; an arrival that may queue increments `waiters` under the mutex,
// retries, and drains before unlocking. All of these are seq_cst, so in their total order one
// side always sees the other (gateway.cpp has the argument; spec/gateway_queue.pml and an
// exhaustive search in the tests check it). The mutex is taken only on that slow path.
//
// Reconfiguration: a gateway built from a new config to take another's place (create(config,
// previous), then take_over()) counts on the same counters wherever the two configs name the
// same level, so the old gateway's permits stay counted until released; see create().
//
// Thread-safety: every member function is safe to call concurrently (except take_over() with
// itself; create(config, previous) only reads `previous`). try_acquire() takes no
// lock and allocates nothing, on admit and on reject (on a queue-strategy upstream, a refused
// claim that finds calls waiting drains the queue for them under its mutex: that is the
// protocol, and the only exception). Callbacks of acquire_async() run exactly
// once (unless cancel() returned true: then never), on the thread that decided: the caller of
// acquire_async() when decided at once, otherwise whichever thread handed it a unit (a releaser
// of a permit, a refused caller rolling back, an arrival draining before it unlocks) or the
// caller of tick() on expiry. Callbacks must not throw and must not block on another
// permit of the same pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "sluice/core/clock.h"
#include "sluice/local/gateway_admission.h"
#include "sluice/local/gateway_config.h"
#include "sluice/local/gateway_validation.h"

namespace sluice {

namespace gateway_detail {
struct State;
struct Pool;
}  // namespace gateway_detail

class GatewayMetrics;
struct GatewayBuild;

// Called once with the outcome of acquire_async: a permit or a rejection.
using AcquireCallback = std::function<void(Admission)>;

// A call waiting in an upstream's queue. Empty when acquire_async decided at once.
class AcquireTicket {
 public:
  AcquireTicket() noexcept = default;
  // True if the call was still waiting: it leaves the queue, gives back its tenant unit, and its
  // callback is never called. False if it was already decided (its callback has run or is
  // running) or never queued.
  bool cancel() noexcept;
  // Whether acquire_async queued the call (it may have been decided since).
  [[nodiscard]] bool queued() const noexcept { return pool_ != nullptr; }

 private:
  friend class Gateway;
  AcquireTicket(gateway_detail::Pool* pool, std::uint64_t id) noexcept : pool_(pool), id_(id) {}
  gateway_detail::Pool* pool_ = nullptr;
  std::uint64_t id_ = 0;
};

class Gateway {
 public:
  // Validates `config` and, if it has no errors, builds every level's state. The report holds
  // the warnings either way.
  [[nodiscard]] static GatewayBuild create(GatewayConfig config);
  // As create(), for a gateway that takes `previous`'s place (a reloaded config). Every level
  // of the same identity in both configs is the same counter: a tenant's global limit, an
  // upstream's pool (if its strategy, reject or queue, is the same), a (tenant, upstream)
  // binding, per-tenant or private pool, an upstream's route. So calls admitted by `previous`
  // stay counted where the new gateway admits until they are released (through `previous`,
  // which must outlive its permits and tickets): lowering a max drains, it never over-admits.
  // A level the new config adds (a new upstream, a limit where there was none, a pool whose
  // strategy changed) starts at zero: calls admitted before it existed do not count against
  // it. Building changes nothing `previous` serves with: the shared levels keep their maxima
  // until take_over(). Waiters of a pool the new config drops stay `previous`'s to expire.
  [[nodiscard]] static GatewayBuild create(GatewayConfig config, const Gateway& previous);
  // Puts this gateway's maxima in force on the levels it shares with the gateway it was built
  // to replace (held units are never revoked; a raised queue pool serves its waiters at once).
  // Call it once, when switching callers over; later calls do nothing. Not thread-safe with
  // itself. A gateway built by create(config) has nothing to take over.
  void take_over() noexcept;
  // Precondition: no permit or ticket of this gateway outlives it. Any call still queued is
  // rejected (kQueueTimeout), so every callback runs exactly once.
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Names -> Target. An empty `route` means the call names no route. No allocation on success.
  [[nodiscard]] Resolution resolve(std::string_view tenant, std::string_view upstream,
                                   std::string_view route = {}) const;

  // The hot path. Never waits: on a queue-strategy upstream it refuses while calls are queued
  // (they are ahead of it). Precondition: `target` came from this Gateway's resolve().
  [[nodiscard]] Admission try_acquire(const Target& target) noexcept;
  // resolve() + try_acquire(); an unknown name yields an Admission holding a ResolveError.
  [[nodiscard]] Admission try_acquire(std::string_view tenant, std::string_view upstream,
                                      std::string_view route = {});

  // As try_acquire, but a call finding a queue-strategy upstream full waits in its queue (until
  // now + queue timeout, enforced by tick). `callback` gets the outcome exactly once.
  AcquireTicket acquire_async(const Target& target, Nanos now, AcquireCallback callback);
  // Whether the call's upstream pool queues (strategy queue with a max_concurrent): only then
  // may acquire_async() leave it waiting. Precondition as try_acquire's.
  [[nodiscard]] bool queues(const Target& target) const noexcept;
  // Rejects every waiter whose deadline is <= now; returns how many. Timers call this.
  std::size_t tick(Nanos now);
  // Blocking convenience on the real clock: waits up to min(timeout, queue timeout).
  [[nodiscard]] Admission acquire_wait(const Target& target, Nanos timeout);

  [[nodiscard]] const GatewayConfig& config() const noexcept;

 private:
  friend class GatewayMetrics;
  explicit Gateway(std::unique_ptr<gateway_detail::State> state) noexcept;
  static GatewayBuild build(GatewayConfig config, const gateway_detail::State* previous);
  // Rejects the waiters whose deadline is <= now (own_only: only this gateway's own).
  std::size_t expire(Nanos now, bool own_only);
  std::unique_ptr<gateway_detail::State> state_;
};

struct GatewayBuild {
  std::unique_ptr<Gateway> gateway;  // null when report.errors is not empty
  ValidationReport report;
};

}  // namespace sluice
