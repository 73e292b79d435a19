// The cascade simulation's event loop (sluice/sim/cascade_sim.h): arrivals, strategies, node
// behaviour and the measures.
#include "sluice/sim/cascade_sim.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <queue>
#include <random>
#include <utility>

#include "sluice/core/algorithm_spec.h"
#include "sluice/local/adaptive_guard.h"

namespace sluice::sim {
namespace {

// A uniform draw in [0, 1) from the top 53 bits: the same sequence on every standard library
// (std::uniform_real_distribution's algorithm is the library's own).
double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// An exponential draw of mean `mean` from a uniform `u` in [0, 1).
double exponential(double u, double mean) { return -std::log1p(-u) * mean; }

// The second stream (the strategies' choices): a different seed from the same config seed.
constexpr std::uint64_t kChoiceSeedSalt = 0x9e3779b97f4a7c15ULL;

// How one call goes at the node it was sent to.
struct Reply {
  CascadeOutcome outcome = CascadeOutcome::kSuccess;
  Nanos latency{0};
};

// The spell covering `node` at `t`, if any (the first listed wins).
const FaultSpell* spell_at(const CascadeScenario& s, int node, Nanos t) {
  for (const FaultSpell& f : s.spells)
    if (f.node == node && t >= f.start && t < f.end) return &f;
  return nullptr;
}

Reply node_reply(const CascadeSimConfig& c, const FaultSpell* spell, double u_outcome,
                 double u_latency) {
  const double base = static_cast<double>(c.base_latency.count());
  double latency = base + exponential(u_latency, base);
  if (spell) {
    switch (spell->fault) {
      case NodeFault::kDown:
        return {CascadeOutcome::kFailed, c.error_latency};
      case NodeFault::kBlackHole:
        return {CascadeOutcome::kTimeout, c.timeout};
      case NodeFault::kSlow:
        latency *= c.slow_factor;
        break;
      case NodeFault::kShedding:
        if (u_outcome < spell->fraction) return {CascadeOutcome::kOverload, c.error_latency};
        break;
      case NodeFault::kFailing:
        if (u_outcome < spell->fraction) return {CascadeOutcome::kFailed, c.error_latency};
        break;
    }
  }
  if (latency >= static_cast<double>(c.timeout.count()))
    return {CascadeOutcome::kTimeout, c.timeout};
  return {CascadeOutcome::kSuccess, Nanos{static_cast<std::int64_t>(latency)}};
}

Outcome guard_outcome(CascadeOutcome o) {
  switch (o) {
    case CascadeOutcome::kSuccess:
      return Outcome::kSuccess;
    case CascadeOutcome::kTimeout:
    case CascadeOutcome::kOverload:
      return Outcome::kDropped;
    case CascadeOutcome::kFailed:
    case CascadeOutcome::kIgnored:
      break;
  }
  return Outcome::kIgnored;
}

// The node the spells concern, when they all concern one.
std::optional<int> watched_node(const CascadeScenario& s) {
  if (s.spells.empty()) return std::nullopt;
  for (const FaultSpell& f : s.spells)
    if (f.node != s.spells.front().node) return std::nullopt;
  return s.spells.front().node;
}

// One strategy through one scenario: arrivals in order, each completion an event in a queue
// ordered by time (then by when it was scheduled), the clock set to each event's time before
// the production code sees it.
class Simulation {
 public:
  Simulation(const CascadeSimConfig& c, const CascadeScenario& s, const CascadeStrategy& strategy)
      : c_(c),
        scenario_(s),
        strategy_(strategy),
        arrivals_rng_(c.seed),
        choice_rng_(c.seed ^ kChoiceSeedSalt) {
    AlgorithmSpec spec;
    spec.kind = AlgorithmSpec::Kind::kFixed;
    spec.limit = c.limit;
    std::vector<CascadeNodeSpec> specs;
    for (int i = 0; i < c.nodes; ++i) {
      guards_.push_back(std::make_shared<AdaptiveGuard>(make_algorithm(spec), clock_));
      specs.push_back({"node-" + std::to_string(i), guards_.back()});
      names_.push_back(specs.back().name);
    }
    if (strategy.kind == StrategyKind::kCascade)
      cascade_ = std::make_unique<FallbackCascade>(std::move(specs), clock_, strategy.cascade,
                                                   [this] { return uniform(choice_rng_); });
    const auto windows = static_cast<std::size_t>((c.duration + c.window - Nanos{1}) / c.window);
    r_.windows.assign(windows, CascadeWindow{0, 0, std::vector<std::uint32_t>(nodes(), 0)});
    r_.node_taken.assign(nodes(), 0);
    r_.node_succeeded.assign(nodes(), 0);
  }

  CascadeSimResult run() {
    Nanos t{0};
    for (;;) {
      t += Nanos{static_cast<std::int64_t>(exponential(uniform(arrivals_rng_), 1e9 / c_.rate))};
      const double u_outcome = uniform(arrivals_rng_), u_latency = uniform(arrivals_rng_);
      if (t >= c_.duration) break;
      complete_until(t);
      clock_.set(t);
      arrive(t, u_outcome, u_latency);
    }
    complete_until(Nanos::max());
    summarize();
    return std::move(r_);
  }

 private:
  // A call a node took, until it ends.
  struct Call {
    std::size_t node = 0;
    std::size_t window = 0;
    CascadeOutcome outcome = CascadeOutcome::kSuccess;
    Nanos latency{0};
    std::optional<CascadeLease> lease;  // cascade
    std::optional<GuardPermit> permit;  // the other strategies
  };
  struct Completion {
    Nanos at;
    std::uint64_t seq;
    std::size_t slot;
    bool operator>(const Completion& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  std::size_t nodes() const { return static_cast<std::size_t>(c_.nodes); }

  void arrive(Nanos t, double u_outcome, double u_latency) {
    const std::size_t window = static_cast<std::size_t>(t / c_.window);
    ++r_.arrivals;
    ++r_.windows[window].arrivals;
    Call call;
    call.window = window;
    if (!take(call)) {
      ++r_.refused;
      return;
    }
    const int node = static_cast<int>(call.node);
    const FaultSpell* spell = spell_at(scenario_, node, t);
    if (spell) ++r_.calls_to_bad;
    ++r_.windows[window].taken[call.node];
    ++r_.node_taken[call.node];
    r_.max_in_flight = std::max(r_.max_in_flight, guards_[call.node]->in_flight());
    const Reply reply = node_reply(c_, spell, u_outcome, u_latency);
    call.outcome = reply.outcome;
    call.latency = reply.latency;
    latencies_.push_back(reply.latency.count());
    queue_.push({t + reply.latency, seq_++, store(std::move(call))});
  }

  // Keeps `call` until it completes, in a slot a completed call left if there is one.
  std::size_t store(Call&& call) {
    if (free_.empty()) {
      calls_.push_back(std::move(call));
      return calls_.size() - 1;
    }
    const std::size_t slot = free_.back();
    free_.pop_back();
    calls_[slot] = std::move(call);
    return slot;
  }

  // Picks the call's node and takes a permit there; false when refused.
  bool take(Call& call) {
    if (cascade_) {
      CascadeResult<CascadeLease> lease = cascade_->acquire();
      if (!lease.ok()) return false;
      call.node = index_of(lease.value().node());
      call.lease.emplace(std::move(lease.value()));
      return true;
    }
    call.node = pick();
    call.permit = guards_[call.node]->acquire();
    return call.permit.has_value();
  }

  std::size_t pick() {
    const std::size_t n = nodes();
    switch (strategy_.kind) {
      case StrategyKind::kRoundRobin:
        return next_++ % n;
      case StrategyKind::kRandom:
        return draw_index(n);
      case StrategyKind::kPowerOfTwo:
      case StrategyKind::kCascade:
        break;
    }
    const std::size_t a = draw_index(n);
    std::size_t b = draw_index(n - 1);
    if (b >= a) ++b;
    return guards_[b]->in_flight() < guards_[a]->in_flight() ? b : a;
  }

  std::size_t draw_index(std::size_t n) {
    return std::min(n - 1, static_cast<std::size_t>(uniform(choice_rng_) * static_cast<double>(n)));
  }

  std::size_t index_of(const std::string& name) const {
    return static_cast<std::size_t>(std::find(names_.begin(), names_.end(), name) - names_.begin());
  }

  void complete_until(Nanos t) {
    while (!queue_.empty() && queue_.top().at <= t) {
      const Completion done = queue_.top();
      queue_.pop();
      clock_.set(done.at);
      finish(calls_[done.slot]);
      free_.push_back(done.slot);
    }
  }

  void finish(Call& call) {
    if (call.lease) call.lease->finish(call.outcome, call.latency);
    if (call.permit) call.permit->release(guard_outcome(call.outcome), call.latency);
    call.lease.reset();
    call.permit.reset();
    switch (call.outcome) {
      case CascadeOutcome::kSuccess:
        ++r_.succeeded;
        ++r_.windows[call.window].succeeded;
        ++r_.node_succeeded[call.node];
        break;
      case CascadeOutcome::kTimeout:
        ++r_.timeouts;
        break;
      case CascadeOutcome::kOverload:
        ++r_.overloads;
        break;
      case CascadeOutcome::kFailed:
      case CascadeOutcome::kIgnored:  // never made by a node model
        ++r_.failed;
        break;
    }
  }

  void summarize();
  [[nodiscard]] double share(std::size_t window, std::size_t node) const {
    const CascadeWindow& w = r_.windows[window];
    return w.arrivals ? static_cast<double>(w.taken[node]) / w.arrivals : 0.0;
  }

  const CascadeSimConfig& c_;
  const CascadeScenario& scenario_;
  const CascadeStrategy& strategy_;
  ManualClock clock_;
  std::mt19937_64 arrivals_rng_;
  std::mt19937_64 choice_rng_;
  std::vector<std::shared_ptr<AdaptiveGuard>> guards_;
  std::vector<std::string> names_;
  std::unique_ptr<FallbackCascade> cascade_;
  std::vector<Call> calls_;
  std::vector<std::size_t> free_;
  std::priority_queue<Completion, std::vector<Completion>, std::greater<>> queue_;
  std::uint64_t seq_ = 0;
  std::size_t next_ = 0;
  std::vector<std::int64_t> latencies_;
  CascadeSimResult r_;
};

void Simulation::summarize() {
  r_.success_rate =
      r_.arrivals ? static_cast<double>(r_.succeeded) / static_cast<double>(r_.arrivals) : 0.0;
  if (!latencies_.empty()) {
    const auto k = static_cast<std::size_t>(0.99 * static_cast<double>(latencies_.size() - 1));
    std::nth_element(latencies_.begin(), latencies_.begin() + static_cast<std::ptrdiff_t>(k),
                     latencies_.end());
    r_.p99 = Nanos{latencies_[k]};
  }
  r_.watched = watched_node(scenario_);
  if (!r_.watched) return;
  const auto node = static_cast<std::size_t>(*r_.watched);
  Nanos first_bad = Nanos::max(), healed{0};
  for (const FaultSpell& f : scenario_.spells) {
    first_bad = std::min(first_bad, f.start);
    healed = std::max(healed, f.end);
  }
  const double fair = 1.0 / static_cast<double>(nodes());
  const Nanos run_end = c_.window * static_cast<std::int64_t>(r_.windows.size());
  for (std::size_t k = 0; k < r_.windows.size(); ++k) {
    const Nanos start = c_.window * static_cast<std::int64_t>(k), end = start + c_.window;
    if (start >= first_bad && start < healed && share(k, node) < 0.1 * fair) {
      r_.detect = end - first_bad;
      break;
    }
  }
  if (!r_.detect || healed >= run_end) return;
  r_.observed_after_heal = run_end - healed;
  for (std::size_t k = 0; k < r_.windows.size(); ++k) {
    const Nanos start = c_.window * static_cast<std::int64_t>(k), end = start + c_.window;
    if (start >= healed && share(k, node) >= 0.5 * fair) {
      r_.recover = end - healed;
      break;
    }
  }
}

}  // namespace

std::string_view to_string(NodeFault f) noexcept {
  switch (f) {
    case NodeFault::kDown:
      return "down";
    case NodeFault::kBlackHole:
      return "black-holed";
    case NodeFault::kSlow:
      return "slow";
    case NodeFault::kShedding:
      return "shedding";
    case NodeFault::kFailing:
      return "failing";
  }
  return "?";
}

std::string CascadeSimConfig::validate() const {
  if (nodes < 2 || nodes > 64) return "nodes: must be 2..64";
  if (limit < 1) return "limit: must be at least 1";
  if (!(rate > 0) || !std::isfinite(rate)) return "rate: must be more than 0";
  if (duration <= Nanos{0}) return "duration: must be more than 0";
  if (base_latency <= Nanos{0}) return "base_latency: must be more than 0";
  if (!(slow_factor >= 1) || !std::isfinite(slow_factor)) return "slow_factor: must be >= 1";
  if (error_latency <= Nanos{0}) return "error_latency: must be more than 0";
  if (timeout <= error_latency) return "timeout: must be more than error_latency";
  if (window <= Nanos{0} || window > duration) return "window: must be in (0, duration]";
  return {};
}

CascadeSimResult run_cascade_sim(const CascadeSimConfig& config, const CascadeScenario& scenario,
                                 const CascadeStrategy& strategy) {
  return Simulation(config, scenario, strategy).run();
}

}  // namespace sluice::sim
