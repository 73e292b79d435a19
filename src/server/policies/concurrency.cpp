// The concurrency kind: gateway limits (tenant, upstream, binding, per-tenant, route), each call
// naming its tenant, upstream and route.
#include "server/policies/concurrency.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/policies/admit_policy.h"
#include "sluice/local/gateway.h"
#include "sluice/local/gateway_metrics.h"
#include "sluice/local/gateway_validation.h"

namespace sluice::server {
namespace {

class GatewayPolicy;

// One gateway of the policy: the first, or one built by a reconfigure to take its
// predecessor's place (Gateway::create(config, previous): the two share the counters of every
// level of the same identity). It lives while it is current or something holds it: a lease's
// permit, an admit or a state read in progress, a refusal's views (`holds` counts them).
struct Generation {
  Generation(std::unique_ptr<Gateway> g, const GatewayPolicy* owner) noexcept
      : gateway(std::move(g)), policy(owner) {}
  std::unique_ptr<Gateway> gateway;
  const GatewayPolicy* policy;  // outlives it (every holder keeps the policy alive)
  // seq_cst, with the policy's `unfreed_`: of a last hold given back and a retirement, one
  // sees the other, so one of them frees the generation.
  std::atomic<std::uint64_t> holds{0};
};

// What the policy counts of one upstream's queue (the gateway keeps the queue itself): calls
// waiting now, how each wait ended, and how long it lasted.
class QueueStats {
 public:
  enum Outcome : std::size_t {
    kHandoff,    // a permit was handed over (admitted after waiting)
    kTimeout,    // waited the queue's timeout
    kDeadline,   // waited the call's own max_wait (its deadline), less than the queue's timeout
    kFull,       // refused at once: the queue was at max_depth
    kCancelled,  // the caller went away while waiting
    kClosed,     // the policy was removed by a reload, or the server stopped, while waiting
    kOutcomes
  };
  static constexpr std::array<const char*, kOutcomes> kNames = {"handoff", "timeout",   "deadline",
                                                                "full",    "cancelled", "closed"};
  // Wait buckets, seconds.
  static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1,    2.5,   5};

  void queued() noexcept { depth_.fetch_add(1, std::memory_order_relaxed); }
  // A wait ended (`was_queued`: it had waited in the queue; kFull never has).
  void ended(Outcome o, bool was_queued, Nanos waited) noexcept {
    outcomes_[o].fetch_add(1, std::memory_order_relaxed);
    if (!was_queued) return;
    depth_.fetch_sub(1, std::memory_order_relaxed);
    const double s = std::chrono::duration<double>(waited).count();
    std::size_t i = 0;
    while (i < kBounds.size() && s > kBounds[i]) ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(0, waited.count())),
                      std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t depth() const noexcept {
    return depth_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t count(Outcome o) const noexcept {
    return outcomes_[o].load(std::memory_order_relaxed);
  }
  // The wait histogram, labelled `labels`.
  [[nodiscard]] prometheus::ClientMetric histogram(
      std::vector<prometheus::ClientMetric::Label> labels) const {
    prometheus::ClientMetric m;
    m.label = std::move(labels);
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < kBounds.size(); ++i) {
      cumulative += buckets_[i].load(std::memory_order_relaxed);
      m.histogram.bucket.push_back(prometheus::ClientMetric::Bucket{cumulative, kBounds[i]});
    }
    cumulative += buckets_[kBounds.size()].load(std::memory_order_relaxed);
    m.histogram.bucket.push_back(
        prometheus::ClientMetric::Bucket{cumulative, std::numeric_limits<double>::infinity()});
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
    return m;
  }

 private:
  std::atomic<std::uint64_t> depth_{0};
  std::array<std::atomic<std::uint64_t>, kOutcomes> outcomes_{};
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

// Why a wait is ended by the policy rather than by the gateway.
enum class EndWhy : std::uint8_t { kDeadline, kCancelled, kRemoved, kStopping };

// One call waiting in an upstream's queue: the gateway holds its place (the ticket); the policy
// holds how to answer it. Exactly one answer: the gateway's callback (a permit handed over, a
// full queue, the queue's timeout), or the policy's own after cancelling the ticket (the call's
// deadline, the caller gone, the policy closed) when cancel() says it was still waiting.
struct Waiter {
  std::uint64_t id = 0;  // in the policy's registry
  std::mutex mu;
  bool answered = false;                // guarded by mu
  bool queued = false;                  // guarded by mu: counted in its queue's depth
  std::optional<AcquireTicket> ticket;  // guarded by mu: set once acquire_async has returned
  std::optional<EndWhy> end_asked;      // guarded by mu: an end asked before the ticket was set
  Completion<AdmitDecision> done;       // taken by whoever answers
  Generation* generation = nullptr;     // held until answered (then by the lease or the refusal)
  std::shared_ptr<QueueStats> stats;
  Rejection template_refusal;  // the upstream's refusal when it arrived (views into generation)
  Nanos since{0};              // when it arrived
  Nanos deadline{0};           // since + the call's max_wait (Nanos::max(): none)
  Nanos queue_timeout{0};      // the upstream's queue timeout (for messages)
};

// A gateway permit gives every level back (into the generation that admitted it, whose
// counters the current one shares); the outcome says nothing to a fixed limit.
struct GatewayLease {
  GatewayPermit permit;
  Generation* generation;  // held until finished
  void finish(const CallEnd& /*end*/) noexcept;
};

class GatewayPolicy final : public AdmitPolicy {
 public:
  GatewayPolicy(const BuildContext& c, std::unique_ptr<Gateway> gateway)
      : AdmitPolicy(c.name, "concurrency", c.spec.rate),
        clock_(c.clock),
        current_(std::make_unique<Generation>(std::move(gateway), this)) {}
  // Nothing holds a generation when it is destroyed: leases, refusals and waiters keep the
  // policy alive.
  ~GatewayPolicy() override { retire(); }

  // The gateway a new policy of `c` serves with: built afresh, or on the levels of the
  // predecessor's gateway (BuildContext::predecessor), as a reload in place would build it, so
  // the calls it admitted stay counted against the same limits.
  static GatewayBuild gateway_for(const BuildContext& c, const GatewayConfig& config) {
    auto* was = dynamic_cast<const GatewayPolicy*>(c.predecessor.get());
    if (was == nullptr) return Gateway::create(config);
    Generation* g = was->hold();
    GatewayBuild b = Gateway::create(config, *g->gateway);
    was->let_go(g);
    // The predecessor serves no more (a reload retired it): this gateway's maxima are in force.
    if (b.gateway) b.gateway->take_over();
    return b;
  }

  // Starts the loop that ends waits past their deadline (the call's max_wait, the queue's
  // timeout). For the builder, before the policy is served.
  void start() {
    start_loop(clock_, [this](Nanos now) { return tick(now); });
  }

  // Resolves the call's tenant, upstream and route on the gateway serving now (held until the
  // permit is taken or the call refused): an unknown name is an error that costs nothing.
  StatusOr<std::unique_ptr<ResolvedAdmit>> resolve(const AdmitCall& call, Nanos /*now*/) override {
    auto names = names_of(call);
    if (!names.ok()) return names.status();
    Generation* g = hold();
    Resolution r =
        g->gateway->resolve(names.value().tenant, names.value().upstream, names.value().route);
    if (!r.ok()) {
      let_go(g);
      return Status(StatusCode::kNotFound, r.error()->message());
    }
    return std::unique_ptr<ResolvedAdmit>(
        std::make_unique<Resolved>(std::static_pointer_cast<GatewayPolicy>(shared_from_this()), g,
                                   r.target(), names.value().tenant, call.max_wait));
  }

  // In place: a gateway built for the new config takes the current one's place, sharing the
  // counter of every level of the same identity, so held leases stay counted against the new
  // limits (lowered: they drain, never over-admitted) and release where they were admitted.
  // A level the new config adds starts at zero. Leases of the old gateway keep it alive.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const ConcurrencySpec& spec = *c.spec.as<ConcurrencySpec>();
    Generation* was = hold();
    GatewayBuild b = Gateway::create(spec.gateway, *was->gateway);
    let_go(was);
    if (!b.gateway) return Status(StatusCode::kInvalidArgument, errors_of(b.report));
    auto next = std::make_shared<std::unique_ptr<Generation>>(
        std::make_unique<Generation>(std::move(b.gateway), this));
    return Reconfiguration([this, next]() { install(std::move(*next)); });
  }

  [[nodiscard]] static std::string errors_of(const ValidationReport& report) {
    std::string why;
    for (const auto& e : report.errors) why += (why.empty() ? "" : "; ") + e.message;
    return why;
  }

  // Gives back a hold; a retired generation no one holds any more is freed. `g` may be gone
  // once its hold is given back: nothing here reads it after that.
  void let_go(Generation* g) const noexcept {
    if (g->holds.fetch_sub(1) == 1 && unfreed_.load() != 0) prune();
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    Generation* g = hold();
    const GatewayConfig& config = g->gateway->config();
    nlohmann::json ups = nlohmann::json::array();
    for (const auto& u : config.upstreams) ups.push_back(u.id);
    nlohmann::json ts = nlohmann::json::array();
    for (const auto& t : config.tenants) ts.push_back(t.id);
    let_go(g);
    j["upstreams"] = std::move(ups);
    j["tenants"] = std::move(ts);
    // Gateways of earlier configs that leases (or refusals) still hold.
    j["draining_gateways"] = unfreed_.load();
    describe_admissions(j);
    info.in_flight = leases();
    j["in_flight"] = info.in_flight;
    nlohmann::json queues = nlohmann::json::object();
    for (const auto& [upstream, q] : queue_stats()) {
      nlohmann::json one = {{"waiting", q->depth()}};
      for (std::size_t o = 0; o < QueueStats::kOutcomes; ++o)
        one[QueueStats::kNames[o]] = q->count(static_cast<QueueStats::Outcome>(o));
      queues[upstream] = std::move(one);
    }
    j["queues"] = std::move(queues);
  }
  void metrics(std::vector<prometheus::MetricFamily>& out) const override {
    admission_metrics(out);
    Generation* g = hold();
    for (prometheus::MetricFamily& f : GatewayMetrics(*g->gateway).Collect())
      out.push_back(std::move(f));
    let_go(g);
    using prometheus::ClientMetric;
    using prometheus::MetricFamily;
    using prometheus::MetricType;
    MetricFamily depth{"sluice_gateway_queue_waiting",
                       "Calls waiting in an upstream's queue now",
                       MetricType::Gauge,
                       {}};
    MetricFamily ends{"sluice_gateway_queue_calls_total",
                      "Calls that met an upstream's full queue, by how their wait ended: handoff "
                      "(admitted), timeout (the queue's), deadline (the call's own), full "
                      "(refused at once), cancelled (the caller went away), closed (the policy "
                      "was removed or the server stopped)",
                      MetricType::Counter,
                      {}};
    MetricFamily waits{"sluice_gateway_queue_wait_seconds",
                       "How long calls waited in an upstream's queue, however the wait ended",
                       MetricType::Histogram,
                       {}};
    for (const auto& [upstream, q] : queue_stats()) {
      ClientMetric d;
      d.label = {{"upstream", upstream}};
      d.gauge.value = static_cast<double>(q->depth());
      depth.metric.push_back(std::move(d));
      for (std::size_t o = 0; o < QueueStats::kOutcomes; ++o) {
        ClientMetric e;
        e.label = {{"upstream", upstream}, {"outcome", QueueStats::kNames[o]}};
        e.counter.value = static_cast<double>(q->count(static_cast<QueueStats::Outcome>(o)));
        ends.metric.push_back(std::move(e));
      }
      waits.metric.push_back(q->histogram({{"upstream", upstream}}));
    }
    out.push_back(std::move(depth));
    out.push_back(std::move(ends));
    out.push_back(std::move(waits));
  }

  // Answers every call still waiting (the policy is removed, or the server stops): no queued
  // call is left without an answer, and none is queued from here on.
  void on_retire() noexcept override { close_queues(EndWhy::kRemoved); }
  void on_drain() noexcept override { close_queues(EndWhy::kStopping); }

 private:
  // What a concurrency call names: its attributes `tenant` and `upstream` (both required) and
  // `route` (optional), one value each.
  struct Names {
    std::string_view tenant, upstream, route;
  };
  static StatusOr<Names> names_of(const AdmitCall& call) {
    Names n;
    for (auto [field, out] : {std::pair<const char*, std::string_view*>{"tenant", &n.tenant},
                              {"upstream", &n.upstream},
                              {"route", &n.route}}) {
      auto v = call.single(field);
      if (!v.ok()) return v.status();
      *out = v.value();
    }
    if (n.tenant.empty()) return invalid("tenant", "must not be empty for a concurrency policy");
    if (n.upstream.empty())
      return invalid("upstream", "must not be empty for a concurrency policy");
    return n;
  }

  // A call resolved on a generation it holds: take() admits it there, or (a full upstream
  // whose queue it may wait in) queues it, FIFO, handed a permit when one is released, up to
  // the earlier of the queue's timeout and the call's max_wait, holding no thread.
  class Resolved final : public ResolvedAdmit {
   public:
    Resolved(std::shared_ptr<GatewayPolicy> policy, Generation* g, Target target,
             std::string_view tenant, std::optional<Nanos> max_wait)
        : policy_(std::move(policy)),
          g_(g),
          target_(std::move(target)),
          tenant_(tenant),
          max_wait_(max_wait) {}
    ~Resolved() override {
      if (g_ != nullptr) policy_->let_go(g_);  // refused by the rate, or never taken
    }
    Resolved(const Resolved&) = delete;
    Resolved& operator=(const Resolved&) = delete;

    std::string_view rate_key() const noexcept override { return tenant_; }
    Decided<AdmitDecision> take(Nanos now, Deferral<AdmitDecision>& later) override {
      Generation* g = std::exchange(g_, nullptr);  // the hold passes to what comes of it
      return policy_->take_on(*g, target_, now, max_wait_, later);
    }

   private:
    std::shared_ptr<GatewayPolicy> policy_;
    Generation* g_;
    Target target_;
    std::string_view tenant_;
    std::optional<Nanos> max_wait_;
  };

  // Takes a permit for `target` on `g` (whose hold the caller passes on: to the lease, to a
  // refusal, or to the queue), or refuses, or queues the call.
  Decided<AdmitDecision> take_on(Generation& g, const Target& target, Nanos now,
                                 std::optional<Nanos> max_wait, Deferral<AdmitDecision>& later) {
    AdmitDecision out;
    Admission a = g.gateway->try_acquire(target);
    if (a.admitted()) {
      out.permit = lease(GatewayLease{std::move(a.permit()), &g});
      return out;
    }
    if (max_wait.value_or(Nanos::max()) > Nanos{0} &&
        a.rejection()->level == LimitLevel::kUpstream && g.gateway->queues(target)) {
      // The upstream's queue: its refusal now is the template of those to come.
      Rejection refused = std::move(*a.rejection());
      refused.policy = name();
      return wait(g, target, max_wait, now, std::move(refused), later);
    }
    count_limit_refusal();
    out.refusal = std::move(*a.rejection());
    out.refusal.policy = name();
    out.refusal_owner = refusal_owner(g);
    let_go(&g);
    return out;
  }

  // Keeps `g` and this policy alive for a refusal whose views point into both (takes a hold).
  std::shared_ptr<const void> refusal_owner(Generation& g) const {
    g.holds.fetch_add(1);
    auto self = std::static_pointer_cast<const GatewayPolicy>(shared_from_this());
    return std::shared_ptr<const void>(
        &g, [self = std::move(self)](Generation* held) { self->let_go(held); });
  }

  // Queues the call (holding `g`, which the caller held) on `target`'s upstream queue: deferred,
  // or answered now when the gateway decides at once (the queue full, a unit freed meanwhile)
  // or the policy is closing.
  Decided<AdmitDecision> wait(Generation& g, const Target& target, std::optional<Nanos> max_wait,
                              Nanos now, Rejection refused, Deferral<AdmitDecision>& later) {
    auto w = std::make_shared<Waiter>();
    w->generation = &g;
    w->since = now;
    w->deadline = max_wait && *max_wait < Nanos::max() - now ? now + *max_wait : Nanos::max();
    w->stats = queue_stats_of(std::string(refused.upstream_id));
    w->queue_timeout = queue_timeout_of(g, refused);
    w->template_refusal = std::move(refused);
    {
      const std::lock_guard lock(waiters_mu_);
      if (closed_) {
        // Retired meanwhile: nothing would answer a queued call. Refused as it was.
        count_limit_refusal();
        AdmitDecision out;
        out.refusal = std::move(w->template_refusal);
        out.refusal_owner = refusal_owner(g);
        let_go(&g);
        return out;
      }
      w->id = ++next_waiter_;
      waiters_.emplace(w->id, w);
    }
    w->done = later.defer();
    later.on_cancel([weak = std::weak_ptr<Waiter>(w), self = weak_from_this()] {
      const auto policy = std::static_pointer_cast<GatewayPolicy>(self.lock());
      if (auto waiter = weak.lock(); waiter != nullptr && policy != nullptr)
        policy->end_wait(waiter, EndWhy::kCancelled);
    });
    AcquireTicket ticket = g.gateway->acquire_async(
        target, now,
        [self = std::static_pointer_cast<GatewayPolicy>(shared_from_this()), w](Admission a) {
          self->decided(*w, std::move(a));
        });
    std::optional<EndWhy> asked;
    {
      const std::lock_guard lock(w->mu);
      if (!w->answered) {
        w->ticket.emplace(ticket);
        w->queued = ticket.queued();
        if (w->queued) w->stats->queued();
        asked = w->end_asked;
      }
    }
    if (asked) end_wait(w, *asked);
    wake_loops();  // the loop now ticks often enough to end this wait on time
    return std::nullopt;
  }

  void close_queues(EndWhy why) noexcept {
    std::vector<std::shared_ptr<Waiter>> all;
    {
      const std::lock_guard lock(waiters_mu_);
      closed_ = true;
      for (auto& [id, w] : waiters_) all.push_back(w);
    }
    for (const auto& w : all) end_wait(w, why);
  }

  // The gateway decided a waiter (handed it a permit, or refused it: full, timed out).
  void decided(Waiter& w, Admission a) {
    bool was_queued = false;
    {
      const std::lock_guard lock(w.mu);
      if (w.answered) return;  // cannot happen (one answer); a permit would go back here
      w.answered = true;
      was_queued = w.queued;
    }
    forget(w.id);
    const Nanos waited = was_queued ? std::max(Nanos{0}, clock_.now() - w.since) : Nanos{0};
    AdmitDecision out;
    out.waited = waited;
    Generation& g = *w.generation;
    if (a.admitted()) {
      w.stats->ended(QueueStats::kHandoff, was_queued, waited);
      out.permit = lease(GatewayLease{std::move(a.permit()), &g});  // takes the hold
    } else {
      count_limit_refusal();
      out.refusal = std::move(*a.rejection());
      out.refusal.policy = name();
      if (out.refusal.reason == RejectReason::kQueueFull) {
        w.stats->ended(QueueStats::kFull, was_queued, waited);  // the library's detail says so
      } else {
        w.stats->ended(QueueStats::kTimeout, was_queued, waited);
        out.refusal.detail_text = waited_text(w, waited, "the queue's timeout");
      }
      if (was_queued) out.refusal.waited = waited;
      out.refusal_owner = refusal_owner(g);
      let_go(&g);  // the waiter's hold: the refusal holds its own
    }
    w.done(std::move(out));
  }

  // Ends `w`'s wait for `why`, unless it was decided meanwhile: its place in the queue is given
  // up and the call answered (a refusal at its deadline, UNAVAILABLE when the policy closed,
  // CANCELLED to a caller that went away).
  void end_wait(const std::shared_ptr<Waiter>& w, EndWhy why) {
    std::optional<AcquireTicket> ticket;
    bool was_queued = false;
    {
      const std::lock_guard lock(w->mu);
      if (w->answered) return;
      if (!w->ticket) {
        if (!w->end_asked) w->end_asked = why;  // acted on once the ticket is set
        return;
      }
      ticket = w->ticket;
    }
    if (!ticket->cancel()) return;  // decided meanwhile: its callback answers
    {
      const std::lock_guard lock(w->mu);
      w->answered = true;
      was_queued = w->queued;
    }
    forget(w->id);
    const Nanos waited = std::max(Nanos{0}, clock_.now() - w->since);
    Generation& g = *w->generation;
    switch (why) {
      case EndWhy::kDeadline: {
        w->stats->ended(QueueStats::kDeadline, was_queued, waited);
        count_limit_refusal();
        AdmitDecision out;
        out.waited = waited;
        out.refusal = w->template_refusal;
        out.refusal.reason = RejectReason::kQueueTimeout;
        out.refusal.waited = waited;
        out.refusal.detail_text = waited_text(*w, waited, "the call's max_wait");
        out.refusal_owner = refusal_owner(g);
        let_go(&g);
        w->done(std::move(out));
        return;
      }
      case EndWhy::kCancelled:
        w->stats->ended(QueueStats::kCancelled, was_queued, waited);
        let_go(&g);
        w->done(Status(StatusCode::kAborted, "admit: the caller went away while queued"));
        return;
      case EndWhy::kRemoved:
      case EndWhy::kStopping:
        w->stats->ended(QueueStats::kClosed, was_queued, waited);
        let_go(&g);
        w->done(Status(StatusCode::kUnavailable,
                       why == EndWhy::kRemoved
                           ? "policy: '" + name() +
                                 "' was removed or replaced by a reload while the call " +
                                 "waited in its queue (" + seconds_text(waited) + ")"
                           : "server: stopping; the call waited in policy '" + name() +
                                 "''s queue (" + seconds_text(waited) + ")"));
        return;
    }
  }

  // "Waited 2.000 s in upstream U's queue (the queue's timeout: 2 s); N in flight of M"
  static std::string waited_text(const Waiter& w, Nanos waited, const char* bound) {
    const Rejection& r = w.template_refusal;
    std::string out = "Waited " + seconds_text(waited) + " in upstream " +
                      std::string(r.upstream_id) + "'s queue (" + bound;
    if (std::string_view(bound) == "the queue's timeout")
      out += ": " + seconds_text(w.queue_timeout);
    out += ") without a free slot";
    return out;
  }
  static std::string seconds_text(Nanos d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f s", std::chrono::duration<double>(d).count());
    return buf;
  }

  // The loop: ends waits past the call's own deadline and, through each gateway, past the
  // queue's timeout. Every 2 ms while calls wait (the most a wait runs over its bound, besides
  // scheduling), else once a second.
  Nanos tick(Nanos now) {
    std::vector<std::shared_ptr<Waiter>> late;
    bool waiting = false;
    {
      const std::lock_guard lock(waiters_mu_);
      waiting = !waiters_.empty();
      for (auto& [id, w] : waiters_)
        if (w->deadline <= now) late.push_back(w);
    }
    for (const auto& w : late) end_wait(w, EndWhy::kDeadline);
    if (waiting) {
      // Every gateway still holding queues: the current one and those reloads replaced (each
      // expires the waiters of the queues it has; a shared queue's are expired once).
      std::vector<Generation*> gens;
      {
        const std::lock_guard lock(mu_);
        current_->holds.fetch_add(1);
        gens.push_back(current_.get());
        for (auto& r : retired_) {
          r->holds.fetch_add(1);
          gens.push_back(r.get());
        }
      }
      for (Generation* g : gens) {
        g->gateway->tick(now);
        let_go(g);
      }
    }
    return now + (waiting ? std::chrono::milliseconds(2) : std::chrono::milliseconds(1000));
  }

  void forget(std::uint64_t id) {
    const std::lock_guard lock(waiters_mu_);
    waiters_.erase(id);
  }

  // The stats of `upstream`'s queue (made on its first queued call; upstreams are the config's,
  // so their number is bounded).
  std::shared_ptr<QueueStats> queue_stats_of(const std::string& upstream) {
    const std::lock_guard lock(stats_mu_);
    auto& q = queues_[upstream];
    if (q == nullptr) q = std::make_shared<QueueStats>();
    return q;
  }
  std::map<std::string, std::shared_ptr<QueueStats>> queue_stats() const {
    const std::lock_guard lock(stats_mu_);
    return queues_;
  }
  // The queue timeout the refusing upstream's pool has in `g`'s config (its own, or a
  // binding's): for messages.
  static Nanos queue_timeout_of(const Generation& g, const Rejection& r) {
    const GatewayConfig& config = g.gateway->config();
    for (const BindingConfig& b : config.bindings)
      if (b.tenant == r.tenant_id && b.upstream == r.upstream_id && b.concurrency_limit &&
          b.concurrency_limit->strategy == Strategy::kQueue)
        return b.concurrency_limit->queue.timeout;
    for (const UpstreamConfig& u : config.upstreams)
      if (u.id == r.upstream_id && u.concurrency_limit) return u.concurrency_limit->queue.timeout;
    return Nanos{0};
  }

  // The current generation, held (let_go() gives it back).
  Generation* hold() const noexcept {
    const std::lock_guard lock(mu_);
    current_->holds.fetch_add(1);
    return current_.get();
  }

  // The reload commits: `next` serves from here on; the old generation is freed once nothing
  // holds it.
  void install(std::unique_ptr<Generation> next) noexcept {
    next->gateway->take_over();
    {
      const std::lock_guard lock(mu_);
      retired_.push_back(std::exchange(current_, std::move(next)));
      unfreed_.fetch_add(1);
    }
    prune();
  }

  void prune() const noexcept {
    std::vector<std::unique_ptr<Generation>> dead;  // freed outside the lock
    const std::lock_guard lock(mu_);
    // Only the current generation gains holds (under mu_): a retired one held by nothing stays
    // so.
    std::erase_if(retired_, [&](std::unique_ptr<Generation>& g) {
      if (g->holds.load() != 0) return false;
      dead.push_back(std::move(g));
      return true;
    });
    unfreed_.fetch_sub(dead.size());
  }

  const Clock& clock_;
  mutable std::mutex mu_;
  std::unique_ptr<Generation> current_;                       // guarded by mu_
  mutable std::vector<std::unique_ptr<Generation>> retired_;  // guarded by mu_; freed unheld
  mutable std::atomic<std::size_t> unfreed_{0};               // retired_.size(), seq_cst
  std::mutex waiters_mu_;
  std::map<std::uint64_t, std::shared_ptr<Waiter>> waiters_;  // guarded by waiters_mu_
  std::uint64_t next_waiter_ = 0;                             // guarded by waiters_mu_
  bool closed_ = false;  // guarded by waiters_mu_: retired, queues nothing more
  mutable std::mutex stats_mu_;
  std::map<std::string, std::shared_ptr<QueueStats>> queues_;  // guarded by stats_mu_
};

void GatewayLease::finish(const CallEnd& /*end*/) noexcept {
  permit.release();
  generation->policy->let_go(generation);
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const ConcurrencySpec& spec = *c.spec.as<ConcurrencySpec>();
  GatewayBuild b = GatewayPolicy::gateway_for(c, spec.gateway);
  if (!b.gateway) return Status(StatusCode::kInvalidArgument, GatewayPolicy::errors_of(b.report));
  auto policy = std::make_shared<GatewayPolicy>(c, std::move(b.gateway));
  if (auto* was = dynamic_cast<const GatewayPolicy*>(c.predecessor.get()))
    policy->count_leases_of(*was);
  policy->start();
  return std::shared_ptr<Policy>(std::move(policy));
}

}  // namespace

PolicyKind concurrency_kind() {
  return PolicyKind("concurrency", PolicyKind::kAdmit, parse_concurrency, build);
}

}  // namespace sluice::server
