#include "sluice/local/gateway.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "local/gateway_merge.h"
#include "local/gateway_state.h"

namespace sluice {
namespace gateway_detail {

// The one place that sees inside Target and GatewayPermit.
struct Chain {
  static Target target(Access* access, RouteState* route) noexcept {
    return {access, route, access->global, access->pool, access->binding, access->per_tenant};
  }
  static Pool& pool(const Target& t) noexcept { return *t.pool_; }
  static Level* binding(const Target& t) noexcept { return t.binding_; }
  static Level* per_tenant(const Target& t) noexcept { return t.per_tenant_; }
  static Level* tenant_level(const Target& t) noexcept { return t.tenant_; }
  static Access& access(const Target& t) noexcept { return *t.access_; }
  static RouteState* route(const Target& t) noexcept { return t.route_; }
  static GatewayPermit permit(const Target& t) noexcept { return GatewayPermit(t); }
};

namespace {

struct Refusal {
  LimitLevel kind;
  const Level* level;
};

void release_tenant(const Target& t) noexcept {
  if (Level* global = Chain::tenant_level(t); global != nullptr) global->sem.release_unit();
}

// Takes the levels after the pool (binding, per-tenant, route). On refusal gives back the ones
// it took and says which refused.
bool take_tail(const Target& t, Refusal& why) noexcept {
  Level* binding = Chain::binding(t);
  Level* per_tenant = Chain::per_tenant(t);
  RouteState* r = Chain::route(t);
  if (binding != nullptr && !binding->sem.try_acquire_unit()) {
    why = {LimitLevel::kBinding, binding};
    return false;
  }
  if (per_tenant != nullptr && !per_tenant->sem.try_acquire_unit()) {
    if (binding != nullptr) binding->sem.release_unit();
    why = {LimitLevel::kPerTenant, per_tenant};
    return false;
  }
  if (r != nullptr && r->limited && !r->level.sem.try_acquire_unit()) {
    if (per_tenant != nullptr) per_tenant->sem.release_unit();
    if (binding != nullptr) binding->sem.release_unit();
    why = {LimitLevel::kRoute, &r->level};
    return false;
  }
  return true;
}

void release_tail(const Target& t) noexcept {
  if (RouteState* r = Chain::route(t); r != nullptr && r->limited) r->level.sem.release_unit();
  if (Level* per_tenant = Chain::per_tenant(t); per_tenant != nullptr)
    per_tenant->sem.release_unit();
  if (Level* binding = Chain::binding(t); binding != nullptr) binding->sem.release_unit();
}

Rejection make_rejection(const State& s, const Access& a, const RouteState* r, Refusal why,
                         RejectReason reason) noexcept {
  a.upstream->exceeded[static_cast<std::size_t>(why.kind)].fetch_add(1, std::memory_order_relaxed);
  Rejection out;
  out.level = why.kind;
  out.reason = reason;
  out.type = s.config.problem.type;
  out.title = s.config.problem.title;
  out.status = s.config.problem.status;
  out.retry_after = std::chrono::seconds(s.config.problem.retry_after_seconds);
  out.upstream_id = a.upstream->id;
  out.host = a.upstream->host;
  out.tenant_id = a.tenant->id;
  if (r != nullptr) out.route_id = r->id;
  // The raw count may include refused acquirers mid-rollback for an instant: report at most
  // the max, which is what a full level holds.
  out.current_in_flight = std::min(why.level->sem.in_flight(), why.level->max());
  out.max_concurrent = why.level->max();
  return out;
}

using Decided = std::vector<std::pair<AcquireCallback, Admission>>;

// The queue protocol (a queue-strategy pool; spec/gateway_queue.pml is its model):
//   - every decrement of the pool's count, a release or the rollback of a refused claim made
//     outside the mutex, is seq_cst and is followed by a seq_cst read of `waiters`; if that is
//     non-zero the decrementer drains the queue under the mutex;
//   - an arrival that may queue takes the mutex, increments `waiters` (seq_cst), retries the
//     pool (seq_cst) if the queue is empty, and drains before it unlocks (its own rollback is
//     covered by that drain);
//   - a drain hands free units to head waiters in order, and stops at the first refused claim
//     (whoever holds the count up, a holder or a refused acquirer mid-rollback, decrements it
//     later and drains then).
// In the single total order of the seq_cst operations, a waiter's increment either precedes a
// decrementer's read (which then drains, after the waiter queued: it held the mutex) or
// follows it (and the waiter's retry sees the decrement). No waiter is stranded next to a free
// unit; the exhaustive search in tests/model/gateway_model_test.cpp and spin both check it.

// Under p.mu: hands free pool units to the head waiters, FIFO, while both exist. Allocates
// (may throw) only before it touches the queue: nothing taken out of it can be lost.
void drain_locked(const State& s, Pool& p, Decided& decided) {
  decided.reserve(decided.size() + p.queue.size());
  while (!p.queue.empty()) {
    if (!p.level.sem.try_claim_unit(std::memory_order_seq_cst)) {
      p.level.sem.release_unit(std::memory_order_seq_cst);
      return;
    }
    Waiter w = std::move(p.queue.front());
    p.queue.pop_front();
    p.waiters.fetch_sub(1, std::memory_order_seq_cst);
    Refusal why{};
    if (take_tail(w.target, why)) {
      decided.emplace_back(std::move(w.callback), Admission(Chain::permit(w.target)));
    } else {
      p.level.sem.release_unit(std::memory_order_seq_cst);  // offered to the next waiter
      release_tenant(w.target);
      decided.emplace_back(
          std::move(w.callback),
          Admission(make_rejection(s, Chain::access(w.target), Chain::route(w.target), why,
                                   RejectReason::kLimitReached)));
    }
  }
}

// Runs the callbacks of waiters a drain decided, outside the mutex (a callback may release a
// permit of this pool).
void deliver(Decided& decided) {
  for (auto& [callback, admission] : decided) callback(std::move(admission));
}

// After a seq_cst decrement of a queue pool's count: the other half of the protocol.
void after_decrement(const State& s, Pool& p) noexcept {
  if (p.waiters.load(std::memory_order_seq_cst) == 0) return;
  try {
    Decided decided;
    {
      const std::lock_guard lock(p.mu);
      drain_locked(s, p, decided);
    }
    deliver(decided);
  } catch (...) {
    // Only the decided list's allocation can throw, before any waiter left the queue; the
    // waiters stay queued and the next decrement (or their timeout) decides them.
  }
}

void release_pool(const State& s, Pool& p) noexcept {
  if (!p.queued) {
    p.level.sem.release_unit();
    return;
  }
  p.level.sem.release_unit(std::memory_order_seq_cst);
  after_decrement(s, p);
}

// One claim on the pool by a call that will not queue for it now: false if refused (the
// refusal is rolled back). A queue pool with waiters refuses outright: they are ahead.
bool claim_pool(const State& s, Pool& p) noexcept {
  if (!p.queued) return p.level.sem.try_acquire_unit();
  if (p.waiters.load(std::memory_order_seq_cst) != 0) return false;
  if (p.level.sem.try_claim_unit(std::memory_order_seq_cst)) return true;
  p.level.sem.release_unit(std::memory_order_seq_cst);
  after_decrement(s, p);
  return false;
}

// Pool unit held: take the rest, or give everything back.
Admission finish(const State& s, Pool& p, const Target& t) noexcept {
  Refusal why{};
  if (take_tail(t, why)) [[likely]]
    return Chain::permit(t);
  release_pool(s, p);
  release_tenant(t);
  return make_rejection(s, Chain::access(t), Chain::route(t), why, RejectReason::kLimitReached);
}

}  // namespace

void release_chain(const Target& target) noexcept {
  release_tail(target);
  // The state outlives its permits; the pool knows it.
  Pool& p = Chain::pool(target);
  release_pool(*p.state, p);
  release_tenant(target);
}

}  // namespace gateway_detail

using gateway_detail::Access;
using gateway_detail::AccessSlot;
using gateway_detail::Chain;
using gateway_detail::Level;
using gateway_detail::Pool;
using gateway_detail::PoolCounter;
using gateway_detail::Refusal;
using gateway_detail::RouteState;
using gateway_detail::State;
using gateway_detail::TenantState;
using gateway_detail::UpstreamState;

std::string ResolveError::message() const {
  switch (code) {
    case Code::kUnknownTenant:
      return "tenant: unknown tenant '" + id + "'";
    case Code::kUnknownUpstream:
      return "upstream: unknown upstream '" + id + "'";
    case Code::kUnknownRoute:
      return "route: unknown route '" + id + "'";
    case Code::kNotBound:
      return "upstream: tenant '" + tenant + "' may not call upstream '" + id +
             "': it neither owns it nor has a binding to it";
  }
  return "unresolved call";
}

namespace {

// The counters of a predecessor, by identity, for a successor to share (empty: a fresh
// gateway). Each lookup returns the predecessor's counter of that identity, or null.
class Carried {
 public:
  explicit Carried(const State* prev) : prev_(prev) {
    if (prev_ == nullptr) return;
    for (const auto& l : prev_->levels) levels_.emplace(l.get(), l);
    for (const auto& c : prev_->counters) counters_.emplace(c.get(), c);
  }
  [[nodiscard]] std::shared_ptr<Level> tenant(const std::string& id) const {
    if (prev_ == nullptr) return nullptr;
    auto it = prev_->tenant_index.find(id);
    return it == prev_->tenant_index.end() ? nullptr : level(it->second->global);
  }
  [[nodiscard]] const UpstreamState* upstream(const std::string& id) const {
    if (prev_ == nullptr) return nullptr;
    auto it = prev_->upstream_index.find(id);
    return it == prev_->upstream_index.end() ? nullptr : it->second;
  }
  [[nodiscard]] std::shared_ptr<Level> route(const std::string& upstream,
                                             const std::string& id) const {
    const UpstreamState* u = this->upstream(upstream);
    if (u == nullptr) return nullptr;
    auto it = u->route_index.find(id);
    return it == u->route_index.end() ? nullptr : level(&it->second->level);
  }
  [[nodiscard]] const Access* access(const std::string& tenant, const std::string& upstream) const {
    return prev_ == nullptr ? nullptr : prev_->access_index.find(tenant, upstream);
  }
  [[nodiscard]] std::shared_ptr<Level> level(const Level* l) const {
    auto it = levels_.find(l);
    return it == levels_.end() ? nullptr : it->second;
  }
  // The pool's counter if it has the same strategy (a queue pool's counter holds its waiters,
  // which only a queue pool serves).
  [[nodiscard]] std::shared_ptr<PoolCounter> counter(const Pool* p, bool queued) const {
    if (p == nullptr || p->queued != queued) return nullptr;
    auto it = counters_.find(&p->counter);
    return it == counters_.end() ? nullptr : it->second;
  }

 private:
  const State* prev_;
  std::unordered_map<const Level*, std::shared_ptr<Level>> levels_;
  std::unordered_map<const PoolCounter*, std::shared_ptr<PoolCounter>> counters_;
};

// Builds the state of `c` (validated) into `st`, sharing `carried`'s counters by identity.
class Builder {
 public:
  Builder(State& st, const Carried& carried) : st_(st), carried_(carried) {}

  void build() {
    const GatewayConfig& c = st_.config;
    for (const TenantConfig& tc : c.tenants) add_tenant(tc);
    for (const UpstreamConfig& uc : c.upstreams) add_upstream(uc);
    for (const BindingConfig& bc : c.bindings) add_binding(bc);
    std::vector<Access*> all;
    all.reserve(st_.accesses.size());
    for (const auto& slot : st_.accesses) all.push_back(&slot->access);
    st_.access_index.build(all);
  }

 private:
  // A level of max `max`: `existing` (carried over: a new max waits for take_over), or a new one.
  Level* level(std::shared_ptr<Level> existing, std::uint32_t max) {
    if (existing == nullptr)
      existing = std::shared_ptr<Level>(new Level(max));  // one line; its control block apart
    else if (existing->max() != max)
      st_.pending.emplace_back(existing.get(), max);
    st_.levels.push_back(existing);
    return existing.get();
  }

  void add_tenant(const TenantConfig& tc) {
    TenantState& t = st_.tenants.emplace_back();
    t.id = tc.id;
    if (tc.global_concurrency_limit || st_.config.metrics.per_tenant) {
      t.global =
          level(carried_.tenant(t.id), tc.global_concurrency_limit.value_or(Semaphore::kMaxLimit));
      t.global_limited = tc.global_concurrency_limit.has_value();
    }
    st_.tenant_index.emplace(t.id, &t);
  }

  Pool& add_pool(UpstreamState& u, const EffectiveLimit& e, bool is_private, const Pool* was) {
    const bool queued = e.strategy == Strategy::kQueue && e.max_concurrent.has_value();
    const std::uint32_t max = e.max_concurrent.value_or(Semaphore::kMaxLimit);
    std::shared_ptr<PoolCounter> counter = carried_.counter(was, queued);
    const bool carried = counter != nullptr;
    if (!carried) counter = std::make_shared<PoolCounter>(max);
    st_.counters.push_back(counter);
    Pool& p = st_.pools.emplace_back(&st_, &u, *counter, e.max_concurrent, e.strategy, e.queue,
                                     is_private);
    if (p.queued) st_.queued_pools.push_back(&p);
    if (carried && counter->level.max() != max) {
      st_.pending.emplace_back(&counter->level, max);
      if (p.queued) st_.pending_drain.push_back(&p);
    }
    return p;
  }

  void add_access(TenantState& t, UpstreamState& u, Pool& pool,
                  std::optional<std::uint32_t> binding, std::optional<std::uint32_t> per_tenant_max,
                  bool owner) {
    const Access* was = carried_.access(t.id, u.id);
    // Not make_shared: its control block would sit in front of the slot, in another line pair.
    std::shared_ptr<AccessSlot> slot = st_.accesses.emplace_back(
        std::shared_ptr<AccessSlot>(new AccessSlot(per_tenant_max.value_or(0))));
    Access& a = slot->access;
    a.tenant = &t;
    a.upstream = &u;
    a.pool = &pool;
    a.global = t.global;
    // A binding or per-tenant cap no stricter than the pool's own max can never refuse: none.
    if (binding && *binding < pool.configured)
      a.binding = level(was != nullptr ? carried_.level(was->binding) : nullptr, *binding);
    if (per_tenant_max && *per_tenant_max < pool.configured) {
      std::shared_ptr<Level> carried = was != nullptr ? carried_.level(was->per_tenant) : nullptr;
      if (carried == nullptr)  // its own, beside it: one more line, not one more miss
        carried = std::shared_ptr<Level>(slot, &slot->own_per_tenant);
      a.per_tenant = level(std::move(carried), *per_tenant_max);
    }
    a.owner = owner;
  }

  void add_upstream(const UpstreamConfig& uc) {
    UpstreamState& u = st_.upstreams.emplace_back();
    u.id = uc.id;
    u.host = uc.host;
    const UpstreamState* was = carried_.upstream(u.id);
    const EffectiveLimit own = owner_limit(uc.concurrency_limit);
    u.shared = &add_pool(u, own, false, was != nullptr ? was->shared : nullptr);
    for (const RouteConfig& rc : uc.routes) {
      Level* l =
          level(carried_.route(u.id, rc.id), rc.max_concurrent.value_or(Semaphore::kMaxLimit));
      RouteState& r = u.routes.emplace_back(&u, rc.id, *l, rc.max_concurrent.has_value());
      u.route_index.emplace(r.id, &r);
    }
    st_.upstream_index.emplace(u.id, &u);
    add_access(*st_.tenant_index.find(uc.owner)->second, u, *u.shared, std::nullopt,
               own.per_tenant_max, true);
  }

  void add_binding(const BindingConfig& bc) {
    UpstreamState& u = *st_.upstream_index.find(bc.upstream)->second;
    TenantState& t = *st_.tenant_index.find(bc.tenant)->second;
    const GatewayConfig& c = st_.config;
    const UpstreamConfig& uc =
        *std::find_if(c.upstreams.begin(), c.upstreams.end(),
                      [&](const UpstreamConfig& x) { return x.id == bc.upstream; });
    const EffectiveLimit e = *merge_binding(uc.concurrency_limit, bc.concurrency_limit);
    if (e.private_pool) {
      const Access* was = carried_.access(t.id, u.id);
      const Pool* was_pool = was != nullptr && was->pool->is_private ? was->pool : nullptr;
      add_access(t, u, add_pool(u, e, true, was_pool), std::nullopt, e.per_tenant_max, false);
      return;
    }
    add_access(t, u, *u.shared, e.max_concurrent, e.per_tenant_max, false);
  }

  State& st_;
  const Carried& carried_;
};

}  // namespace

GatewayBuild Gateway::create(GatewayConfig config) { return build(std::move(config), nullptr); }

GatewayBuild Gateway::create(GatewayConfig config, const Gateway& previous) {
  return build(std::move(config), previous.state_.get());
}

GatewayBuild Gateway::build(GatewayConfig config, const State* previous) {
  GatewayBuild out;
  out.report = validate(config);
  if (!out.report.ok()) return out;
  auto st = std::make_unique<State>();
  st->config = std::move(config);
  const Carried carried(previous);
  Builder(*st, carried).build();
  out.gateway.reset(new Gateway(std::move(st)));
  return out;
}

void Gateway::take_over() noexcept {
  State& s = *state_;
  for (const auto& [level, max] : s.pending) level->set_max(max);
  s.pending.clear();
  // A raised max frees units that no release will announce: serve the queues now.
  for (Pool* p : s.pending_drain) gateway_detail::after_decrement(s, *p);
  s.pending_drain.clear();
}

Gateway::Gateway(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}

Gateway::~Gateway() {
  // No call may wait on a gateway that is going away: every waiter of its own is rejected (its
  // callback runs once, as promised).
  expire(Nanos::max(), true);
}

const GatewayConfig& Gateway::config() const noexcept { return state_->config; }

Resolution Gateway::resolve(std::string_view tenant, std::string_view upstream,
                            std::string_view route) const {
  Access* a = state_->access_index.find(tenant, upstream);
  if (a == nullptr) [[unlikely]] {
    using Code = ResolveError::Code;
    if (state_->tenant_index.find(tenant) == state_->tenant_index.end())
      return ResolveError{Code::kUnknownTenant, std::string(tenant), std::string(tenant)};
    const bool known = state_->upstream_index.find(upstream) != state_->upstream_index.end();
    return ResolveError{known ? Code::kNotBound : Code::kUnknownUpstream, std::string(upstream),
                        std::string(tenant)};
  }
  RouteState* r = nullptr;
  if (!route.empty()) {
    const auto ri = a->upstream->route_index.find(route);
    if (ri == a->upstream->route_index.end())
      return ResolveError{ResolveError::Code::kUnknownRoute, std::string(route),
                          std::string(tenant)};
    r = ri->second;
  }
  return Chain::target(a, r);
}

Admission Gateway::try_acquire(const Target& target) noexcept {
  const State& s = *state_;
  Level* global = Chain::tenant_level(target);
  if (global != nullptr && !global->sem.try_acquire_unit())
    return gateway_detail::make_rejection(s, Chain::access(target), Chain::route(target),
                                          {LimitLevel::kTenant, global},
                                          RejectReason::kLimitReached);
  Pool& p = Chain::pool(target);
  if (!gateway_detail::claim_pool(s, p)) [[unlikely]] {
    gateway_detail::release_tenant(target);
    return gateway_detail::make_rejection(s, Chain::access(target), Chain::route(target),
                                          {LimitLevel::kUpstream, &p.level},
                                          RejectReason::kLimitReached);
  }
  return gateway_detail::finish(s, p, target);
}

Admission Gateway::try_acquire(std::string_view tenant, std::string_view upstream,
                               std::string_view route) {
  Resolution res = resolve(tenant, upstream, route);
  if (!res.ok()) return *res.error();
  return try_acquire(res.target());
}

AcquireTicket Gateway::acquire_async(const Target& target, Nanos now, AcquireCallback callback) {
  const State& s = *state_;
  const Access& a = Chain::access(target);
  Pool& p = Chain::pool(target);
  if (!p.queued) {
    callback(try_acquire(target));
    return {};
  }
  RouteState* r = Chain::route(target);
  Level* global = Chain::tenant_level(target);
  if (global != nullptr && !global->sem.try_acquire_unit()) {
    callback(gateway_detail::make_rejection(s, a, r, {LimitLevel::kTenant, global},
                                            RejectReason::kLimitReached));
    return {};
  }
  if (gateway_detail::claim_pool(s, p)) {
    callback(gateway_detail::finish(s, p, target));
    return {};
  }
  gateway_detail::Decided decided;
  std::unique_lock lock(p.mu);
  p.waiters.fetch_add(1, std::memory_order_seq_cst);
  if (p.queue.empty()) {
    if (p.level.sem.try_claim_unit(std::memory_order_seq_cst)) {
      p.waiters.fetch_sub(1, std::memory_order_seq_cst);
      lock.unlock();
      callback(gateway_detail::finish(s, p, target));
      return {};
    }
    p.level.sem.release_unit(std::memory_order_seq_cst);  // the drain below covers it
  }
  if (p.queue.size() >= p.queue_options.max_depth) {
    p.waiters.fetch_sub(1, std::memory_order_seq_cst);
    gateway_detail::drain_locked(s, p, decided);
    lock.unlock();
    gateway_detail::deliver(decided);
    gateway_detail::release_tenant(target);
    callback(gateway_detail::make_rejection(s, a, r, {LimitLevel::kUpstream, &p.level},
                                            RejectReason::kQueueFull));
    return {};
  }
  const std::uint64_t id = p.next_id++;
  p.queue.push_back({id, now + p.queue_options.timeout, target, std::move(callback)});
  gateway_detail::drain_locked(s, p, decided);  // may serve this very call
  lock.unlock();
  gateway_detail::deliver(decided);
  return AcquireTicket(&p, id);
}

bool Gateway::queues(const Target& target) const noexcept { return Chain::pool(target).queued; }

std::size_t Gateway::tick(Nanos now) { return expire(now, false); }

std::size_t Gateway::expire(Nanos now, bool own_only) {
  const State& s = *state_;
  // A queue shared with a predecessor or a successor also holds their waiters; `own_only`
  // leaves those to their own gateway.
  const auto stays = [&](const gateway_detail::Waiter& w) {
    return w.deadline > now || (own_only && Chain::pool(w.target).state != &s);
  };
  std::size_t expired = 0;
  for (Pool* p : s.queued_pools) {
    std::vector<gateway_detail::Waiter> out;
    {
      const std::lock_guard lock(p->mu);
      auto keep = std::stable_partition(p->queue.begin(), p->queue.end(), stays);
      std::move(keep, p->queue.end(), std::back_inserter(out));
      p->queue.erase(keep, p->queue.end());
      p->waiters.fetch_sub(static_cast<std::uint32_t>(out.size()), std::memory_order_seq_cst);
    }
    for (auto& w : out) {
      gateway_detail::release_tenant(w.target);
      w.callback(gateway_detail::make_rejection(s, Chain::access(w.target), Chain::route(w.target),
                                                {LimitLevel::kUpstream, &p->level},
                                                RejectReason::kQueueTimeout));
    }
    expired += out.size();
  }
  return expired;
}

Admission Gateway::acquire_wait(const Target& target, Nanos timeout) {
  struct Slot {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Admission> result;
  };
  auto slot = std::make_shared<Slot>();
  const Pool& p = Chain::pool(target);
  AcquireTicket ticket = acquire_async(target, SteadyClock::instance().now(), [slot](Admission a) {
    const std::lock_guard lock(slot->mu);
    slot->result.emplace(std::move(a));
    slot->cv.notify_all();
  });
  std::unique_lock lock(slot->mu);
  const Nanos wait = std::min(timeout, p.queue_options.timeout);
  if (!slot->cv.wait_for(lock, wait, [&] { return slot->result.has_value(); })) {
    lock.unlock();
    if (ticket.cancel()) {
      const Access& a = Chain::access(target);
      return gateway_detail::make_rejection(*state_, a, Chain::route(target),
                                            {LimitLevel::kUpstream, &p.level},
                                            RejectReason::kQueueTimeout);
    }
    lock.lock();  // decided meanwhile: its callback is delivering the result
    slot->cv.wait(lock, [&] { return slot->result.has_value(); });
  }
  return std::move(*slot->result);
}

bool AcquireTicket::cancel() noexcept {
  Pool* p = std::exchange(pool_, nullptr);
  if (p == nullptr) return false;
  std::optional<gateway_detail::Waiter> removed;
  {
    const std::lock_guard lock(p->mu);
    const auto it =
        std::find_if(p->queue.begin(), p->queue.end(), [&](const auto& w) { return w.id == id_; });
    if (it == p->queue.end()) return false;
    removed.emplace(std::move(*it));
    p->queue.erase(it);
    p->waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
  gateway_detail::release_tenant(removed->target);
  return true;
}

}  // namespace sluice
