#include "sluice/sim/federation_sim.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <thread>

#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/backends/memory_regional_escrow.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/federation/federation.h"

namespace sluice::sim {
namespace {

constexpr std::string_view kKey = "global";
constexpr Nanos kSweepEvery = std::chrono::milliseconds(100);

// Coordinator calls as coroutines on threads: a call runs on a worker from its start to its
// end, giving the turn back whenever it waits for simulated time. Exactly one thread (the event
// loop, id kLoop, or one worker) holds the turn; the others wait for it under `mu_`.
class Workers {
 public:
  static constexpr int kLoop = -1;
  // Asks the event loop to resume `worker` when the clock reaches `at`.
  using Schedule = std::function<void(Nanos at, int worker)>;

  explicit Workers(Schedule schedule) : schedule_(std::move(schedule)) {}
  ~Workers() {
    {
      const std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w->thread.join();
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Runs `task` on an idle worker until it first waits or ends (the caller holds the turn).
  void start(std::function<void()> task) {
    int id = 0;
    {
      const std::lock_guard lock(mu_);
      while (id < static_cast<int>(workers_.size()) && workers_[static_cast<std::size_t>(id)]->busy)
        ++id;
      if (id == static_cast<int>(workers_.size())) {
        workers_.push_back(std::make_unique<Worker>());
        workers_.back()->thread = std::thread([this, id] { loop(id); });
      }
      Worker& w = *workers_[static_cast<std::size_t>(id)];
      w.busy = true;
      w.task = std::move(task);
    }
    transfer(id);
  }
  // The event loop gives the turn to `worker` until it waits again or ends.
  void resume(int worker) { transfer(worker); }
  // A worker's call waits until the clock reaches `at` (the loop resumes it then).
  void wait_until(Nanos at) {
    std::unique_lock lock(mu_);
    const int self = turn_;
    schedule_(at, self);
    turn_ = workers_[static_cast<std::size_t>(self)]->return_to;
    cv_.notify_all();
    cv_.wait(lock, [&] { return turn_ == self; });
  }

 private:
  struct Worker {
    std::thread thread;
    std::function<void()> task;
    int return_to = kLoop;
    bool busy = false;
  };

  void transfer(int to) {
    std::unique_lock lock(mu_);
    const int self = turn_;
    workers_[static_cast<std::size_t>(to)]->return_to = self;
    turn_ = to;
    cv_.notify_all();
    cv_.wait(lock, [&] { return turn_ == self; });
  }

  void loop(int id) {
    std::unique_lock lock(mu_);
    Worker& w = *workers_[static_cast<std::size_t>(id)];
    for (;;) {
      cv_.wait(lock, [&] { return turn_ == id || quit_; });
      if (quit_) return;
      std::function<void()> task = std::move(w.task);
      lock.unlock();
      task();
      lock.lock();
      w.busy = false;
      turn_ = w.return_to;
      cv_.notify_all();
    }
  }

  Schedule schedule_;
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = kLoop;
  bool quit_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;  // grown by the turn's holder, under mu_
};

// The network in front of the coordinator: a call reaches it `one_way` after it is made (the
// coordinator reads the clock then) and its reply returns `one_way` later. A call that would
// reach it during the outage [outage_start, outage_end) fails instead (see the header).
class DelayedCoordinator final : public RateCoordinator {
 public:
  using OnLease = std::function<void(const LeaseReply&)>;
  using OnReturn = std::function<void(Nanos window_start, std::uint64_t returned)>;
  struct Outage {
    Nanos start{0}, end{0};
    OutageFailure failure = OutageFailure::kRefused;
  };

  DelayedCoordinator(RateCoordinator& inner, const Clock& clock, Workers& workers, Nanos one_way,
                     Outage outage, OnLease on_lease, OnReturn on_return)
      : inner_(inner),
        clock_(clock),
        workers_(workers),
        one_way_(one_way),
        outage_(outage),
        on_lease_(std::move(on_lease)),
        on_return_(std::move(on_return)) {}

  StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& request,
                             Nanos timeout) noexcept override {
    const Nanos sent = clock_.now();
    if (down(sent)) return fail(sent, timeout);
    workers_.wait_until(sent + one_way_);
    StatusOr<LeaseReply> reply = inner_.lease(key, request, timeout);
    if (reply.ok()) on_lease_(reply.value());
    workers_.wait_until(sent + 2 * one_way_);
    return reply;
  }
  StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region,
                                    Nanos window_start, std::uint64_t relinquished,
                                    Nanos timeout) noexcept override {
    const Nanos sent = clock_.now();
    if (down(sent)) return fail(sent, timeout);
    workers_.wait_until(sent + one_way_);
    StatusOr<std::uint64_t> back =
        inner_.reconcile(key, region, window_start, relinquished, timeout);
    if (back.ok()) on_return_(window_start, back.value());
    workers_.wait_until(sent + 2 * one_way_);
    return back;
  }
  Status health(Nanos timeout) noexcept override {
    const Nanos sent = clock_.now();
    if (down(sent)) return fail(sent, timeout);
    workers_.wait_until(sent + one_way_);
    Status s = inner_.health(timeout);
    workers_.wait_until(sent + 2 * one_way_);
    return s;
  }
  std::string_view backend() const noexcept override { return "simulated network"; }

 private:
  // Whether a call made at `sent` would reach the coordinator during the outage.
  bool down(Nanos sent) const noexcept {
    const Nanos arrives = sent + one_way_;
    return arrives >= outage_.start && arrives < outage_.end;
  }
  Status fail(Nanos sent, Nanos timeout) {
    if (outage_.failure == OutageFailure::kTimeout) {
      workers_.wait_until(sent + timeout);
      return Status(StatusCode::kDeadlineExceeded, "coordinator call timed out");
    }
    workers_.wait_until(sent + 2 * one_way_);
    return Status(StatusCode::kUnavailable, "coordinator unreachable");
  }

  RateCoordinator& inner_;
  const Clock& clock_;
  Workers& workers_;
  const Nanos one_way_;
  const Outage outage_;
  OnLease on_lease_;
  OnReturn on_return_;
};

// A region's clock: the simulated one plus the region's offset.
class OffsetClock final : public Clock {
 public:
  OffsetClock(const Clock& base, Nanos offset) : base_(base), offset_(offset) {}
  [[nodiscard]] Nanos now() const noexcept override { return base_.now() + offset_; }

 private:
  const Clock& base_;
  const Nanos offset_;
};

// One region's view of a coordinator with no clock of its own (etcd's): the ledgers all regions
// share, each call decided at this region's clock (the escrow core keeps the latest time it
// decided a key at), `uncertainty` more of the window asked to be left and said in the reply.
class CallerClockCoordinator final : public RateCoordinator {
 public:
  using Ledgers = std::map<std::string, Ledger, std::less<>>;
  CallerClockCoordinator(Ledgers& ledgers, const Clock& caller, Nanos uncertainty)
      : ledgers_(ledgers), caller_(caller), uncertainty_(uncertainty) {}

  StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& request,
                             Nanos /*timeout*/) noexcept override {
    LeaseRequest r = request;
    r.min_window_left += uncertainty_;
    LeaseReply reply = sluice::lease(ledger(key), r, caller_.now());
    reply.clock_uncertainty = uncertainty_;
    return reply;
  }
  StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region,
                                    Nanos window_start, std::uint64_t relinquished,
                                    Nanos /*timeout*/) noexcept override {
    return sluice::reconcile(ledger(key), region, window_start, relinquished, caller_.now());
  }
  Status health(Nanos /*timeout*/) noexcept override { return {}; }
  std::string_view backend() const noexcept override { return "callers' clocks"; }

 private:
  Ledger& ledger(std::string_view key) {
    auto it = ledgers_.find(key);
    if (it == ledgers_.end()) it = ledgers_.emplace(std::string(key), Ledger{}).first;
    return it->second;
  }

  Ledgers& ledgers_;
  const Clock& caller_;
  const Nanos uncertainty_;
};

// The network in front of a region's pool: as for the coordinator, `one_way` each way; the pool
// decides on arrival, on the one clock. `on_accepted` hears of every unit a refill or a release
// put in the pool, when the pool decided.
class DelayedPool final : public RegionalEscrow {
 public:
  using OnAccepted = std::function<void(bool refill, std::uint64_t units)>;

  DelayedPool(RegionalEscrow& inner, const Clock& clock, Workers& workers, Nanos one_way,
              OnAccepted on_accepted)
      : inner_(inner),
        clock_(clock),
        workers_(workers),
        one_way_(one_way),
        on_accepted_(std::move(on_accepted)) {}

  // Runs `f` at the pool when the call arrives; returns its reply a round trip after the call.
  template <typename F>
  auto relay(F&& f) {
    const Nanos sent = clock_.now();
    workers_.wait_until(sent + one_way_);
    auto reply = f();
    workers_.wait_until(sent + 2 * one_way_);
    return reply;
  }

  StatusOr<PoolReply> take(std::string_view key, std::uint64_t want, Nanos refill_hold,
                           bool past_expiry, Nanos timeout) noexcept override {
    return relay([&] { return inner_.take(key, want, refill_hold, past_expiry, timeout); });
  }
  StatusOr<PoolReply> refill(std::string_view key, Nanos window_start, std::uint64_t units,
                             Nanos expires_at, Nanos timeout) noexcept override {
    return relay([&] {
      StatusOr<PoolReply> r = inner_.refill(key, window_start, units, expires_at, timeout);
      if (r.ok() && r.value().granted > 0) on_accepted_(true, r.value().granted);
      return r;
    });
  }
  StatusOr<PoolReply> release(std::string_view key, Nanos window_start, std::uint64_t units,
                              Nanos timeout) noexcept override {
    return relay([&] {
      StatusOr<PoolReply> r = inner_.release(key, window_start, units, timeout);
      if (r.ok() && r.value().granted > 0) on_accepted_(false, r.value().granted);
      return r;
    });
  }
  Status health(Nanos timeout) noexcept override {
    return relay([&] { return inner_.health(timeout); });
  }
  std::string_view backend() const noexcept override { return "simulated network"; }

 private:
  RegionalEscrow& inner_;
  const Clock& clock_;
  Workers& workers_;
  const Nanos one_way_;
  OnAccepted on_accepted_;
};

enum class Kind : std::uint8_t { kArrival, kResume, kSweep, kOnset, kCharge, kWindowEnd };

struct Event {
  Nanos t;
  std::uint64_t seq;
  Kind kind;
  int who;                // region, process (sweep, charge), worker or window (its end)
  std::uint64_t hits{0};  // a charge's
  friend bool operator>(const Event& a, const Event& b) {
    return a.t != b.t ? a.t > b.t : a.seq > b.seq;
  }
};

struct Region {
  double rate_per_ns = 0;
  std::mt19937_64 rng;
  std::mt19937_64 pick;    // which of the region's processes an arrival goes to
  std::mt19937_64 cost;    // the hits charged after an admission
  FixedWindowState local;  // independent and static
  RateRule rule;
  std::uint64_t offered = 0, admitted = 0;  // within the measured windows
};

class Run {
 public:
  explicit Run(const FederationSimConfig& c) : c_(c), horizon_(c.window * c.windows) {
    windows_.resize(static_cast<std::size_t>(c.windows));
    if (!c.clock_offsets.empty())
      shift_ = *std::max_element(c.clock_offsets.begin(), c.clock_offsets.end());
    const double per_window = c.load * static_cast<double>(c.limit) /
                              (static_cast<double>(c.hits) + static_cast<double>(c.charge_max) / 2);
    const double k = c.regions;
    for (int r = 0; r < c.regions; ++r) {
      Region& g = regions_.emplace_back();
      const double share = (r == 0 ? c.skew : 0.0) + (1 - c.skew) / k;
      g.rate_per_ns = per_window * share / static_cast<double>(c.window.count());
      g.rng.seed(c.seed * 7919 + static_cast<std::uint64_t>(r));
      g.pick.seed(c.seed * 104729 + static_cast<std::uint64_t>(r));
      g.cost.seed(c.seed * 1299709 + static_cast<std::uint64_t>(r));
      g.rule.strategy = RateStrategy::kFixedWindow;
      g.rule.period = c.window;
      g.rule.limit = c.limit;
      if (c.scheme == FederationScheme::kStatic) {
        const auto n = static_cast<std::uint64_t>(c.regions);
        g.rule.limit = c.limit / n + (static_cast<std::uint64_t>(r) < c.limit % n ? 1 : 0);
      }
    }
    if (c.scheme == FederationScheme::kFederated) build_federation();
  }

  FederationSimResult run() {
    for (int r = 0; r < c_.regions; ++r) {
      if (regions_[static_cast<std::size_t>(r)].rate_per_ns > 0)
        push(next_gap(r), Kind::kArrival, r);
      if (limiters_.empty()) continue;
      for (int p = 0; p < c_.processes; ++p) push(kSweepEvery, Kind::kSweep, r * c_.processes + p);
    }
    if (!limiters_.empty() && c_.outage_end > c_.outage_start)
      push(c_.outage_start, Kind::kOnset, 0);
    // Pushed before anything else at the same instant: what is spent at a window's first
    // nanosecond counts in that window.
    for (int k = 0; k < c_.windows && !limiters_.empty(); ++k)
      push(c_.window * (k + 1), Kind::kWindowEnd, k);
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      clock_.set(e.t);
      handle(e);
    }
    return summarize();
  }

 private:
  void build_federation() {
    workers_ = std::make_unique<Workers>(
        [this](Nanos at, int worker) { push(at, Kind::kResume, worker); });
    memory_ = std::make_unique<MemoryRateCoordinator>(clock_);
    const auto network = [this](RateCoordinator& inner) {
      return std::make_unique<DelayedCoordinator>(
          inner, clock_, *workers_, c_.one_way,
          DelayedCoordinator::Outage{c_.outage_start, c_.outage_end, c_.outage_failure},
          [this](const LeaseReply& r) {
            FederationWindow* w = window_at(r.window_start);
            if (w == nullptr) return;
            ++w->leases;
            w->handed_out += r.granted;
          },
          [this](Nanos window_start, std::uint64_t back) {
            ++reconciles_;
            if (back == 0) return;
            if (FederationWindow* w = window_at(window_start)) w->handed_out -= back;
          });
    };
    network_ = network(*memory_);
    for (int r = 0; r < c_.regions; ++r) {
      const Clock* region_clock = &clock_;
      RateCoordinator* coordinator = network_.get();
      if (!c_.clock_offsets.empty()) {
        region_clocks_.push_back(
            std::make_unique<OffsetClock>(clock_, c_.clock_offsets[static_cast<std::size_t>(r)]));
        region_clock = region_clocks_.back().get();
        callers_.push_back(std::make_unique<CallerClockCoordinator>(ledgers_, *region_clock,
                                                                    c_.clock_uncertainty));
        region_networks_.push_back(network(*callers_.back()));
        coordinator = region_networks_.back().get();
      }
      FederationOptions o;
      o.region = "region-" + std::to_string(r);
      o.budget = {c_.limit, c_.window};
      o.batch = c_.batch;
      o.regional_batch = c_.regional_batch;
      o.outage = c_.outage;
      o.coordinator_health_check = c_.coordinator_health_check;
      RegionalEscrow* pool = nullptr;
      if (c_.regional_pool) {
        pools_.push_back(std::make_unique<MemoryRegionalEscrow>(clock_));
        pool_networks_.push_back(std::make_unique<DelayedPool>(
            *pools_.back(), clock_, *workers_, c_.one_way, [this](bool refill, std::uint64_t n) {
              const Nanos now = clock_.now();
              if (now < c_.outage_start || now >= c_.outage_end) return;
              (refill ? refilled_in_outage_ : released_in_outage_) += n;
            }));
        pool = pool_networks_.back().get();
      }
      for (int p = 0; p < c_.processes; ++p)
        limiters_.push_back(std::make_unique<FederatedLimiter>(
            *coordinator, pool, *region_clock, o,
            [this](std::function<void()> call) { workers_->start(std::move(call)); }));
    }
  }

  // The outage's onset: what the pools and the processes hold.
  void record_onset() {
    for (const auto& pool : pools_)
      if (const std::optional<RegionalPool> p = pool->pool(kKey)) onset_pool_balance_ += p->balance;
    for (const auto& l : limiters_) {
      const FederationStats st = l->stats();
      onset_escrow_held_ += st.granted - std::min(st.granted, st.spent + st.forfeited);
    }
  }

  void decided(Region& g, int process, const FederatedDecision& d) {
    if (d.rate.allowed) {
      admitted(g);
      if (c_.charge_max == 0) return;
      const Nanos at = clock_.now() + c_.charge_after;
      const std::uint64_t hits = g.cost() % (c_.charge_max + 1);
      if (hits > 0 && at < horizon_) push(at, Kind::kCharge, process, hits);
      return;
    }
    FederationWindow* w = window_at(clock_.now() + shift_);
    if (w == nullptr) return;
    if (d.reason == FederatedReason::kCoordinatorUnreachable) ++w->refused_unreachable;
    if (d.reason == FederatedReason::kRegionalBalanceSpent) ++w->refused_balance_spent;
  }

  FederationWindow* window_at(Nanos t) {
    if (t < Nanos{0} || t >= horizon_) return nullptr;
    return &windows_[static_cast<std::size_t>(t / c_.window)];
  }

  Nanos next_gap(int r) {
    Region& g = regions_[static_cast<std::size_t>(r)];
    // Inverse CDF on 53 random bits: the same gaps with every standard library.
    const double u = static_cast<double>(g.rng() >> 11) * 0x1.0p-53;
    return Nanos{std::max<std::int64_t>(1, std::llround(-std::log1p(-u) / g.rate_per_ns))};
  }

  void push(Nanos t, Kind kind, int who, std::uint64_t hits = 0) {
    events_.push(Event{t, seq_++, kind, who, hits});
  }

  // The end of window `k`: what the limiters spent and forgave in it.
  void window_end(int k) {
    std::uint64_t spent = 0, forgiven = 0;
    for (const auto& l : limiters_) {
      const FederationStats st = l->stats();
      spent += st.spent;
      forgiven += st.forgiven;
    }
    FederationWindow& w = windows_[static_cast<std::size_t>(k)];
    w.spent = spent - spent_before_;
    w.forgiven = forgiven - forgiven_before_;
    spent_before_ = spent;
    forgiven_before_ = forgiven;
  }

  // Region r's clock reads the simulated clock plus this.
  Nanos offset_of(int r) const {
    return c_.clock_offsets.empty() ? Nanos{0} : c_.clock_offsets[static_cast<std::size_t>(r)];
  }

  void admitted(Region& g) {
    if (FederationWindow* w = window_at(clock_.now() + shift_)) {
      w->admitted += c_.hits;
      g.admitted += c_.hits;
    }
  }

  void handle(const Event& e) {
    const Nanos now = e.t;
    switch (e.kind) {
      case Kind::kResume:
        workers_->resume(e.who);
        return;
      case Kind::kSweep:
        limiters_[static_cast<std::size_t>(e.who)]->sweep(now + offset_of(e.who / c_.processes));
        if (now + kSweepEvery < horizon_) push(now + kSweepEvery, Kind::kSweep, e.who);
        return;
      case Kind::kOnset:
        record_onset();
        return;
      case Kind::kWindowEnd:
        window_end(e.who);
        return;
      case Kind::kCharge:
        (void)limiters_[static_cast<std::size_t>(e.who)]->charge(kKey, e.hits, now);
        if (FederationWindow* w = window_at(now)) w->charged += e.hits;
        return;
      case Kind::kArrival:
        break;
    }
    Region& g = regions_[static_cast<std::size_t>(e.who)];
    if (FederationWindow* w = window_at(now + shift_)) {
      w->offered += c_.hits;
      g.offered += c_.hits;
    }
    if (c_.scheme == FederationScheme::kFederated) {
      int process = e.who * c_.processes;
      if (c_.processes > 1) process += static_cast<int>(g.pick() % c_.processes);
      limiters_[static_cast<std::size_t>(process)]->check(
          kKey, c_.hits, now + offset_of(e.who),
          [this, &g, process](const FederatedDecision& d) { decided(g, process, d); });
    } else if (decide(g.local, g.rule, c_.hits, now).allowed) {
      admitted(g);
    }
    const Nanos next = now + next_gap(e.who);
    if (next < horizon_) push(next, Kind::kArrival, e.who);
  }

  FederationSimResult summarize() const {
    FederationSimResult out;
    out.windows = windows_;
    out.reconciles = reconciles_;
    const auto m = static_cast<std::size_t>(c_.processes);
    for (std::size_t r = 0; r < regions_.size(); ++r) {
      out.region_offered.push_back(regions_[r].offered);
      out.region_admitted.push_back(regions_[r].admitted);
      std::uint64_t forfeited = 0;
      for (std::size_t p = 0; p < m && !limiters_.empty(); ++p) {
        const FederationStats st = limiters_[r * m + p]->stats();
        forfeited += st.forfeited;
        out.outages += st.outages;
        out.pool_taken += st.pool_taken;
      }
      out.region_forfeited.push_back(forfeited);
    }
    out.onset_pool_balance = onset_pool_balance_;
    out.onset_escrow_held = onset_escrow_held_;
    out.refilled_in_outage = refilled_in_outage_;
    out.released_in_outage = released_in_outage_;
    const auto limit = static_cast<double>(c_.limit);
    double u = 0, over = 0, stranded = 0, unleased = 0, spent = 0;
    int counted = 0;
    std::uint64_t leases = 0, admitted = 0;
    for (const FederationWindow& w : windows_) {
      const double ratio = static_cast<double>(w.admitted) / limit;
      out.max_admitted_over_limit = std::max(out.max_admitted_over_limit, ratio);
      over += ratio;
      const double spent_ratio = static_cast<double>(w.spent) / limit;
      out.max_spent_over_limit = std::max(out.max_spent_over_limit, spent_ratio);
      spent += spent_ratio;
      const std::uint64_t cap = std::min(w.offered, c_.limit);
      if (cap > 0) {
        u += static_cast<double>(w.admitted) / static_cast<double>(cap);
        ++counted;
      }
      stranded += static_cast<double>(w.handed_out) - static_cast<double>(w.admitted);
      unleased += limit - static_cast<double>(w.handed_out);
      leases += w.leases;
      admitted += w.admitted;
      if (c_.scheme == FederationScheme::kFederated && w.admitted > w.handed_out)
        out.beyond_grants += w.admitted - w.handed_out;
    }
    const double n = static_cast<double>(windows_.size());
    out.u_capacity = counted > 0 ? u / counted : 0;
    out.mean_admitted_over_limit = over / n;
    if (c_.scheme == FederationScheme::kFederated) {
      out.mean_stranded = stranded / n;
      out.mean_unleased = unleased / n;
      out.mean_spent_over_limit = spent / n;
      out.leases_per_admission =
          admitted > 0 ? static_cast<double>(leases) / static_cast<double>(admitted) : 0;
    }
    return out;
  }

  const FederationSimConfig& c_;
  const Nanos horizon_;
  ManualClock clock_{Nanos{0}};
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t seq_ = 0;
  std::vector<Region> regions_;
  std::vector<FederationWindow> windows_;
  std::uint64_t reconciles_ = 0;
  std::uint64_t onset_pool_balance_ = 0, onset_escrow_held_ = 0;
  std::uint64_t refilled_in_outage_ = 0, released_in_outage_ = 0;
  std::uint64_t spent_before_ = 0, forgiven_before_ = 0;  // at the last window's end
  // Destroyed in reverse: the limiters (which wait for their calls) before what they use.
  std::unique_ptr<Workers> workers_;
  std::unique_ptr<MemoryRateCoordinator> memory_;
  std::unique_ptr<DelayedCoordinator> network_;
  // On callers' clocks: each region's clock, its view of the coordinator and the network to it.
  Nanos shift_{0};  // windows are counted on the simulated clock plus this
  CallerClockCoordinator::Ledgers ledgers_;
  std::vector<std::unique_ptr<OffsetClock>> region_clocks_;
  std::vector<std::unique_ptr<CallerClockCoordinator>> callers_;
  std::vector<std::unique_ptr<DelayedCoordinator>> region_networks_;
  std::vector<std::unique_ptr<MemoryRegionalEscrow>> pools_;
  std::vector<std::unique_ptr<DelayedPool>> pool_networks_;
  std::vector<std::unique_ptr<FederatedLimiter>> limiters_;
};

}  // namespace

std::string_view to_string(FederationScheme s) noexcept {
  switch (s) {
    case FederationScheme::kIndependent:
      return "independent";
    case FederationScheme::kStatic:
      return "static";
    case FederationScheme::kFederated:
      return "federated";
  }
  return "unknown";
}

std::string_view to_string(OutageFailure f) noexcept {
  switch (f) {
    case OutageFailure::kRefused:
      return "refused";
    case OutageFailure::kTimeout:
      return "timeout";
  }
  return "unknown";
}

std::string FederationSimConfig::validate() const {
  if (regions < 1 || regions > 64) return "regions: must be in 1..64";
  if (limit == 0) return "limit: must be at least 1";
  if (window <= Nanos{0}) return "window: must be positive";
  if (batch == 0) return "batch: must be at least 1";
  if (!(load > 0) || load > 100) return "load: must be in (0, 100]";
  if (!(skew >= 0) || skew > 1) return "skew: must be in [0, 1]";
  if (one_way < Nanos{0}) return "one_way: must not be negative";
  if (2 * one_way >= window) return "one_way: the round trip must be shorter than the window";
  if (windows < 1 || windows > 100'000) return "windows: must be in 1..100000";
  const bool federated = scheme == FederationScheme::kFederated;
  if (hits < 1 || hits > limit) return "hits: must be in 1..limit";
  if (processes < 1 || processes > 64) return "processes: must be in 1..64";
  if (processes > 1 && !federated) return "processes: more than 1 needs the federated scheme";
  if (regional_pool && !federated) return "regional_pool: needs the federated scheme";
  if (regional_batch != 0 && !regional_pool) return "regional_batch: needs regional_pool";
  if (outage_start < Nanos{0} || outage_end < outage_start)
    return "outage_end: must not be before outage_start (both >= 0)";
  if (outage_end > outage_start && !federated) return "outage_start: needs the federated scheme";
  if (outage == FederationOutage::kRegionalOnly && !regional_pool)
    return "outage: regional-only needs regional_pool";
  if (coordinator_health_check <= Nanos{0}) return "coordinator_health_check: must be positive";
  if (charge_max > 0 && !federated) return "charge_max: needs the federated scheme";
  if (charge_max > 1'000'000) return "charge_max: must be at most 1000000";
  if (charge_after < Nanos{0}) return "charge_after: must not be negative";
  if (!clock_offsets.empty()) {
    if (!federated || processes > 1 || regional_pool || outage_end > outage_start || charge_max > 0)
      return "clock_offsets: the federated scheme only, with one process per region and no pool, "
             "outage or charges";
    if (clock_offsets.size() != static_cast<std::size_t>(regions))
      return "clock_offsets: one per region";
    for (const Nanos o : clock_offsets)
      if (o < -window / 4 || o > window / 4) return "clock_offsets: each within a quarter window";
  }
  if (clock_uncertainty < Nanos{0} || clock_uncertainty > window / 2)
    return "clock_uncertainty: must be in [0, window / 2]";
  if (clock_uncertainty > Nanos{0} && clock_offsets.empty())
    return "clock_uncertainty: needs clock_offsets";
  return {};
}

FederationSimResult run_federation_sim(const FederationSimConfig& config) {
  return Run(config).run();
}

const std::vector<double>& federation_skews() {
  static const std::vector<double> skews = {0.0, 0.25, 0.5, 0.75, 1.0};
  return skews;
}

}  // namespace sluice::sim
