// fallback_cascade.h: pick by health, take the first permit that is free, record the outcome.
#include "sluice/fallback_cascade.h"

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
  return cascade_health_error(o.health);
}

CascadeLease& CascadeLease::operator=(CascadeLease&& other) noexcept {
  if (this != &other) {
    finish(CascadeOutcome::kFailed);
    node_ = std::move(other.node_);
    permit_ = std::move(other.permit_);
    clock_ = other.clock_;
    start_ = other.start_;
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
      permit_.release(Outcome::kIgnored, rtt);
      break;
  }
  node_->stats().record(outcome == CascadeOutcome::kSuccess, clock_->now());
}

FallbackCascade::FallbackCascade(std::vector<CascadeNodeSpec> nodes, const Clock& clock,
                                 FallbackCascadeOptions o, UniformDraw draw)
    : clock_(clock), options_(o), draw_(draw ? std::move(draw) : UniformDraw(thread_draw)) {
  set_nodes(std::move(nodes));
}

void FallbackCascade::set_nodes(std::vector<CascadeNodeSpec> specs) {
  const std::shared_ptr<const Nodes> old = nodes_.load();
  auto next = std::make_shared<Nodes>();
  for (CascadeNodeSpec& s : specs) {
    std::shared_ptr<CascadeNode> kept;
    if (old)
      for (const auto& n : *old)
        if (n->name() == s.name) kept = n;
    next->push_back(kept ? std::move(kept)
                         : std::make_shared<CascadeNode>(std::move(s.name), std::move(s.guard),
                                                         options_.stats));
  }
  nodes_.store(std::move(next));
}

std::size_t FallbackCascade::size() const noexcept { return nodes_.load()->size(); }

StatusOr<CascadeLease> FallbackCascade::acquire(std::span<const std::string> exclude) {
  const std::shared_ptr<const Nodes> nodes = nodes_.load();
  const Nanos now = clock_.now();
  thread_local std::vector<double> weights, rates;
  thread_local std::vector<std::size_t> order;
  weights.clear();
  rates.clear();
  for (const auto& n : *nodes) {
    const CascadeNodeStats::Snapshot s = n->stats().snapshot(now);
    const CascadeHealth h = cascade_health(s.window(), s.sticky, nodes->size(), options_.health);
    weights.push_back(h.weight);
    rates.push_back(h.success_rate);
  }
  if (options_.approximate_order)
    approximate_order(rates, weights, draw_, order);
  else
    weighted_order(weights, draw_, order);
  std::size_t tried = 0, skipped = 0;
  for (const std::size_t i : order) {
    const std::shared_ptr<CascadeNode>& n = (*nodes)[i];
    if (std::find(exclude.begin(), exclude.end(), n->name()) != exclude.end()) {
      ++skipped;
      continue;
    }
    ++tried;
    if (std::optional<GuardPermit> p = n->guard().acquire())
      return CascadeLease(n, std::move(*p), clock_);
  }
  return Status(StatusCode::kResourceExhausted,
                "cascade: every node is at its concurrency limit (" + std::to_string(tried) +
                    " tried" + (skipped ? ", " + std::to_string(skipped) + " excluded" : "") + ")");
}

std::vector<CascadeNodeState> FallbackCascade::state() const {
  const std::shared_ptr<const Nodes> nodes = nodes_.load();
  const Nanos now = clock_.now();
  std::vector<CascadeNodeState> out;
  for (const auto& n : *nodes) {
    CascadeNodeState s;
    s.name = n->name();
    s.buckets = n->stats().snapshot(now);
    s.health = cascade_health(s.buckets.window(), s.buckets.sticky, nodes->size(), options_.health);
    s.in_flight = n->guard().in_flight();
    s.limit = n->guard().limit();
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace sluice
