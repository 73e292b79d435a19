// fallback_cascade.h: pick by health, take the first permit that is free, record the outcome.
#include "sluice/local/fallback_cascade.h"

#include <algorithm>
#include <random>
#include <utility>

namespace sluice {
namespace {

// The default random source: a generator per thread, seeded once.
double thread_draw() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0, 1)(rng);
}

}  // namespace

std::string_view fallback_cascade_error(const FallbackCascadeOptions& o) noexcept {
  if (std::string_view e = cascade_stats_error(o.stats); !e.empty()) return e;
  if (std::string_view e = cascade_health_error(o.health); !e.empty()) return e;
  if (o.breaker)
    if (std::string_view e = circuit_breaker_error(*o.breaker); !e.empty()) return e;
  if (o.retry.max_attempts < 1) return "max_attempts: must be at least 1";
  if (o.revive_every < Nanos{0}) return "revive_every: must not be negative";
  if (!(o.revive_share >= 0 && o.revive_share <= 1)) return "revive_share: must be 0..1";
  if (!(o.panic_below >= 0 && o.panic_below <= 1)) return "panic_below: must be 0..1";
  return retry_budget_error(o.retry.budget);
}

std::string_view to_string(CascadeOutcome o) noexcept {
  switch (o) {
    case CascadeOutcome::kSuccess:
      return "success";
    case CascadeOutcome::kTimeout:
      return "timeout";
    case CascadeOutcome::kOverload:
      return "overload";
    case CascadeOutcome::kFailed:
      return "failed";
    case CascadeOutcome::kIgnored:
      return "ignored";
  }
  return "?";
}

CascadeOutcome outcome_of_http(int status) noexcept {
  if (status == 429 || status == 503) return CascadeOutcome::kOverload;
  if (status == 408 || status == 504) return CascadeOutcome::kTimeout;
  if (status >= 500) return CascadeOutcome::kFailed;
  return CascadeOutcome::kSuccess;
}

CascadeOutcome outcome_of_grpc(int code) noexcept {
  switch (code) {
    case 8:   // RESOURCE_EXHAUSTED
    case 14:  // UNAVAILABLE
      return CascadeOutcome::kOverload;
    case 4:  // DEADLINE_EXCEEDED
      return CascadeOutcome::kTimeout;
    case 1:  // CANCELLED
      return CascadeOutcome::kIgnored;
    case 2:   // UNKNOWN
    case 12:  // UNIMPLEMENTED
    case 13:  // INTERNAL
    case 15:  // DATA_LOSS
      return CascadeOutcome::kFailed;
    default:  // OK, or the caller's own error: the node answered
      return CascadeOutcome::kSuccess;
  }
}

// The cache is a sequence lock without fences (ThreadSanitizer knows none): the data is stored
// with release and loaded with acquire, so a reader that sees any of a writer's data also sees
// the odd sequence number the writer set before it, and the second load of the sequence cannot
// move before the data's.
CascadeHealth CascadeNode::health(Nanos now, std::size_t nodes,
                                  const CascadeHealthOptions& o) const noexcept {
  const CascadeNodeStats::Version v = stats_.version(now);
  const std::uint32_t seq = cache_.seq.load(std::memory_order_acquire);
  if (seq % 2 == 0) {
    const CascadeNodeStats::Version cached{cache_.epoch.load(std::memory_order_acquire),
                                           cache_.current.load(std::memory_order_acquire),
                                           cache_.previous.load(std::memory_order_acquire)};
    const std::uint64_t cached_nodes = cache_.nodes.load(std::memory_order_acquire);
    CascadeHealth h;
    h.success_rate = cache_.rate.load(std::memory_order_acquire);
    h.weight = cache_.weight.load(std::memory_order_acquire);
    h.basis = static_cast<CascadeHealth::Basis>(cache_.basis.load(std::memory_order_acquire));
    if (cache_.seq.load(std::memory_order_relaxed) == seq && cached == v && cached_nodes == nodes)
      return h;
  }
  const CascadeNodeStats::Snapshot s = stats_.snapshot(now);
  const CascadeHealth h = cascade_health(s.window(), s.sticky, nodes, o);
  // Kept only if the buckets did not change while it was computed, and no other thread writes.
  std::uint32_t expected = cache_.seq.load(std::memory_order_relaxed);
  if (expected % 2 == 0 && stats_.version(now) == v &&
      cache_.seq.compare_exchange_strong(expected, expected + 1, std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
    cache_.epoch.store(v.epoch, std::memory_order_release);
    cache_.current.store(v.current, std::memory_order_release);
    cache_.previous.store(v.previous, std::memory_order_release);
    cache_.nodes.store(nodes, std::memory_order_release);
    cache_.rate.store(h.success_rate, std::memory_order_release);
    cache_.weight.store(h.weight, std::memory_order_release);
    cache_.basis.store(static_cast<std::uint8_t>(h.basis), std::memory_order_release);
    cache_.seq.store(expected + 2, std::memory_order_release);
  }
  return h;
}

CascadeLease& CascadeLease::operator=(CascadeLease&& other) noexcept {
  if (this != &other) {
    finish(CascadeOutcome::kFailed);
    node_ = std::move(other.node_);
    permit_ = std::move(other.permit_);
    clock_ = other.clock_;
    start_ = other.start_;
    ticket_ = other.ticket_;
  }
  return *this;
}

void CascadeLease::finish(CascadeOutcome outcome) noexcept {
  if (!permit_.held()) return;
  finish(outcome, clock_->now() - start_);
}

void CascadeLease::finish(CascadeOutcome outcome, Nanos rtt) noexcept {
  if (!permit_.held()) return;
  switch (outcome) {
    case CascadeOutcome::kSuccess:
      permit_.release(Outcome::kSuccess, rtt);
      break;
    case CascadeOutcome::kTimeout:
    case CascadeOutcome::kOverload:
      permit_.release(Outcome::kDropped, rtt);
      break;
    case CascadeOutcome::kFailed:
    case CascadeOutcome::kIgnored:
      permit_.release(Outcome::kIgnored, rtt);
      break;
  }
  const Nanos now = clock_->now();
  const bool success = outcome == CascadeOutcome::kSuccess;
  if (outcome != CascadeOutcome::kIgnored) node_->stats().record(success, now);
  if (CircuitBreaker* b = node_->breaker())
    b->finish(ticket_,
              outcome == CascadeOutcome::kIgnored
                  ? CircuitBreaker::Result::kNeutral
                  : (success ? CircuitBreaker::Result::kSuccess : CircuitBreaker::Result::kFailure),
              now);
}

namespace {

// The revival cap (see the header): revive_share of the calls of the last second, plus one a
// second.
RetryBudgetOptions revival_budget(const FallbackCascadeOptions& o) {
  RetryBudgetOptions b;
  b.ratio = o.revive_share;
  b.per_second = 1;
  b.window = std::chrono::seconds(1);
  return b;
}

}  // namespace

FallbackCascade::FallbackCascade(std::vector<CascadeNodeSpec> nodes, const Clock& clock,
                                 FallbackCascadeOptions o, UniformDraw draw,
                                 const FallbackCascade* previous)
    : clock_(clock),
      options_(o),
      draw_(draw ? std::move(draw) : UniformDraw(thread_draw)),
      budget_(o.retry.budget),
      revivals_(revival_budget(o)) {
  set_nodes(std::move(nodes), previous);
}

void FallbackCascade::set_nodes(std::vector<CascadeNodeSpec> specs) {
  set_nodes(std::move(specs), nullptr);
}

std::shared_ptr<CascadeNode> FallbackCascade::node_of(const FallbackCascade& c,
                                                      std::string_view name) {
  if (const std::shared_ptr<const Nodes> nodes = c.nodes())
    for (const auto& n : *nodes)
      if (n->name() == name) return n;
  const std::lock_guard lock(c.parked_mu_);
  for (const Parked& p : c.parked_)
    if (p.node->name() == name) return p.node;
  return nullptr;
}

std::shared_ptr<AdaptiveGuard> FallbackCascade::guard_of(std::string_view name) const {
  const std::shared_ptr<CascadeNode> n = node_of(*this, name);
  return n != nullptr ? n->shared_guard() : nullptr;
}

void FallbackCascade::set_nodes(std::vector<CascadeNodeSpec> specs,
                                const FallbackCascade* previous) {
  const Nanos now = clock_.now();
  const std::lock_guard lock(parked_mu_);  // one change at a time; node_of(*this) not used here
  const std::shared_ptr<const Nodes> old = nodes();
  // A predecessor's node is taken whole only if its buckets and breaker are of the same make.
  const bool same_make = previous != nullptr && previous->options_.stats == options_.stats &&
                         previous->options_.breaker == options_.breaker;
  auto next = std::make_shared<Nodes>();
  for (CascadeNodeSpec& s : specs) {
    std::shared_ptr<CascadeNode> kept;
    if (old)
      for (const auto& n : *old)
        if (n->name() == s.name) kept = n;
    if (!kept) {
      const auto p = std::find_if(parked_.begin(), parked_.end(),
                                  [&](const Parked& x) { return x.node->name() == s.name; });
      if (p != parked_.end()) {
        kept = std::move(p->node);  // added back: the same node
        parked_.erase(p);
      }
    }
    if (!kept && previous != nullptr) {
      if (std::shared_ptr<CascadeNode> was = node_of(*previous, s.name)) {
        kept = same_make ? std::move(was)
                         : std::make_shared<CascadeNode>(std::move(s.name), was->shared_guard(),
                                                         options_.stats, options_.breaker);
      }
    }
    next->push_back(kept ? std::move(kept)
                         : std::make_shared<CascadeNode>(std::move(s.name), std::move(s.guard),
                                                         options_.stats, options_.breaker));
  }
  if (old)
    for (const auto& n : *old)
      if (std::none_of(next->begin(), next->end(), [&](const auto& x) { return x == n; }))
        parked_.push_back({n, now});
  {
    std::shared_ptr<const Nodes> installed(std::move(next));
    const std::lock_guard nodes_lock(nodes_mu_);
    nodes_.swap(installed);
  }
  prune_parked(now);
}

void FallbackCascade::prune_parked(Nanos now) const {
  const Nanos keep = options_.stats.width * static_cast<std::int64_t>(options_.stats.buckets);
  std::erase_if(parked_, [&](Parked& p) {
    if (p.node->guard().in_flight() > 0) {
      p.since = now;  // its stat window starts again once its last call has ended
      return false;
    }
    return now - p.since >= keep;
  });
}

std::size_t FallbackCascade::size() const noexcept { return nodes()->size(); }

FallbackCascade::Load FallbackCascade::load() const noexcept {
  Load out;
  const std::shared_ptr<const Nodes> current = nodes();  // held: a reload may swap the set
  for (const auto& n : *current) {
    out.in_flight += n->guard().in_flight();
    out.limit += n->guard().limit();
  }
  const std::lock_guard lock(parked_mu_);
  for (const Parked& p : parked_) out.in_flight += p.node->guard().in_flight();
  return out;
}

std::string CascadeRefusal::message() const {
  std::string why = tried == 0 && open == 0
                        ? "cascade: every node is excluded ("
                        : (open > 0 ? "cascade: every node is at its concurrency limit or open ("
                                    : "cascade: every node is at its concurrency limit (");
  why += std::to_string(tried);
  why += " tried";
  if (open > 0) {
    why += ", ";
    why += std::to_string(open);
    why += " with an open circuit breaker";
  }
  if (excluded > 0) {
    why += ", ";
    why += std::to_string(excluded);
    why += " excluded";
  }
  why += ")";
  return why;
}

CascadeResult<CascadeLease> FallbackCascade::acquire(std::span<const std::string> exclude) {
  const std::shared_ptr<const Nodes> nodes = this->nodes();
  const Nanos now = clock_.now();
  thread_local std::vector<double> weights, rates;
  thread_local std::vector<std::size_t> order;
  thread_local std::vector<std::uint8_t> taken;
  weights.clear();
  rates.clear();
  std::size_t closed = 0;
  for (const auto& n : *nodes) {
    const CascadeHealth h = n->health(now, nodes->size(), options_.health);
    weights.push_back(h.weight);
    if (options_.approximate_order) rates.push_back(h.success_rate);
    if (const CircuitBreaker* b = n->breaker(); b != nullptr && b->closed()) ++closed;
  }
  // Panic (see the header): a breaker that refuses no longer stops a call.
  const bool panic =
      options_.breaker.has_value() &&
      static_cast<double>(closed) < options_.panic_below * static_cast<double>(nodes->size());
  std::size_t tried = 0, open = 0, skipped = 0;
  // Tries node i: a lease, or nothing (excluded, open or full).
  const auto attempt = [&](std::size_t i) -> std::optional<CascadeLease> {
    const std::shared_ptr<CascadeNode>& n = (*nodes)[i];
    if (std::find(exclude.begin(), exclude.end(), n->name()) != exclude.end()) {
      ++skipped;
      return std::nullopt;
    }
    CircuitBreaker::Ticket ticket{CircuitBreaker::Ticket::Kind::kNormal, 0};
    if (CircuitBreaker* b = n->breaker()) {
      ticket = b->enter(now);
      // Refused: skipped; in a panic, made anyway with the refused ticket, which the breaker
      // counts for nothing.
      if (!ticket.admitted() && !panic) {
        ++open;
        return std::nullopt;
      }
    }
    ++tried;
    if (std::optional<GuardPermit> p = n->guard().acquire())
      return CascadeLease(n, std::move(*p), clock_, ticket, now);
    if (CircuitBreaker* b = n->breaker()) b->cancel(ticket);
    return std::nullopt;
  };
  // A revival call first, to one node at the floor whose turn it is, within the cap (see the
  // header).
  std::size_t revived = nodes->size();
  if (options_.revive_every > Nanos{0}) {
    revivals_.record_call(now);
    const double floor = options_.health.floor_numerator /
                         static_cast<double>(std::max<std::size_t>(nodes->size(), 1));
    for (std::size_t i = 0; i < nodes->size(); ++i) {
      if (weights[i] > floor ||
          std::find(exclude.begin(), exclude.end(), (*nodes)[i]->name()) != exclude.end())
        continue;
      const std::optional<std::int64_t> before =
          (*nodes)[i]->claim_revival(now, options_.revive_every);
      if (!before) continue;
      if (!revivals_.try_retry(now)) {  // over the cap: its turn waits
        (*nodes)[i]->unclaim_revival(now, *before);
        break;
      }
      if (std::optional<CascadeLease> l = attempt(i)) return std::move(*l);
      (*nodes)[i]->unclaim_revival(now, *before);  // open or full: not made, not spent
      revived = i;
      break;
    }
  }
  if (options_.approximate_order) {
    approximate_order(rates, weights, draw_, order);
    for (const std::size_t i : order)
      if (i != revived)
        if (std::optional<CascadeLease> l = attempt(i)) return std::move(*l);
  } else {
    WeightedDraws draws(weights, taken);
    while (const std::optional<std::size_t> i = draws.next(draw_))
      if (*i != revived)
        if (std::optional<CascadeLease> l = attempt(*i)) return std::move(*l);
  }
  return CascadeRefusal{.tried = tried, .open = open, .excluded = skipped};
}

std::vector<CascadeNodeState> FallbackCascade::state() const {
  const std::shared_ptr<const Nodes> nodes = this->nodes();
  const Nanos now = clock_.now();
  std::vector<CascadeNodeState> out;
  for (const auto& n : *nodes) {
    CascadeNodeState s;
    s.name = n->name();
    s.buckets = n->stats().snapshot(now);
    s.health = cascade_health(s.buckets.window(), s.buckets.sticky, nodes->size(), options_.health);
    s.in_flight = n->guard().in_flight();
    s.limit = n->guard().limit();
    if (const CircuitBreaker* b = n->breaker()) s.breaker = b->snapshot(now);
    out.push_back(std::move(s));
  }
  const std::lock_guard lock(parked_mu_);
  prune_parked(now);
  for (const Parked& p : parked_) {
    const CascadeNode& n = *p.node;
    CascadeNodeState s;
    s.name = n.name();
    s.buckets = n.stats().snapshot(now);
    s.health = cascade_health(s.buckets.window(), s.buckets.sticky, nodes->size(), options_.health);
    s.in_flight = n.guard().in_flight();
    s.limit = n.guard().limit();
    if (const CircuitBreaker* b = n.breaker()) s.breaker = b->snapshot(now);
    s.removed = true;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace sluice
