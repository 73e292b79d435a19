// gateway_state.h (private): the state a Gateway builds from its config, shared by gateway.cpp
// and gateway_metrics.cpp.
//
// Layout: every object is built once in Gateway::create and never moves (std::deque storage),
// so Targets and permits hold raw pointers into it. A tenant, binding or per-tenant level that
// the config leaves unlimited has no semaphore (a null pointer) and costs nothing on the hot
// path; an unlimited route is skipped by its flag. Every upstream pool always counts (an
// unlimited one with the largest limit), so each upstream's in-flight gauge is exact.
// Counters of rejections are per upstream and level, bumped only on the reject path.
//
// Reconfiguration: the counters (Level, and a pool's PoolCounter with its queue) are owned
// jointly (shared_ptr) by every State that uses them. A gateway built to take a predecessor's
// place uses the predecessor's counter for every level of the same identity (see gateway.h),
// so a permit of the predecessor, which releases through the predecessor's State, gives its
// unit back to the counter the successor admits on. The successor's new maxima for shared
// counters wait in `pending` until take_over().
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/string_map.h"
#include "local/access_index.h"
#include "sluice/local/gateway.h"
#include "sluice/local/semaphore.h"

namespace sluice::gateway_detail {

// A semaphore and the max in force (metrics and rejections read both), which is the
// semaphore's own limit: a Level is one cache line. The max changes only when a reconfigured
// gateway takes over (set_max); held units are never revoked. A configured max above
// Semaphore::kMaxLimit reads as kMaxLimit, the limit that is enforced.
struct Level {
  explicit Level(std::uint32_t max) noexcept : sem(max) {}
  Semaphore sem;
  [[nodiscard]] std::uint32_t max() const noexcept { return sem.limit(); }
  void set_max(std::uint32_t max) noexcept { sem.set_limit(max); }
};
static_assert(sizeof(Level) == 64);

struct UpstreamState;
struct State;

struct TenantState {
  std::string id;
  // Null: no global limit (and per-tenant metrics off). With per-tenant metrics on, a tenant
  // without a limit gets an unlimited Level so its in-flight calls are counted.
  Level* global = nullptr;
  bool global_limited = false;
};

struct Waiter {
  std::uint64_t id;
  Nanos deadline;
  Target target;
  AcquireCallback callback;
};

// What a pool's calls count in and wait in: shared by the pools of the same identity of a
// gateway and its successors.
struct PoolCounter {
  explicit PoolCounter(std::uint32_t max) noexcept : level(max) {}
  Level level;  // limit kMaxLimit when the pool has no max_concurrent
  // Calls queued or about to queue. Arrivals and releasers meet here (see gateway.h).
  alignas(64) std::atomic<std::uint32_t> waiters{0};
  std::mutex mu;
  std::deque<Waiter> queue;   // guarded by mu; FIFO
  std::uint64_t next_id = 1;  // guarded by mu
};

// An upstream pool: the shared pool of an upstream, or a private binding's own. Its counter's
// members are reached through references, so the protocol code reads as one object.
struct Pool {
  Pool(const State* state, UpstreamState* upstream, PoolCounter& counter,
       std::optional<std::uint32_t> max, Strategy strategy, QueueOptions options, bool is_private)
      : state(state),
        counter(counter),
        level(counter.level),
        waiters(counter.waiters),
        mu(counter.mu),
        queue(counter.queue),
        next_id(counter.next_id),
        configured(max.value_or(Semaphore::kMaxLimit)),
        limited(max.has_value()),
        queued(strategy == Strategy::kQueue && max.has_value()),
        is_private(is_private),
        queue_options(options),
        upstream(upstream) {}

  const State* state;  // the owning state (a releasing permit knows only its Access)
  PoolCounter& counter;
  Level& level;
  std::atomic<std::uint32_t>& waiters;
  std::mutex& mu;
  std::deque<Waiter>& queue;
  std::uint64_t& next_id;
  std::uint32_t configured;  // this config's max (kMaxLimit: none)
  bool limited;
  bool queued;
  bool is_private;
  QueueOptions queue_options;
  UpstreamState* upstream;
};

struct RouteState {
  RouteState(UpstreamState* upstream, std::string id, Level& level, bool limited)
      : upstream(upstream), id(std::move(id)), level(level), limited(limited) {}
  UpstreamState* upstream;
  std::string id;
  Level& level;  // limit kMaxLimit when the route has no max_concurrent
  bool limited;
};

// One tenant's way to one upstream: the levels its calls take, in acquisition order (the
// tenant's global level is copied here rather than reached through the TenantState). resolve()
// copies them into the Target, so an admission that succeeds reads only the levels' own lines
// (on a cold tenant, two misses at once: its global level and its per-tenant level); this
// record is read again only to describe a refusal.
struct Access {
  Level* global = nullptr;  // == tenant->global
  Pool* pool = nullptr;
  Level* binding = nullptr;     // a descendant's limit stricter than the shared pool's
  Level* per_tenant = nullptr;  // per_tenant_max on this upstream (-> own_per_tenant)
  TenantState* tenant = nullptr;
  UpstreamState* upstream = nullptr;
  bool owner = false;
};

// An Access and, in the next line, its per-tenant level when that is its own (built with it,
// not carried over from a predecessor, whose level then lives in the predecessor's slot; then
// this one goes unused). One allocation each, so a successor can share the level (an aliasing
// shared_ptr keeps the slot); 128 bytes, 128-byte aligned, so the two lines are one pair for
// the adjacent-line prefetcher.
struct alignas(128) AccessSlot {
  explicit AccessSlot(std::uint32_t per_tenant_max) noexcept : own_per_tenant(per_tenant_max) {}
  Access access;
  Level own_per_tenant;
};
static_assert(sizeof(AccessSlot) == 128);

struct UpstreamState {
  std::string id;
  std::string host;
  Pool* shared = nullptr;
  std::deque<RouteState> routes;
  StringMap<RouteState*> route_index;
  // Rejections of calls to this upstream, by the level that refused (LimitLevel order).
  std::array<std::atomic<std::uint64_t>, kLimitLevelCount> exceeded{};
};

// The ids an Access is found by.
inline std::pair<std::string_view, std::string_view> access_keys(Access* a) noexcept;

struct State {
  GatewayConfig config;
  std::deque<TenantState> tenants;
  std::deque<UpstreamState> upstreams;
  std::deque<Pool> pools;
  std::vector<std::shared_ptr<AccessSlot>> accesses;
  // Every counter this state's levels and pools use (some shared with a predecessor or a
  // successor).
  std::vector<std::shared_ptr<Level>> levels;
  std::vector<std::shared_ptr<PoolCounter>> counters;
  // Built to take a predecessor's place: the maxima of shared levels to set at take_over(),
  // and the queue pools to serve then (a raised max frees units without a release).
  std::vector<std::pair<Level*, std::uint32_t>> pending;
  std::vector<Pool*> pending_drain;
  StringMap<TenantState*> tenant_index;
  StringMap<UpstreamState*> upstream_index;
  // Every (tenant, upstream) a call may name: resolve()'s one lookup.
  AccessIndex<Access*, decltype(&access_keys)> access_index{&access_keys};
  std::vector<Pool*> queued_pools;
};

inline std::pair<std::string_view, std::string_view> access_keys(Access* a) noexcept {
  return {a->tenant->id, a->upstream->id};
}

}  // namespace sluice::gateway_detail
