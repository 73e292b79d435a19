// gateway_state.h (private): the state a Gateway builds from its config, shared by gateway.cpp
// and gateway_metrics.cpp.
//
// Layout: every object is built once in Gateway::create and never moves (std::deque storage),
// so Targets and permits hold raw pointers into it. A tenant, binding or per-tenant level that
// the config leaves unlimited has no semaphore (a null pointer) and costs nothing on the hot
// path; an unlimited route is skipped by its flag. Every upstream pool always counts (an
// unlimited one with the largest limit), so each upstream's in-flight gauge is exact.
// Counters of rejections are per upstream and level, bumped only on the reject path.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/string_map.h"
#include "local/access_index.h"
#include "sluice/gateway.h"
#include "sluice/semaphore.h"

namespace sluice::gateway_detail {

// A semaphore plus the configured max it was built with (metrics and rejections read both).
struct Level {
  explicit Level(std::uint32_t max) noexcept : sem(max), max(max) {}
  Semaphore sem;
  std::uint32_t max;
};

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

// An upstream pool: the shared pool of an upstream, or a private binding's own.
struct Pool {
  Pool(const State* state, UpstreamState* upstream, std::optional<std::uint32_t> max,
       Strategy strategy, QueueOptions queue, bool is_private)
      : state(state),
        level(max.value_or(Semaphore::kMaxLimit)),
        limited(max.has_value()),
        queued(strategy == Strategy::kQueue && max.has_value()),
        is_private(is_private),
        queue_options(queue),
        upstream(upstream) {}

  const State* state;  // the owning state (a releasing permit knows only its Access)
  Level level;         // limit kMaxLimit when the pool has no max_concurrent
  bool limited;
  bool queued;
  bool is_private;
  QueueOptions queue_options;
  UpstreamState* upstream;
  // Calls queued or about to queue. Arrivals and releasers meet here (see gateway.h).
  alignas(64) std::atomic<std::uint32_t> waiters{0};
  std::mutex mu;
  std::deque<Waiter> queue;   // guarded by mu; FIFO
  std::uint64_t next_id = 1;  // guarded by mu
};

struct RouteState {
  RouteState(UpstreamState* upstream, std::string id, std::optional<std::uint32_t> max)
      : upstream(upstream),
        id(std::move(id)),
        level(max.value_or(Semaphore::kMaxLimit)),
        limited(max.has_value()) {}
  UpstreamState* upstream;
  std::string id;
  Level level;
  bool limited;
};

// One tenant's way to one upstream: the levels its calls take, in acquisition order. The hot
// path reads only this object's first cache line for every pointer it follows (the tenant's
// global level is copied here rather than reached through the TenantState), and the
// per-tenant semaphore lives in the next line, so an admission on a cold tenant costs about
// two independent cache misses, not a chain of dependent ones.
struct Access {
  Level* global = nullptr;  // == tenant->global
  Pool* pool = nullptr;
  Level* binding = nullptr;     // a descendant's limit stricter than the shared pool's
  Level* per_tenant = nullptr;  // per_tenant_max on this upstream (-> own_per_tenant)
  TenantState* tenant = nullptr;
  UpstreamState* upstream = nullptr;
  bool owner = false;
  std::optional<Level> own_per_tenant;
};

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
  std::deque<Access> accesses;
  std::deque<Level> levels;  // tenant global, binding and per-tenant levels
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
