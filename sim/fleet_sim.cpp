#include "sluice/sim/fleet_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <unordered_map>

#include "sluice/backends/memory_coordinator.h"
#include "sluice/core/aimd_limit.h"
#include "sluice/core/fixed_limit.h"
#include "sluice/core/gradient2_limit.h"
#include "sluice/core/vegas_limit.h"
#include "sluice/fleet/fleet_guard.h"
#include "sluice/local/adaptive_guard.h"

namespace sluice::sim {
namespace {

using std::chrono::milliseconds;

constexpr std::string_view kKey = "backend";

enum class EventType : std::uint8_t {
  kLoss,  // the coordinator loses its state
  kArrival,
  kFinish,
  kPoll,
  kProcess,
  kReply,
  kTimeout,
  kRelease,
  kSample
};

struct Event {
  Nanos t;
  std::uint64_t seq;
  EventType type;
  int node;
  std::uint64_t id;  // call id, or beat token
  friend bool operator>(const Event& a, const Event& b) {
    return a.t != b.t ? a.t > b.t : a.seq > b.seq;
  }
};

struct Call {
  std::optional<GuardPermit> local;  // independent
  std::optional<FleetPermit> fleet;  // fleet
  Nanos start;
  bool timed_out;          // the caller gave up (or the backend stopped it at its deadline)
  bool in_backend = true;  // still counted in the backend's in-flight
  void release(Outcome outcome, Nanos rtt) {
    if (local) local->release(outcome, rtt);
    if (fleet) fleet->release(outcome, rtt);
  }
};

struct Node {
  std::unique_ptr<AdaptiveGuard> local;  // independent
  std::unique_ptr<FleetGuard> fleet;     // fleet
  double rate_per_ns = 0;
  Nanos join_at{0};
  std::mt19937_64 rng;
  std::unordered_map<std::uint64_t, Call> calls;
  bool fence_hook_ran = false;
  std::optional<FleetGuard::Beat> beat;  // outstanding
  std::uint64_t beat_token = 0;
  std::optional<StatusOr<Grant>> reply;  // computed by the coordinator, in transit
  std::optional<Nanos> fair_share_at;
  std::optional<Nanos> noticed_at;  // incumbents: first grant counting the last joiner
};

std::unique_ptr<LimitAlgorithm> make_algorithm(const FleetSimConfig& c, int node) {
  switch (c.algorithm) {
    case AlgorithmKind::kFixed:
      return std::make_unique<FixedLimit>(FixedLimitOptions{.limit = c.fixed_limit});
    case AlgorithmKind::kVegas: {
      VegasOptions o;
      o.seed = c.seed * 1000 + static_cast<std::uint64_t>(node) + 1;
      return std::make_unique<VegasLimit>(o);
    }
    case AlgorithmKind::kGradient2: {
      Gradient2Options o;
      o.min_limit = 1;
      return std::make_unique<Gradient2Limit>(o);
    }
    case AlgorithmKind::kAimd: {
      AimdOptions o;
      o.min_limit = 1;
      o.timeout = c.call_timeout;
      return std::make_unique<AimdLimit>(o);
    }
  }
  return nullptr;
}

class Simulation {
 public:
  explicit Simulation(const FleetSimConfig& c)
      : c_(c), clock_(Nanos{0}), memory_(clock_, c.coordinator) {}

  FleetSimResult run() {
    const double ideal_per_ns =
        static_cast<double>(c_.capacity) / static_cast<double>(c_.base_latency.count());
    double weight_sum = 0;
    for (int i = 0; i < c_.nodes; ++i) weight_sum += weight(i);
    AdaptiveGuardOptions local;
    local.min_window_time = milliseconds(250);
    local.max_window_time = milliseconds(250);
    for (const Nanos t : c_.join_at) last_join_ = std::max(last_join_, t);
    for (int i = 0; i < c_.nodes; ++i) {
      Node& n = nodes_.emplace_back();
      n.rng.seed(c_.seed * 7919 + static_cast<std::uint64_t>(i));
      n.rate_per_ns = c_.load * ideal_per_ns * weight(i) / weight_sum;
      n.join_at = c_.join_at.empty() ? Nanos{0} : c_.join_at[static_cast<std::size_t>(i)];
      if (c_.guard == GuardKind::kIndependent) {
        n.local = std::make_unique<AdaptiveGuard>(make_algorithm(c_, i), clock_, local);
      } else {
        FleetGuardOptions o;
        o.node_id = "node-" + std::to_string(10 + i);  // ids sort like indices
        o.key = std::string(kKey);
        o.heartbeat = c_.heartbeat;
        o.eager_handoff = c_.eager_handoff;
        o.self_fence = c_.self_fence;
        o.outage = c_.outage;
        o.lease_ttl = c_.lease_ttl;
        o.call_timeout = c_.call_timeout_coordinator;
        o.call_deadline = c_.call_deadline;
        if (!o.call_deadline) {  // the caller's timeout, when it fits the lease
          o.call_deadline = c_.call_timeout;
          if (!o.validate().empty()) o.call_deadline.reset();
        }
        o.local = local;
        o.on_fenced = [this, i] { nodes_[static_cast<std::size_t>(i)].fence_hook_ran = true; };
        n.fleet = std::make_unique<FleetGuard>(memory_, make_algorithm(c_, i), clock_, o);
        push(n.join_at, EventType::kPoll, i, 0);
      }
      if (n.rate_per_ns > 0) push(n.join_at + next_gap(n), EventType::kArrival, i, 0);
    }
    push(Nanos{0}, EventType::kSample, -1, 0);
    for (const Nanos t : c_.coordinator_losses) push(t, EventType::kLoss, -1, 0);
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      if (e.t > c_.duration) break;
      clock_.set(e.t);
      handle(e);
    }
    return summarize();
  }

 private:
  double weight(int i) const {
    return c_.weights.empty() ? 1.0 : c_.weights[static_cast<std::size_t>(i)];
  }

  Nanos next_gap(Node& n) {
    std::exponential_distribution<double> gap(n.rate_per_ns);
    return Nanos{std::max<std::int64_t>(1, std::llround(gap(n.rng)))};
  }

  void push(Nanos t, EventType type, int node, std::uint64_t id) {
    events_.push(Event{t, seq_++, type, node, id});
  }

  bool partitioned(int node, Nanos t) const {
    for (const Partition& p : c_.partitions)
      if (p.node == node && t >= p.start && t < p.end) return true;
    return false;
  }

  // The end of the freeze covering `t` on `node`, if any.
  std::optional<Nanos> frozen_until(int node, Nanos t) const {
    for (const Freeze& f : c_.freezes)
      if (f.node == node && t >= f.start && t < f.end) return f.end;
    return std::nullopt;
  }

  bool acquire(Node& n, Call& call) {
    if (n.local) {
      call.local = n.local->acquire();
      return call.local.has_value();
    }
    call.fleet = n.fleet->acquire();
    return call.fleet.has_value();
  }

  void handle(const Event& e) {
    Node* n = e.node >= 0 ? &nodes_[static_cast<std::size_t>(e.node)] : nullptr;
    if (n != nullptr && e.type != EventType::kFinish && e.type != EventType::kProcess) {
      if (const std::optional<Nanos> thaw = frozen_until(e.node, e.t)) {
        // A frozen node handles nothing: arrivals to it are lost, the rest waits for the thaw.
        if (e.type == EventType::kArrival) {
          ++result_.arrivals;
          ++result_.rejected;
          push(e.t + next_gap(*n), EventType::kArrival, e.node, 0);
        } else {
          push(*thaw, e.type, e.node, e.id);
        }
        return;
      }
    }
    switch (e.type) {
      case EventType::kLoss:
        if (c_.loss_rule)
          coordinator().lose_state();
        else
          forgetful_.emplace(clock_, c_.coordinator);
        break;
      case EventType::kArrival:
        arrive(*n, e.node);
        push(e.t + next_gap(*n), EventType::kArrival, e.node, 0);
        break;
      case EventType::kFinish:
        backend_done(*n, e.node, e.id);
        break;
      case EventType::kRelease:
        finish(*n, e.id);
        break;
      case EventType::kPoll:
        poll(*n, e.node);
        break;
      case EventType::kProcess:
        if (n->beat && n->beat_token == e.id) {
          n->reply = coordinator().heartbeat(kKey, n->beat->report, n->beat->timeout);
          push(e.t + c_.one_way, EventType::kReply, e.node, e.id);
        }
        break;
      case EventType::kReply:
        if (n->beat && n->beat_token == e.id && n->reply && !partitioned(e.node, e.t)) {
          const FleetGuard::Beat b = *n->beat;
          const StatusOr<Grant> r = *n->reply;
          n->beat.reset();
          n->reply.reset();
          n->fleet->complete(b, r);
          after_guard_step(*n);
        }
        break;
      case EventType::kTimeout:
        if (n->beat && n->beat_token == e.id) {
          const FleetGuard::Beat b = *n->beat;
          n->beat.reset();
          n->reply.reset();
          n->fleet->complete(b, Status(StatusCode::kDeadlineExceeded, "partitioned"));
          after_guard_step(*n);
        }
        break;
      case EventType::kSample:
        sample();
        push(e.t + c_.sample_every, EventType::kSample, -1, 0);
        break;
    }
  }

  void arrive(Node& n, int node) {
    ++result_.arrivals;
    Call call{};
    if (!acquire(n, call)) {
      ++result_.rejected;
      return;
    }
    ++result_.admitted;
    ++in_flight_;
    const double load = static_cast<double>(in_flight_) / static_cast<double>(c_.capacity);
    const auto rtt =
        Nanos{std::llround(static_cast<double>(c_.base_latency.count()) * std::max(1.0, load))};
    // The caller gives up at its timeout; a backend that honours the deadline stops it there.
    Nanos end = std::min(rtt, c_.call_timeout);
    if (call.fleet && c_.honour_deadline)
      end = std::min(end, call.fleet->deadline() - clock_.now());
    call.start = clock_.now();
    call.timed_out = end < rtt;
    const std::uint64_t id = next_call_++;
    n.calls.emplace(id, std::move(call));
    push(clock_.now() + end, EventType::kFinish, node, id);
  }

  // The call ends in the backend; its node learns of it now, or when it thaws.
  void backend_done(Node& n, int node, std::uint64_t id) {
    const auto it = n.calls.find(id);
    if (it == n.calls.end() || !it->second.in_backend) return;  // aborted by a fence
    it->second.in_backend = false;
    --in_flight_;
    const Nanos at = frozen_until(node, clock_.now()).value_or(clock_.now());
    if (at == clock_.now()) {
      finish(n, id);
    } else {
      push(at, EventType::kRelease, node, id);
    }
  }

  void finish(Node& n, std::uint64_t id) {
    const auto it = n.calls.find(id);
    if (it == n.calls.end()) return;  // aborted by a fence
    Call& call = it->second;
    const Nanos rtt = clock_.now() - call.start;
    call.release(call.timed_out ? Outcome::kDropped : Outcome::kSuccess, rtt);
    if (clock_.now() >= c_.warmup) {
      if (call.timed_out) {
        ++result_.timeouts;
      } else {
        ++result_.completed;
        latency_sum_ns_ += static_cast<double>(rtt.count());
      }
    }
    n.calls.erase(it);
  }

  void poll(Node& n, int node) {
    if (std::optional<FleetGuard::Beat> b = n.fleet->poll(clock_.now())) {
      n.beat = *b;
      const std::uint64_t token = ++n.beat_token;
      if (!partitioned(node, clock_.now()))
        push(clock_.now() + c_.one_way, EventType::kProcess, node, token);
      push(clock_.now() + b->timeout, EventType::kTimeout, node, token);
    }
    after_guard_step(n);
    // Poll again when the guard asks, and at least every millisecond (drain checks).
    const Nanos next = std::min(n.fleet->next_due(), clock_.now() + milliseconds(1));
    push(std::max(next, clock_.now() + Nanos{1}), EventType::kPoll, node, 0);
  }

  void after_guard_step(Node& n) {
    if (!n.fence_hook_ran) return;
    n.fence_hook_ran = false;
    if (!c_.abort_on_fence) return;
    for (auto& [id, call] : n.calls) {
      call.release(Outcome::kIgnored, Nanos{0});
      if (call.in_backend) --in_flight_;
      ++result_.aborted;
    }
    n.calls.clear();
  }

  void sample() {
    Sample s;
    s.t = clock_.now();
    s.in_flight = in_flight_;
    if (c_.guard == GuardKind::kFleet) {
      if (const std::optional<FleetState> st = coordinator().state(kKey)) {
        s.l_global = st->ceiling;  // in force since the last heartbeat
        s.l_aggregate = aggregate_limit(*st, c_.coordinator.aggregate);
        for (const FleetNode& fn : st->nodes) s.shares += fn.share;
      }
    }
    const std::uint32_t live = live_nodes();
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      Node& n = nodes_[i];
      s.node_in_flight.push_back(static_cast<std::uint32_t>(std::count_if(
          n.calls.begin(), n.calls.end(), [](const auto& kv) { return kv.second.in_backend; })));
      if (n.fleet) {
        const FleetGuardStats st = n.fleet->stats();
        s.node_share.push_back(st.share);
        if (!n.fair_share_at && s.t >= n.join_at && s.l_global > 0 && live > 0 &&
            st.share >= s.l_global / live && st.phase == FleetPhase::kActive)
          n.fair_share_at = s.t - n.join_at;
        // An incumbent has noticed the last joiner once it enforces a grant counting it.
        if (!n.noticed_at && n.join_at < last_join_ && s.t >= last_join_ &&
            st.nodes >= static_cast<std::uint32_t>(c_.nodes))
          n.noticed_at = s.t;
      } else {
        s.node_share.push_back(n.local->stats().limit);
      }
    }
    result_.samples.push_back(std::move(s));
  }

  std::uint32_t live_nodes() const {
    std::uint32_t live = 0;
    for (const Node& n : nodes_)
      if (clock_.now() >= n.join_at) ++live;
    return live;
  }

  FleetSimResult summarize() {
    FleetSimResult& r = result_;
    double sum_c = 0, sum_l = 0;
    std::size_t count = 0, count_l = 0;
    const double cap = static_cast<double>(c_.capacity);
    for (const Sample& s : r.samples) {
      if (s.t < c_.warmup) continue;
      ++count;
      r.max_over_capacity = std::max(r.max_over_capacity, s.in_flight / cap);
      sum_c += s.in_flight / cap;
      if (s.l_global > 0) {
        const double over = static_cast<double>(s.in_flight) / s.l_global;
        r.max_over_l_global = std::max(r.max_over_l_global, over);
        if (s.in_flight > s.l_global) ++r.samples_over_l_global;
        if (s.l_aggregate < s.l_global) ++r.samples_draining;
        sum_l += over;
        ++count_l;
      }
    }
    if (count > 0) r.mean_over_capacity = sum_c / static_cast<double>(count);
    r.utilization = c_.guard == GuardKind::kFleet
                        ? (count_l > 0 ? sum_l / static_cast<double>(count_l) : 0)
                        : r.mean_over_capacity;
    const double seconds = std::chrono::duration<double>(c_.duration - c_.warmup).count();
    const double ideal = cap / std::chrono::duration<double>(c_.base_latency).count();
    r.goodput = seconds > 0 ? static_cast<double>(r.completed) / seconds / ideal : 0;
    r.mean_latency_ms =
        r.completed > 0 ? latency_sum_ns_ / static_cast<double>(r.completed) / 1e6 : 0;
    int incumbents = 0;
    bool all_noticed = true;
    Nanos noticed{0};
    for (Node& n : nodes_) {
      r.fair_share_at.push_back(n.fair_share_at);
      if (n.join_at < last_join_) {
        ++incumbents;
        all_noticed = all_noticed && n.noticed_at.has_value();
        if (n.noticed_at) noticed = std::max(noticed, *n.noticed_at - last_join_);
      }
      if (n.fleet) {
        const FleetGuardStats st = n.fleet->stats();
        r.heartbeats += st.heartbeats;
        r.off_cycle_beats += st.off_cycle_beats;
        r.fences += st.fences;
      }
    }
    if (incumbents > 0 && all_noticed) r.incumbents_noticed_after = noticed;
    // Calls still in flight at the end go back before the guards do.
    for (Node& n : nodes_) n.calls.clear();
    return r;
  }

  // The coordinator the heartbeats reach: the first, or the one that replaced it after a loss
  // without the rule.
  MemoryCoordinator& coordinator() { return forgetful_ ? *forgetful_ : memory_; }

  const FleetSimConfig& c_;
  ManualClock clock_;
  MemoryCoordinator memory_;  // the guards leave through it when they close
  std::optional<MemoryCoordinator> forgetful_;
  std::vector<Node> nodes_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t seq_ = 0;
  std::uint64_t next_call_ = 1;
  std::uint32_t in_flight_ = 0;
  double latency_sum_ns_ = 0;
  Nanos last_join_{0};
  FleetSimResult result_;
};

}  // namespace

std::string_view to_string(GuardKind k) noexcept {
  return k == GuardKind::kFleet ? "fleet" : "independent";
}

std::string_view to_string(AlgorithmKind k) noexcept {
  switch (k) {
    case AlgorithmKind::kFixed:
      return "fixed";
    case AlgorithmKind::kVegas:
      return "vegas";
    case AlgorithmKind::kGradient2:
      return "gradient2";
    case AlgorithmKind::kAimd:
      return "aimd";
  }
  return "unknown";
}

std::string FleetSimConfig::validate() const {
  if (nodes < 1 || nodes > 1000) return "nodes must be in 1..1000";
  if (capacity < 1) return "capacity must be >= 1";
  if (base_latency <= Nanos{0}) return "base_latency must be > 0";
  if (call_timeout < base_latency) return "call_timeout must be >= base_latency";
  if (!(load > 0) || load > 100) return "load must be in (0, 100]";
  if (!weights.empty() && weights.size() != static_cast<std::size_t>(nodes))
    return "weights must have one entry per node";
  for (double w : weights)
    if (!(w >= 0)) return "weights must be >= 0";
  if (!join_at.empty() && join_at.size() != static_cast<std::size_t>(nodes))
    return "join_at must have one entry per node";
  if (heartbeat <= Nanos{0}) return "heartbeat must be > 0";
  if (one_way < Nanos{0}) return "one_way must be >= 0";
  if (call_timeout_coordinator <= Nanos{0}) return "call_timeout_coordinator must be > 0";
  for (const Partition& p : partitions)
    if (p.node < 0 || p.node >= nodes || p.end < p.start)
      return "partitions: node out of range or end before start";
  for (const Freeze& f : freezes)
    if (f.node < 0 || f.node >= nodes || f.end < f.start)
      return "freezes: node out of range or end before start";
  if (call_deadline && *call_deadline <= Nanos{0}) return "call_deadline must be > 0";
  if (duration <= warmup) return "duration must be > warmup";
  if (sample_every <= Nanos{0}) return "sample_every must be > 0";
  return {};
}

FleetSimResult run_fleet_sim(const FleetSimConfig& config) { return Simulation(config).run(); }

namespace {
// Appends ",v" for each value, piece by piece: `"," + std::to_string(v)` trips g++ 12's bogus
// -Wrestrict at -O3 (GCC bug 105651).
template <typename... T>
void append_fields(std::string& out, const T&... values) {
  ((out += ',', out += std::to_string(values)), ...);
}
}  // namespace

std::string to_csv(const FleetSimResult& r) {
  std::string out = "t_ms,in_flight,l_global,shares";
  const std::size_t n = r.samples.empty() ? 0 : r.samples.front().node_in_flight.size();
  for (std::size_t i = 0; i < n; ++i) {
    out += ",in_flight_";
    out += std::to_string(i);
    out += ",share_";
    out += std::to_string(i);
  }
  out += "\n";
  char buf[64];
  for (const Sample& s : r.samples) {
    std::snprintf(buf, sizeof buf, "%.3f", std::chrono::duration<double, std::milli>(s.t).count());
    out += buf;
    append_fields(out, s.in_flight, s.l_global, s.shares);
    for (std::size_t i = 0; i < n; ++i) append_fields(out, s.node_in_flight[i], s.node_share[i]);
    out += "\n";
  }
  return out;
}

std::string number(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string svg_plot(const std::string& title, const std::string& y_label,
                     const std::vector<PlotSeries>& series, const std::string& x_label) {
  constexpr double kW = 1180, kH = 400, kL = 70, kR = 480, kT = 40, kB = 50;
  double x_min = 1e300, x_max = -1e300, y_max = 0;
  for (const PlotSeries& s : series)
    for (const auto& [x, y] : s.points) {
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
    }
  if (x_max <= x_min) {
    x_min = 0;
    x_max = 1;
  }
  y_max = y_max <= 0 ? 1 : y_max * 1.1;
  auto px = [&](double x) { return kL + (x - x_min) / (x_max - x_min) * (kW - kL - kR); };
  auto py = [&](double y) { return kH - kB - y / y_max * (kH - kT - kB); };
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                kW, kH);
  out += buf;
  out += "<text x=\"" + std::to_string(static_cast<int>(kW / 2)) +
         "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + title + "</text>\n";
  for (int i = 0; i <= 5; ++i) {
    const double yv = y_max * i / 5, xv = x_min + (x_max - x_min) * i / 5;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.*f</text>\n",
                  kL, py(yv), kW - kR, py(yv), kL - 6, py(yv) + 4, y_max < 10 ? 2 : 0, yv);
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.*f</text>\n", px(xv),
                  kH - kB + 18, x_max - x_min < 2 ? 2 : 1, xv);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                (kL + kW - kR) / 2, kH - 12);
  out += buf;
  out += x_label + "</text>\n";
  std::snprintf(buf, sizeof buf,
                "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" "
                "transform=\"rotate(-90 16 %.1f)\">",
                kH / 2, kH / 2);
  out += buf;
  out += y_label + "</text>\n";
  int row = 0;
  for (const PlotSeries& s : series) {
    out += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.3\"" +
           (s.dashed ? " stroke-dasharray=\"6 4\"" : "") + " points=\"";
    for (const auto& [x, y] : s.points) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y));
      out += buf;
    }
    out += "\"/>\n";
    const double ly = kT + 10 + 18 * row++;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                  "stroke-width=\"2\"%s/><text x=\"%.1f\" y=\"%.1f\">",
                  kW - kR + 12, ly, kW - kR + 36, ly, s.color.c_str(),
                  s.dashed ? " stroke-dasharray=\"6 4\"" : "", kW - kR + 42, ly + 4);
    out += buf;
    out += s.label + "</text>\n";
  }
  out += "</svg>\n";
  return out;
}

}  // namespace sluice::sim
