// Exhaustive state-space search of the fleet guard protocol (the "BFS twin" of
// src/core/fleet.cpp): the coordinator is the real sluice::heartbeat / sluice::leave; the
// guards and the network between them are modelled here.
//
// Up to 3 nodes ("a", "b", "c") share one key; every node reports l_local = L (constant
// L_global), so a guard's gate min(share, L_local) is its share. A node is fresh (not joined),
// running or stopped, and holds in_flight calls, the share it enforces and the generation of the
// grant it enforces (echoed as acked_generation in its next report, read together with its
// in_flight). Actions, in every interleaving:
//   heartbeat  a fresh node's first heartbeat is its join;
//   acquire    iff in_flight < enforced share;   release  iff in_flight > 0;
//   leave      graceful, only with in_flight == 0: sluice::leave, the node stops;
//   crash      the node stops, its in-flight calls vanish, its record stays in the coordinator;
//   expire     a stopped node's record is removed (the lease expiry; modelled with sluice::leave:
//              the core runs with now = 0 and a huge lease_ttl so it never evicts by itself);
//   estimate   (moving-limit configurations only) a running node's L_local moves between L and
//              a lower value: the aggregate, hence the target, falls and rises under held
//              calls, and L_global in force (FleetState::ceiling) must follow without ever
//              falling below what the fleet holds.
//   lose       (loss configurations only; a coordinator action) the coordinator loses its whole
//              FleetState (a Redis restarted from a snapshot without its last writes): every
//              record, the generation and the ceiling; the nodes keep their calls and grants.
//              It runs the core with lost_at = now until
//   recover    the lease_ttl since the loss has passed: every grant from before the loss has run
//              out (a node still enforcing one, or receiving one late, admits nothing on it), and
//              every call admitted on such a grant has ended by its deadline (the guard's
//              call_deadline + heartbeat + fence_safety_margin < lease_ttl); since the loss the
//              core granted share 0, so those are all the calls in flight.
// With a twin, node "a'" reports under node a's id as another member (another server given the
// same server.node_id): every report carries its member's instance, the coordinator refuses one
// whose id a live record of another member holds (sluice::clash: the node enforces share 0),
// and a leave by another member leaves the record alone.
// In the synchronous model a heartbeat is one atomic step (report, core, the node applies the
// grant). In the asynchronous model it is three: send (the report is snapshotted into a transit
// slot; at most one heartbeat outstanding per node), process (the core runs on the snapshot:
// the node's in-flight may have changed since) and deliver (the node applies share and
// generation); anything else may interleave between them. A report still in transit when its
// node stops is processed all the same (it may re-create a record that only expiry removes); a
// grant still in transit to a stopped node is lost.
//
// Finite space without bounding the heartbeats: generations only ever meet the core through
// order comparisons (acked < issued, max) and "next = max issued + 1", and the guard never
// compares them, so after every step all the generations the state mentions (the key's counter,
// the records' acks and unacknowledged grants, the nodes' enforced generations, the ones in
// transit) are renumbered 1..k in order (0, "none", stays 0). The renumbered state behaves exactly
// like the original (a bisimulation), so the search covers unboundedly many heartbeats. Shares
// and in-flight counts are bounded by L, the other fields by the protocol (checked).
//
// Invariants, in every reachable state (L_global: L, or with a moving limit the ceiling in force
// the core last published):
//   GlobalCap    the shares of the records in the coordinator's FleetState sum to <= L_global;
//   InflightCap  the nodes' in-flight calls sum to <= L_global (synchronous model; asynchronous
//                model with acknowledged handoff). Without handoff the asynchronous fleet has a
//                bounded residual: the search measures the largest sum of in-flight calls instead.
// Deliberately broken cores must be caught: a stateless floor(L/N) split without the cap,
// (moving limit) a ceiling that drops with the aggregate at once, and (twin) a coordinator that
// lets another member's report take over a live record, and (loss) a core that grants as usual
// right after a loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "sluice/core/fleet.h"
#include "state_space.h"

namespace sluice {
namespace {

using sluice::model::StateSpace;

constexpr int kMaxNodes = 3;
constexpr int kMaxUnacked = 3;
constexpr std::array<std::string_view, kMaxNodes> kIds = {"a", "b", "c"};
constexpr Nanos kNow{0};
constexpr Nanos kLeaseTtl = std::chrono::hours(24 * 365);  // the core never evicts by itself

enum class Core { kReal, kStatelessSplit, kCeilingIsTheAggregate, kNoClashCheck, kNoLossRule };

struct Config {
  int nodes = 2;
  std::uint32_t limit = 2;  // every node's l_local, hence L_global
  bool async = false;
  CoordinatorConfig coordinator;
  Core core = Core::kReal;
  bool inflight_cap = true;  // check InflightCap in every state
  std::uint32_t low = 0;     // > 0: a node's L_local moves between limit and low
  bool twin = false;         // node 1 is "a'": it reports under node a's id
  bool loss = false;         // the coordinator may lose its state (lose, recover)
};

enum Phase : std::uint8_t { kFresh, kRunning, kStopped };

// The coordinator's FleetNode for one node, minus its constants (l_local = L, expires_at).
struct Record {
  std::uint8_t present;
  std::uint8_t owner;  // the member that wrote it: node index + 1 (its instance)
  std::uint8_t low;    // its L_local is the low value (moving limit)
  std::uint8_t in_flight;
  std::uint8_t share;
  std::uint8_t acked;
  std::uint8_t unacked;  // entries used below, oldest first
  std::array<std::uint8_t, kMaxUnacked> unacked_gen;
  std::array<std::uint8_t, kMaxUnacked> unacked_share;
};

struct Node {
  std::uint8_t phase;
  std::uint8_t low;  // its L_local is the low value (moving limit)
  std::uint8_t report_low;
  std::uint8_t in_flight;
  std::uint8_t share;   // the share it enforces
  std::uint8_t gen;     // the generation of the grant it enforces
  std::uint8_t report;  // 1: a report is in transit (asynchronous model)
  std::uint8_t report_in_flight;
  std::uint8_t report_gen;
  std::uint8_t grant;  // 1: a grant reply is in transit (asynchronous model)
  std::uint8_t grant_share;
  std::uint8_t grant_gen;
  std::uint8_t stale;        // it enforces a grant issued before the coordinator's last loss
  std::uint8_t grant_stale;  // the grant in transit was issued before that loss
};

struct State {
  std::array<Record, kMaxNodes> rec;
  std::array<Node, kMaxNodes> node;
  std::uint8_t generation;  // the key's last issued generation
  std::uint8_t ceiling;     // L_global in force (moving limit; 0 with a constant one)
  std::uint8_t lost;        // 1: within lease_ttl of a loss of the coordinator's state
};
static_assert(std::is_trivially_copyable_v<State>);
static_assert(std::has_unique_object_representations_v<State>);  // compared and hashed as bytes

enum Action : std::uint8_t {
  kHeartbeat,  // synchronous model
  kSend,       // asynchronous model: send, process, deliver
  kProcess,
  kDeliver,
  kAcquire,
  kRelease,
  kLeave,
  kCrash,
  kExpire,
  kEstimate,
  kLose,
  kRecover,
  kActions,
};
constexpr std::array<const char*, kActions> kActionNames = {
    "heartbeat", "send",  "process", "deliver",  "acquire", "release",
    "leave",     "crash", "expire",  "estimate", "lose",    "recover"};

// The broken core: upsert the reporter, then a stateless floor(L/N) split (+1 for the first
// L mod N ids), no cap, no reserve.
Grant stateless_split(FleetState& state, const NodeReport& report) {
  auto it = std::lower_bound(state.nodes.begin(), state.nodes.end(), report.node_id,
                             [](const FleetNode& n, const std::string& key) { return n.id < key; });
  if (it == state.nodes.end() || it->id != report.node_id) {
    it = state.nodes.insert(it, FleetNode{});
    it->id = report.node_id;
  }
  it->instance = report.instance;
  it->l_local = report.l_local;
  it->in_flight = report.in_flight;
  it->expires_at = kNow + report.lease_ttl;
  const auto count = static_cast<std::uint32_t>(state.nodes.size());
  const auto rank = static_cast<std::uint32_t>(it - state.nodes.begin());
  it->share = report.l_local / count + (rank < report.l_local % count ? 1 : 0);
  ++state.generation;
  return Grant{it->share, report.l_local, report.l_local, count, state.generation};
}

struct Result {
  std::size_t states = 0;
  std::string violation;  // empty: every invariant held in every state
  std::string trace;      // the actions leading to the violation (or to the largest in-flight)
  std::uint32_t max_in_flight = 0;  // the largest sum of in-flight calls reached
  std::uint32_t max_shares = 0;     // the largest sum of the coordinator's shares reached
  bool all_busy = false;            // some state has every node holding a call at once
};

class Explorer {
 public:
  explicit Explorer(Config c) : c_(c) {}

  Result run() {
    State init;
    std::memset(static_cast<void*>(&init), 0, sizeof(init));
    for (int i = c_.nodes; i < kMaxNodes; ++i) init.node[i].phase = kStopped;
    Result r;
    std::size_t max_in_flight_at = 0;
    space_.add(init);
    for (std::size_t at = 0; at < space_.size(); ++at) {
      const State s = space_[at].state;
      ++r.states;
      std::uint32_t shares = 0, in_flight = 0;
      bool busy = true;
      for (const Record& rec : s.rec)
        if (rec.present) shares += rec.share;
      for (int i = 0; i < c_.nodes; ++i) {
        in_flight += s.node[i].in_flight;
        busy = busy && s.node[i].in_flight > 0;
      }
      r.max_shares = std::max(r.max_shares, shares);
      if (in_flight > r.max_in_flight) {
        r.max_in_flight = in_flight;
        max_in_flight_at = at;
      }
      r.all_busy = r.all_busy || busy;
      const std::uint32_t ceiling = c_.low > 0 ? s.ceiling : c_.limit;
      if (shares > ceiling)
        r.violation = "GlobalCap: shares sum to " + std::to_string(shares) + " > L_global " +
                      std::to_string(ceiling);
      else if (c_.inflight_cap && in_flight > ceiling)
        r.violation = "InflightCap: in-flight calls sum to " + std::to_string(in_flight) +
                      " > L_global " + std::to_string(ceiling);
      if (!r.violation.empty()) {
        r.trace = trace_to(at);
        return r;
      }
      for (int i = 0; i < c_.nodes; ++i) {
        for (std::uint8_t a = 0; a < kActions; ++a) {
          State n = s;
          if (!step(n, i, static_cast<Action>(a))) continue;
          if (!harness_error_.empty()) {
            r.violation = "Harness: " + harness_error_;
            r.trace = trace_to(at);
            return r;
          }
          space_.add(n, at, a, static_cast<std::uint8_t>(i));
        }
      }
    }
    r.trace = trace_to(max_in_flight_at);
    return r;
  }

 private:
  // The state's records as the core's FleetState, in a scratch one whose vectors and strings
  // are reused (the search calls this for most steps).
  FleetState& to_fleet(const State& s) {
    FleetState& f = scratch_;
    f.generation = s.generation;
    // A constant limit keeps the ceiling at L whatever was stored: the state leaves it out.
    f.ceiling = c_.low > 0 ? s.ceiling : c_.limit;
    std::size_t count = 0;
    for (int i = 0; i < kMaxNodes; ++i) {
      const Record& r = s.rec[i];
      if (!r.present) continue;
      if (count == f.nodes.size()) f.nodes.emplace_back();
      FleetNode& n = f.nodes[count++];
      n.id.assign(kIds[i]);
      n.l_local = r.low ? c_.low : c_.limit;
      n.estimated = true;
      n.in_flight = r.in_flight;
      n.share = r.share;
      n.expires_at = kNow + kLeaseTtl;
      n.acked_generation = r.acked;
      n.unacked.clear();
      for (int k = 0; k < r.unacked; ++k)
        n.unacked.push_back({r.unacked_gen[k], r.unacked_share[k]});
      n.instance = r.owner;
    }
    f.nodes.resize(count);
    return f;
  }

  void from_fleet(const FleetState& f, State& s) {
    auto small = [&](std::uint64_t v, const char* what) {
      if (v > 250 && harness_error_.empty()) harness_error_ = std::string(what) + " out of range";
      return static_cast<std::uint8_t>(v);
    };
    for (Record& r : s.rec) std::memset(static_cast<void*>(&r), 0, sizeof(r));
    s.generation = small(f.generation, "generation");
    s.ceiling = c_.low > 0 ? small(f.ceiling, "ceiling") : 0;
    for (const FleetNode& n : f.nodes) {
      const auto i = std::find(kIds.begin(), kIds.end(), n.id) - kIds.begin();
      if (i == kMaxNodes || (n.l_local != c_.limit && (c_.low == 0 || n.l_local != c_.low)) ||
          n.expires_at != kNow + kLeaseTtl || n.unacked.size() > kMaxUnacked) {
        harness_error_ = "unexpected record for node '" + n.id + "' (" +
                         std::to_string(n.unacked.size()) + " unacknowledged grants)";
        return;
      }
      Record& r = s.rec[i];
      r.present = 1;
      r.owner = small(n.instance, "instance");
      r.low = n.l_local != c_.limit ? 1 : 0;
      r.in_flight = small(n.in_flight, "in_flight");
      r.share = small(n.share, "share");
      r.acked = small(n.acked_generation, "acked_generation");
      r.unacked = static_cast<std::uint8_t>(n.unacked.size());
      for (std::size_t k = 0; k < n.unacked.size(); ++k) {
        r.unacked_gen[k] = small(n.unacked[k].generation, "generation");
        r.unacked_share[k] = small(n.unacked[k].share, "share");
      }
    }
  }

  // The record node i reports under (a twin's is a's).
  int id_of(int i) const { return c_.twin && i == 1 ? 0 : i; }
  std::string name_of(int i) const { return c_.twin && i == 1 ? "a'" : std::string(kIds[i]); }

  // The coordinator handles node i's report; the state's records follow the core's FleetState.
  // Nothing when the coordinator refuses it (another member's live record holds the id).
  std::optional<Grant> coordinate(State& s, int i, std::uint8_t in_flight, std::uint8_t acked,
                                  std::uint8_t low) {
    FleetState& f = to_fleet(s);
    // The broken ceiling: L_global drops with the aggregate at once (no memory of the last).
    if (c_.core == Core::kCeilingIsTheAggregate) f.ceiling = 0;
    NodeReport report;
    report.node_id = std::string(kIds[id_of(i)]);
    report.instance = static_cast<std::uint64_t>(i) + 1;
    report.l_local = low ? c_.low : c_.limit;
    report.in_flight = in_flight;
    report.acked_generation = acked;
    report.lease_ttl = kLeaseTtl;
    if (c_.core != Core::kNoClashCheck && !clash(f, report, kNow).empty()) return std::nullopt;
    // Within lease_ttl of a loss the core is told when it found it (now, in this timeless model).
    const Nanos lost_at = s.lost && c_.core != Core::kNoLossRule ? kNow : kNeverLost;
    const Grant g = c_.core == Core::kStatelessSplit
                        ? stateless_split(f, report)
                        : heartbeat(f, report, kNow, c_.coordinator, lost_at);
    if (g.recovering != (s.lost && c_.core != Core::kNoLossRule) || (g.recovering && g.share != 0))
      harness_error_ = "a grant within lease_ttl of a loss is not share 0, recovering";
    from_fleet(f, s);
    if (g.share > c_.limit || g.generation > 250) harness_error_ = "grant out of range";
    return g;
  }

  // Node i leaves (or its record expires): the core removes the record of its id if it wrote it.
  void remove_record(State& s, int i) {
    FleetState& f = to_fleet(s);
    const Record& r = s.rec[id_of(i)];
    const bool own = r.present && r.owner == i + 1;
    if (leave(f, kIds[id_of(i)], static_cast<std::uint64_t>(i) + 1) != own)
      harness_error_ = own ? "leave found no record" : "leave took another member's record";
    from_fleet(f, s);
  }

  // The node stops: it never acts again, holds nothing, and a grant in transit to it is lost.
  // A report it sent may still reach the coordinator.
  static void stop(Node& n) {
    n.phase = kStopped;
    n.in_flight = n.share = n.gen = n.low = 0;
    n.grant = n.grant_share = n.grant_gen = 0;
    n.stale = n.grant_stale = 0;
  }

  // Order-preserving renumbering of every generation in the state to 1..k (see the top).
  static void normalise(State& s) {
    std::array<std::uint8_t, 256> rank{};
    std::uint8_t top = 0;  // the largest generation marked: the ranks are counted up to it only
    auto mark = [&](std::uint8_t g) {
      if (g == 0) return;
      rank[g] = 1;
      top = std::max(top, g);
    };
    mark(s.generation);
    for (const Record& r : s.rec) {
      mark(r.acked);
      for (int k = 0; k < r.unacked; ++k) mark(r.unacked_gen[k]);
    }
    for (const Node& n : s.node) {
      mark(n.gen);
      mark(n.report_gen);
      mark(n.grant_gen);
    }
    std::uint8_t next = 0;
    for (int g = 1; g <= top; ++g)
      if (rank[g] != 0) rank[g] = ++next;
    s.generation = rank[s.generation];
    for (Record& r : s.rec) {
      r.acked = rank[r.acked];
      for (int k = 0; k < r.unacked; ++k) r.unacked_gen[k] = rank[r.unacked_gen[k]];
    }
    for (Node& n : s.node) {
      n.gen = rank[n.gen];
      n.report_gen = rank[n.report_gen];
      n.grant_gen = rank[n.grant_gen];
    }
  }

  // One atomic step of node i; false if the action is not enabled.
  bool step(State& s, int i, Action a) {
    Node& n = s.node[i];
    const bool live = n.phase != kStopped;
    switch (a) {
      case kHeartbeat: {
        if (c_.async || !live) return false;
        const std::optional<Grant> g = coordinate(s, i, n.in_flight, n.gen, n.low);
        n.phase = kRunning;
        n.share = g ? static_cast<std::uint8_t>(g->share) : 0;  // refused: admits nothing
        if (g) n.gen = static_cast<std::uint8_t>(g->generation);
        n.stale = 0;
        break;
      }
      case kSend:
        if (!c_.async || !live || n.report || n.grant) return false;
        n.phase = kRunning;
        n.report = 1;
        n.report_in_flight = n.in_flight;
        n.report_gen = n.gen;
        n.report_low = n.low;
        break;
      case kProcess: {
        if (!n.report) return false;
        const std::optional<Grant> g =
            coordinate(s, i, n.report_in_flight, n.report_gen, n.report_low);
        n.report = n.report_in_flight = n.report_gen = n.report_low = 0;
        if (n.phase != kStopped) {  // a refusal comes back as share 0 under the same generation
          n.grant = 1;
          n.grant_share = g ? static_cast<std::uint8_t>(g->share) : 0;
          n.grant_gen = g ? static_cast<std::uint8_t>(g->generation) : n.gen;
          n.grant_stale = 0;
        }
        break;
      }
      case kDeliver:
        if (!n.grant) return false;
        n.share = n.grant_share;
        n.gen = n.grant_gen;
        n.stale = n.grant_stale;
        n.grant = n.grant_share = n.grant_gen = n.grant_stale = 0;
        break;
      case kAcquire:  // the gate min(share, L_local)
        if (n.phase != kRunning || n.in_flight >= n.share) return false;
        if (c_.low > 0 && n.low && n.in_flight >= c_.low) return false;
        ++n.in_flight;
        break;
      case kEstimate:
        if (c_.low == 0 || n.phase != kRunning) return false;
        n.low = n.low ? 0 : 1;
        break;
      case kRelease:
        if (n.in_flight == 0) return false;
        --n.in_flight;
        break;
      case kLeave:
        if (n.phase != kRunning || n.in_flight != 0) return false;
        // With a report still in transit the record may be absent (first report) or re-created
        // later; leave is idempotent for the guard.
        if (s.rec[id_of(i)].present) remove_record(s, i);
        stop(n);
        break;
      case kCrash:
        if (n.phase != kRunning) return false;
        stop(n);
        break;
      case kExpire:
        if (n.phase != kStopped || !s.rec[id_of(i)].present || s.rec[id_of(i)].owner != i + 1)
          return false;
        remove_record(s, i);
        break;
      case kLose:  // the coordinator's, taken by node 0's slot only (one action, not one per node)
        if (!c_.loss || i != 0) return false;
        for (Record& r : s.rec) std::memset(static_cast<void*>(&r), 0, sizeof(r));
        s.generation = s.ceiling = 0;
        s.lost = 1;
        for (Node& m : s.node) {
          if (m.phase == kRunning) m.stale = 1;
          if (m.grant) m.grant_stale = 1;
        }
        break;
      case kRecover:  // lease_ttl has passed since the loss
        if (!s.lost || i != 0) return false;
        s.lost = 0;
        for (Node& m : s.node) {
          // Every grant from before the loss has run out, and every call admitted on one has
          // ended by its deadline: call_deadline + heartbeat + fence_safety_margin < lease_ttl.
          // Since the loss every grant was share 0, so no call in flight is younger.
          m.in_flight = 0;
          if (m.stale) m.share = 0;
          if (m.grant_stale) m.grant_share = 0;
          m.stale = m.grant_stale = 0;
        }
        break;
      default:
        return false;
    }
    normalise(s);
    return true;
  }

  std::string describe(const State& s) const {
    std::string out;
    std::uint32_t in_flight = 0, shares = 0;
    for (int i = 0; i < c_.nodes; ++i) {
      const Node& n = s.node[i];
      in_flight += n.in_flight;
      out += name_of(i) + "[" +
             (n.phase == kFresh     ? "fresh"
              : n.phase == kRunning ? "run"
                                    : "stop") +
             " if=" + std::to_string(n.in_flight) + " sh=" + std::to_string(n.share) +
             " g=" + std::to_string(n.gen);
      if (n.low) out += " L_local=" + std::to_string(c_.low);
      if (n.stale) out += " pre-loss";
      if (n.report)
        out += " report(if=" + std::to_string(n.report_in_flight) +
               ",ack=" + std::to_string(n.report_gen) + ")";
      if (n.grant)
        out += " grant(sh=" + std::to_string(n.grant_share) + ",g=" + std::to_string(n.grant_gen) +
               ")";
      out += "] ";
    }
    out += "| coord";
    for (int i = 0; i < kMaxNodes; ++i) {
      const Record& r = s.rec[i];
      if (!r.present) continue;
      shares += r.share;
      out += " " + std::string(kIds[i]) + "{by=" + (r.owner == 0 ? "?" : name_of(r.owner - 1)) +
             " if=" + std::to_string(r.in_flight) + " sh=" + std::to_string(r.share) +
             " ack=" + std::to_string(r.acked);
      if (r.unacked != 0) {
        out += " unacked=";
        for (int k = 0; k < r.unacked; ++k)
          out += (k ? "," : "") + std::to_string(r.unacked_gen[k]) + ":" +
                 std::to_string(r.unacked_share[k]);
      }
      out += "}";
    }
    if (c_.low > 0) out += " L_global=" + std::to_string(s.ceiling);
    if (s.lost) out += " (recovering)";
    return out + " | sum sh=" + std::to_string(shares) + " if=" + std::to_string(in_flight);
  }

  // The actions from the initial state to the state at `at`, each with the state it leads to.
  std::string trace_to(std::size_t at) const {
    return space_.trace(at, [&](const auto& e) {
      return name_of(e.actor) + "." + kActionNames[e.action] + "  ->  " + describe(e.state);
    });
  }

  Config c_;
  StateSpace<State> space_;
  FleetState scratch_;  // to_fleet()'s
  std::string harness_error_;
};

Result explore(const Config& c) {
  const auto start = std::chrono::steady_clock::now();
  Result r = Explorer(c).run();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[model] %s nodes=%d%s%s L=%u%s %s handoff=%d core=%s: %zu states, max sum(in_flight)=%u, "
      "max sum(shares)=%u, %.0f ms%s\n",
      c.async ? "async" : "sync", c.nodes, c.twin ? " (b is a twin of a)" : "",
      c.loss ? " (the coordinator may lose its state)" : "", c.limit,
      c.low > 0 ? (" (L_local moving to " + std::to_string(c.low) + ")").c_str() : "",
      std::string(to_string(c.coordinator.allocation)).c_str(),
      c.coordinator.acknowledged_handoff ? 1 : 0,
      c.core == Core::kReal             ? "real"
      : c.core == Core::kStatelessSplit ? "stateless-split"
      : c.core == Core::kNoClashCheck   ? "no-clash-check"
      : c.core == Core::kNoLossRule     ? "no-loss-rule"
                                        : "ceiling-is-the-aggregate",
      r.states, r.max_in_flight, r.max_shares, ms,
      r.violation.empty() ? "" : (" -> " + r.violation).c_str());
  return r;
}

struct Size {
  int nodes;
  std::uint32_t limit;
};

// The synchronous sizes: 2 and 3 nodes, L from below N up to 4.
constexpr std::array<Size, 4> kSyncSizes = {Size{2, 2}, Size{2, 4}, Size{3, 2}, Size{3, 3}};

Config make(Size size, bool async, Allocation allocation, bool handoff) {
  Config c;
  c.nodes = size.nodes;
  c.limit = size.limit;
  c.async = async;
  c.coordinator.aggregate = Aggregate::kMedian;
  c.coordinator.allocation = allocation;
  c.coordinator.acknowledged_handoff = handoff;
  return c;
}

constexpr std::array<Allocation, 2> kAllocations = {Allocation::kEqualSplit,
                                                    Allocation::kDemandProportional};

TEST(FleetModel, SyncGlobalAndInflightCap) {
  for (const Size size : kSyncSizes)
    for (const Allocation allocation : kAllocations)
      for (const bool handoff : {false, true}) {
        const Result r = explore(make(size, false, allocation, handoff));
        EXPECT_EQ(r.violation, "") << r.trace;
        EXPECT_GT(r.states, 500u);
        // The caps are tight: the fleet can use the whole budget, every node at once.
        EXPECT_EQ(r.max_shares, size.limit);
        EXPECT_EQ(r.max_in_flight, size.limit);
        EXPECT_TRUE(r.all_busy || size.limit < static_cast<std::uint32_t>(size.nodes));
      }
}

void check_async_handoff(Size size) {
  for (const Allocation allocation : kAllocations) {
    const Result r = explore(make(size, true, allocation, true));
    EXPECT_EQ(r.violation, "") << r.trace;
    EXPECT_GT(r.states, 10'000u);
    EXPECT_EQ(r.max_shares, size.limit);
    EXPECT_EQ(r.max_in_flight, size.limit);
    EXPECT_TRUE(r.all_busy || size.limit < static_cast<std::uint32_t>(size.nodes));
  }
}

void check_async_residual(Size size) {
  for (const Allocation allocation : kAllocations) {
    Config c = make(size, true, allocation, false);
    c.inflight_cap = false;  // the document's bounded residual: measured, not asserted
    const Result r = explore(c);
    EXPECT_EQ(r.violation, "") << r.trace;  // GlobalCap still holds in every state
    EXPECT_GT(r.states, 10'000u);
    EXPECT_EQ(r.max_shares, size.limit);
    std::printf("[model]   residual: max sum(in_flight) = %u for L = %u (%.2fx)\n", r.max_in_flight,
                size.limit, static_cast<double>(r.max_in_flight) / size.limit);
    EXPECT_GT(r.max_in_flight, size.limit) << "no residual: the asynchronous model is vacuous";
    EXPECT_LE(r.max_in_flight, 2 * size.limit) << r.trace;
  }
}

// Two nodes, L = 2 and 3, in one test; three nodes (about five million states each, half a
// minute) in their own tests so that ctest runs them side by side.
TEST(FleetModel, AsyncHandoffKeepsInflightCap) {
  for (const Size size : {Size{2, 2}, Size{2, 3}}) check_async_handoff(size);
}
TEST(FleetModel, AsyncHandoffKeepsInflightCapThreeNodes) { check_async_handoff(Size{3, 2}); }

TEST(FleetModel, AsyncWithoutHandoffResidualIsBounded) {
  for (const Size size : {Size{2, 2}, Size{2, 3}}) check_async_residual(size);
}
TEST(FleetModel, AsyncWithoutHandoffResidualIsBoundedThreeNodes) {
  check_async_residual(Size{3, 2});
}

// L_local moving between L and 1 under held calls (a backend that slows down and recovers, a
// joiner whose estimate is low): the aggregate falls while calls are held, and L_global in
// force still bounds the shares and the calls in flight in every interleaving.
TEST(FleetModel, MovingLimitKeepsEveryCallUnderTheCeilingInForce) {
  for (const Size size : {Size{2, 2}, Size{2, 3}, Size{3, 2}}) {
    for (const Allocation allocation : kAllocations) {
      Config c = make(size, false, allocation, false);
      c.low = 1;
      const Result r = explore(c);
      EXPECT_EQ(r.violation, "") << r.trace;
      EXPECT_EQ(r.max_in_flight, size.limit);
    }
  }
  for (const Size size : {Size{2, 2}, Size{2, 3}}) {
    for (const Allocation allocation : kAllocations) {
      Config c = make(size, true, allocation, true);
      c.low = 1;
      const Result r = explore(c);
      EXPECT_EQ(r.violation, "") << r.trace;
      EXPECT_GT(r.states, 10'000u);
      EXPECT_EQ(r.max_in_flight, size.limit);
    }
  }
}

// The same search with a ceiling that follows the aggregate down at once (the rule before the
// ceiling in force): calls admitted under the higher limit are over the new one.
TEST(FleetModel, ACeilingThatDropsWithTheAggregateIsCaught) {
  for (const bool async : {false, true}) {
    Config c = make(Size{2, 2}, async, Allocation::kEqualSplit, async);
    c.low = 1;
    c.core = Core::kCeilingIsTheAggregate;
    const Result r = explore(c);
    // Synchronously the shares already exceed the fallen ceiling; asynchronously the calls do.
    EXPECT_TRUE(r.violation.rfind("GlobalCap", 0) == 0 || r.violation.rfind("InflightCap", 0) == 0)
        << r.violation;
    std::printf("[model]   counterexample:\n%s", r.trace.c_str());
  }
}

TEST(FleetModel, BrokenStatelessSplitIsCaught) {
  for (const bool async : {false, true})
    for (const Size size : {Size{2, 2}, Size{3, 3}}) {
      Config c = make(size, async, Allocation::kEqualSplit, false);
      c.core = Core::kStatelessSplit;
      c.inflight_cap = false;  // GlobalCap alone must catch it
      const Result r = explore(c);
      EXPECT_EQ(r.violation.rfind("GlobalCap", 0), 0u) << r.violation;
      std::printf("[model]   counterexample:\n%s", r.trace.c_str());
    }
}

// Two members under one node id (a config copied to every host): while one member's record
// lives, the other's reports are refused and it admits nothing, so the fleet stays under
// L_global in every interleaving; it joins once the first leaves or its record expires.
TEST(FleetModel, ATwinUnderOneNodeIdIsRefusedWhileTheRecordLives) {
  for (const Size size : {Size{2, 2}, Size{3, 2}, Size{3, 3}})
    for (const bool handoff : {false, true}) {
      Config c = make(size, false, Allocation::kEqualSplit, handoff);
      c.twin = true;
      const Result r = explore(c);
      EXPECT_EQ(r.violation, "") << r.trace;
      EXPECT_EQ(r.max_in_flight, size.limit);
    }
  for (const Size size : {Size{2, 2}, Size{2, 3}}) {
    Config c = make(size, true, Allocation::kEqualSplit, true);
    c.twin = true;
    const Result r = explore(c);
    EXPECT_EQ(r.violation, "") << r.trace;
    EXPECT_GT(r.states, 1'000u);
    EXPECT_EQ(r.max_in_flight, size.limit);
  }
}

// The same with a coordinator that does not check the instance: the twin's report takes the
// live record over, and both members admit on a share of their own.
TEST(FleetModel, ACoordinatorThatLetsATwinTakeALiveRecordIsCaught) {
  for (const bool async : {false, true}) {
    Config c = make(Size{2, 2}, async, Allocation::kEqualSplit, async);
    c.twin = true;
    c.core = Core::kNoClashCheck;
    const Result r = explore(c);
    EXPECT_EQ(r.violation.rfind("InflightCap", 0), 0u) << r.violation;
    std::printf("[model]   counterexample:\n%s", r.trace.c_str());
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// The coordinator loses its whole state, any number of times, between any two steps: with the
// loss rule (share 0 for lease_ttl after the loss), the shares and the calls in flight stay
// under L_global in every interleaving, synchronous and asynchronous with handoff.
TEST(FleetModel, ACoordinatorThatLosesItsStateGrantsNothingUntilTheFleetIsKnownAgain) {
  for (const Size size : {Size{2, 2}, Size{3, 2}, Size{3, 3}})
    for (const Allocation allocation : kAllocations) {
      Config c = make(size, false, allocation, false);
      c.loss = true;
      const Result r = explore(c);
      EXPECT_EQ(r.violation, "") << r.trace;
      EXPECT_EQ(r.max_in_flight, size.limit);
    }
  for (const Size size : {Size{2, 2}, Size{2, 3}}) {
    Config c = make(size, true, Allocation::kEqualSplit, true);
    c.loss = true;
    const Result r = explore(c);
    EXPECT_EQ(r.violation, "") << r.trace;
    EXPECT_GT(r.states, 10'000u);
    EXPECT_EQ(r.max_in_flight, size.limit);
  }
}

// The same with a core that grants as usual right after a loss: the first node to beat takes
// the whole budget while the others still hold their calls.
TEST(FleetModel, ACoordinatorThatGrantsRightAfterALossIsCaught) {
  for (const bool async : {false, true}) {
    Config c = make(Size{2, 2}, async, Allocation::kEqualSplit, async);
    c.loss = true;
    c.core = Core::kNoLossRule;
    const Result r = explore(c);
    EXPECT_EQ(r.violation.rfind("InflightCap", 0), 0u) << r.violation;
    std::printf("[model]   counterexample:\n%s", r.trace.c_str());
  }
}

}  // namespace
}  // namespace sluice
