// fleet_worker.cpp: one fleet node in a process of its own, for
// tests/integration/fleet_processes_test.cpp.
//
// What it is: a FleetGuard whose L_local is a FixedLimit of --limit (so L_global, the median, is
// --limit) over a RedisCoordinator on 127.0.0.1:--port (Redis server time), fail-closed, ticked
// by a FleetGuardRunner, called by --threads caller threads. The workers of one run account
// together in a shared-memory file (--shm, mmap MAP_SHARED of a file every worker sizes with
// ftruncate; its zero fill is the initial state). Every field is a 64-bit integer accessed only
// through a lock-free std::atomic_ref (lock-free atomics are address-free, so they work across
// processes), in the default seq_cst order: a test harness, where clarity beats speed. Times
// are SteadyClock (CLOCK_MONOTONIC: one clock for every process on the machine).
//
//   in_flight   +1 right after acquire() admits, -1 right before the permit is released, so it
//               never counts more permits than the fleet holds; a +1 that makes it exceed
//               --limit is checked against the callers' deadlines (below).
//   deadline_ns one slot per caller thread: the deadline of the permit it holds, set after the
//               +1 and cleared before the -1 (so a set slot is always counted in in_flight).
//               The guard's contract is on calls within their deadline: a permit held past it
//               (a caller descheduled on a loaded machine) is a call the backend has stopped,
//               no longer reported to the coordinator. A +1 over --limit is a violation when
//               in_flight minus the slots past their deadline still exceeds --limit (recorded
//               with its time); otherwise it is counted as `overdue_excess` and reported.
//   start       a barrier: each worker counts itself ready once its start condition holds, the
//               last one sets start_ns, and every caller starts at start_ns.
//   stable_ns   membership is stable: every node has been granted with nodes == --nodes, plus
//               one lease (2 x heartbeat), counted from when the last node saw it.
//
// Modes:
//   jobs    starts once every node has had its first grant (so the run covers the hand-offs of
//           a fleet forming). Callers loop: acquire -> claim one of --jobs fleet-wide (only
//           once admitted) -> sleep --job-us -> release(kSuccess, rtt); on a rejection they
//           back off (100 us doubling to 1 ms) and retry. They stop once every job is claimed.
//   rate    starts once every node holds its fair share (L_global / nodes). Each caller paces
//           calls of --call-us so that the node admits --rate calls/s for --seconds; a call
//           that is rejected is retried (every 50 us) until its slot is over, then missed.
//   freeze  starts like rate. Callers loop for --seconds: acquire (retrying every ms) -> a call
//           of --call-min-ms..--call-max-ms -> release. The backend's view of each call is
//           recorded at admission as an interval [admitted, end): end is the call's natural
//           end, or its deadline if that comes first and --honour=1 (the backend stops a call
//           at the deadline its caller passed on). The harness freezes one worker (SIGSTOP)
//           past its lease meanwhile: that worker's calls go on in the backend while it cannot
//           release them, which is why they are intervals and not +1/-1. The report's
//           max_overlap is the most intervals open at once, against --limit.
//   report  prints the run's totals, one "name value" line each (after the workers exited).
//
// Exit code: 0 done; 1 bad usage or setup error; 2 barrier timeout (a peer never came).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sluice/backends/redis_coordinator.h"
#include "sluice/core/clock.h"
#include "sluice/core/fixed_limit.h"
#include "sluice/fleet/fleet_guard.h"

namespace sluice {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::size_t kMaxRecords = 4096;  // violation times kept; more are counted only
constexpr std::size_t kMaxCalls = 16384;   // freeze mode: call intervals kept
constexpr std::size_t kMaxCallers = 512;   // caller threads across the run's workers

// The shared-memory file's layout. Fields are only touched through at().
struct Shared {
  std::int64_t ready;           // workers whose start condition held
  std::int64_t start_ns;        // common start; 0 until every worker is ready
  std::int64_t full;            // workers granted with nodes == --nodes
  std::int64_t stable_ns;       // membership stable; 0 until then
  std::int64_t in_flight;       // permits held fleet-wide (under-counted, never over)
  std::int64_t max_in_flight;   // largest in_flight seen
  std::int64_t jobs_taken;      // jobs claimed (may pass --jobs: a claim past it is given back)
  std::int64_t jobs_done;       // jobs completed
  std::int64_t finish_ns;       // latest job completion
  std::int64_t admitted;        // acquire() calls that admitted
  std::int64_t rejected;        // acquire() calls that rejected
  std::int64_t missed;          // rate mode: call slots that passed without an admission
  std::int64_t violations;      // admissions above --limit; also the next slot of violation_ns
  std::int64_t exited;          // workers that left the fleet
  std::int64_t evicted;         // 1 once a node was granted with fewer than --nodes after start
  std::int64_t calls;           // freeze mode: intervals recorded (the next slot)
  std::int64_t callers;         // caller slots taken (the next slot of deadline_ns)
  std::int64_t overdue_excess;  // admissions above --limit only while permits were overdue
  std::int64_t late_releases;   // permits released after their deadline
  std::int64_t violation_ns[kMaxRecords];
  std::int64_t deadline_ns[kMaxCallers];
  std::int64_t call_start_ns[kMaxCalls];
  std::int64_t call_end_ns[kMaxCalls];
};

using Ref = std::atomic_ref<std::int64_t>;
static_assert(Ref::is_always_lock_free);
static_assert(Ref::required_alignment <= alignof(std::int64_t));

Ref at(std::int64_t& field) { return Ref(field); }

void store_max(std::int64_t& field, std::int64_t value) {
  Ref r = at(field);
  std::int64_t cur = r.load();
  while (value > cur && !r.compare_exchange_weak(cur, value)) {
  }
}

struct Config {
  std::string mode;  // jobs | rate | report
  std::string shm;
  int port = 0;
  std::string node;
  std::string key = "fleet";
  std::int64_t nodes = 4;
  std::int64_t limit = 8;
  bool handoff = false;
  bool eager = false;
  std::int64_t threads = 8;
  std::int64_t heartbeat_ms = 100;
  std::int64_t jobs = 30'000;
  std::int64_t job_us = 5'000;
  std::int64_t rate = 2'000;  // per node, calls/s
  std::int64_t seconds = 5;
  std::int64_t call_us = 500;
  std::int64_t barrier_s = 20;   // longest wait for the peers
  std::int64_t lease_ms = 0;     // 0: the guard's default
  std::int64_t deadline_ms = 0;  // call_deadline; 0: the guard's default
  bool honour = true;            // freeze mode: the backend stops a call at its deadline
  std::int64_t call_min_ms = 150;
  std::int64_t call_max_ms = 350;
  bool local_only = false;

  [[nodiscard]] Nanos lease() const {
    return lease_ms > 0 ? Nanos{milliseconds(lease_ms)} : 2 * milliseconds(heartbeat_ms);
  }
};

// Parses --name=value flags; the error, or empty.
std::string parse(int argc, char** argv, Config& c) {
  std::map<std::string, std::function<void(const std::string&)>> flags = {
      {"mode", [&](const std::string& v) { c.mode = v; }},
      {"shm", [&](const std::string& v) { c.shm = v; }},
      {"port", [&](const std::string& v) { c.port = std::stoi(v); }},
      {"node", [&](const std::string& v) { c.node = v; }},
      {"key", [&](const std::string& v) { c.key = v; }},
      {"nodes", [&](const std::string& v) { c.nodes = std::stoll(v); }},
      {"limit", [&](const std::string& v) { c.limit = std::stoll(v); }},
      {"handoff", [&](const std::string& v) { c.handoff = v == "1"; }},
      {"eager", [&](const std::string& v) { c.eager = v == "1"; }},
      {"threads", [&](const std::string& v) { c.threads = std::stoll(v); }},
      {"heartbeat-ms", [&](const std::string& v) { c.heartbeat_ms = std::stoll(v); }},
      {"jobs", [&](const std::string& v) { c.jobs = std::stoll(v); }},
      {"job-us", [&](const std::string& v) { c.job_us = std::stoll(v); }},
      {"rate", [&](const std::string& v) { c.rate = std::stoll(v); }},
      {"seconds", [&](const std::string& v) { c.seconds = std::stoll(v); }},
      {"call-us", [&](const std::string& v) { c.call_us = std::stoll(v); }},
      {"barrier-s", [&](const std::string& v) { c.barrier_s = std::stoll(v); }},
      {"lease-ms", [&](const std::string& v) { c.lease_ms = std::stoll(v); }},
      {"deadline-ms", [&](const std::string& v) { c.deadline_ms = std::stoll(v); }},
      {"honour", [&](const std::string& v) { c.honour = v == "1"; }},
      {"call-min-ms", [&](const std::string& v) { c.call_min_ms = std::stoll(v); }},
      {"call-max-ms", [&](const std::string& v) { c.call_max_ms = std::stoll(v); }},
      {"outage", [&](const std::string& v) { c.local_only = v == "local-only"; }},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return "not --name=value: " + arg;
    const auto f = flags.find(arg.substr(2, eq - 2));
    if (f == flags.end()) return "unknown flag: " + arg;
    try {
      f->second(arg.substr(eq + 1));
    } catch (const std::exception&) {
      return "bad value: " + arg;
    }
  }
  if (c.mode != "jobs" && c.mode != "rate" && c.mode != "freeze" && c.mode != "report")
    return "--mode: jobs|rate|freeze|report";
  if (c.call_min_ms < 1 || c.call_max_ms < c.call_min_ms)
    return "--call-min-ms must be >= 1 and <= --call-max-ms";
  if (c.shm.empty()) return "--shm is required";
  if (c.mode != "report" && (c.port <= 0 || c.node.empty())) return "--port and --node required";
  if (c.nodes < 1 || c.limit < 1 || c.threads < 1 || c.heartbeat_ms < 1 || c.rate < 1)
    return "--nodes, --limit, --threads, --heartbeat-ms and --rate must be >= 1";
  if (c.rate > 1'000'000 * c.threads) return "--rate must be <= 1e6 x --threads";
  return {};
}

// Maps the shared file (created and sized if need be: every worker sizes it alike).
Shared* map_shared(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return nullptr;
  void* p = nullptr;
  if (::ftruncate(fd, sizeof(Shared)) == 0)
    p = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<Shared*>(p);
}

void sleep_for(Nanos d) {
  if (d > Nanos{0}) std::this_thread::sleep_for(d);
}

// ---- one admitted call, accounted fleet-wide ----

// A caller's slot in deadline_ns, taken once per caller thread.
std::int64_t& caller_slot(Shared& sh) {
  const std::int64_t n = at(sh.callers).fetch_add(1);
  if (n >= static_cast<std::int64_t>(kMaxCallers)) throw std::runtime_error("too many callers");
  return sh.deadline_ns[n];
}

// Permits held by callers past their deadline at `now`.
std::int64_t overdue(Shared& sh, Nanos now) {
  const std::int64_t n = std::min<std::int64_t>(at(sh.callers).load(), kMaxCallers);
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t d = at(sh.deadline_ns[i]).load();
    if (d != 0 && d < now.count()) ++count;
  }
  return count;
}

// Right after acquire() admitted: count the permit and check the fleet-wide ceiling.
void enter(Shared& sh, const Config& c, std::int64_t& slot, const FleetPermit& permit, Nanos now) {
  at(sh.admitted).fetch_add(1);
  const std::int64_t in_flight = at(sh.in_flight).fetch_add(1) + 1;
  at(slot).store(permit.deadline().count());
  store_max(sh.max_in_flight, in_flight);
  if (in_flight <= c.limit) return;
  if (in_flight - overdue(sh, now) <= c.limit) {
    at(sh.overdue_excess).fetch_add(1);
    return;
  }
  const std::int64_t n = at(sh.violations).fetch_add(1);
  if (n < static_cast<std::int64_t>(kMaxRecords)) at(sh.violation_ns[n]).store(now.count());
}

// Right before the permit is released.
void leave(Shared& sh, std::int64_t& slot, const FleetPermit& permit, Nanos now) {
  if (now > permit.deadline()) at(sh.late_releases).fetch_add(1);
  at(slot).store(0);
  at(sh.in_flight).fetch_sub(1);
}

// ---- callers ----

void job_caller(const Config& c, Shared& sh, FleetGuard& guard, const Clock& clock) {
  constexpr Nanos kMinBackoff = microseconds(100), kMaxBackoff = milliseconds(1);
  Nanos backoff = kMinBackoff;
  std::int64_t& slot = caller_slot(sh);
  while (at(sh.jobs_taken).load() < c.jobs) {
    std::optional<FleetPermit> permit = guard.acquire();
    if (!permit) {
      at(sh.rejected).fetch_add(1);
      sleep_for(backoff);
      backoff = std::min(2 * backoff, kMaxBackoff);
      continue;
    }
    backoff = kMinBackoff;
    const Nanos t0 = clock.now();
    enter(sh, c, slot, *permit, t0);
    const bool claimed = at(sh.jobs_taken).fetch_add(1) < c.jobs;
    if (claimed) sleep_for(microseconds(c.job_us));
    const Nanos t1 = clock.now();
    leave(sh, slot, *permit, t1);
    permit->release(claimed ? Outcome::kSuccess : Outcome::kIgnored, t1 - t0);
    if (!claimed) break;
    at(sh.jobs_done).fetch_add(1);
    store_max(sh.finish_ns, t1.count());
  }
}

// Retries acquire() every 50 us until it admits or `deadline` passes.
std::optional<FleetPermit> acquire_by(FleetGuard& guard, Shared& sh, const Clock& clock,
                                      Nanos deadline) {
  while (true) {
    if (std::optional<FleetPermit> permit = guard.acquire()) return permit;
    at(sh.rejected).fetch_add(1);
    if (clock.now() >= deadline) return std::nullopt;
    sleep_for(microseconds(50));
  }
}

// Caller `index` of c.threads: one call every `period`, the callers evenly staggered.
void rate_caller(const Config& c, Shared& sh, FleetGuard& guard, const Clock& clock, int index,
                 Nanos start) {
  const Nanos period = Nanos{seconds(1)} * c.threads / c.rate;
  const Nanos end = start + seconds(c.seconds);
  std::int64_t& caller = caller_slot(sh);
  for (Nanos slot = start + period * index / c.threads; slot < end; slot += period) {
    sleep_for(slot - clock.now());
    std::optional<FleetPermit> permit = acquire_by(guard, sh, clock, slot + period);
    if (!permit) {
      at(sh.missed).fetch_add(1);
      continue;
    }
    const Nanos t0 = clock.now();
    enter(sh, c, caller, *permit, t0);
    sleep_for(microseconds(c.call_us));
    const Nanos t1 = clock.now();
    leave(sh, caller, *permit, t1);
    permit->release(Outcome::kSuccess, t1 - t0);
    while (slot + 2 * period <= clock.now()) {  // fell more than a slot behind: skip
      slot += period;
      at(sh.missed).fetch_add(1);
    }
  }
}

// Freeze mode: calls for --seconds from `start`, each recorded as the backend sees it.
void freeze_caller(const Config& c, Shared& sh, FleetGuard& guard, const Clock& clock, int index,
                   Nanos start) {
  std::mt19937_64 rng(std::hash<std::string>{}(c.node) + static_cast<std::uint64_t>(index));
  std::uniform_int_distribution<std::int64_t> length(c.call_min_ms, c.call_max_ms);
  const Nanos end = start + seconds(c.seconds);
  sleep_for(start - clock.now());
  while (clock.now() < end) {
    std::optional<FleetPermit> permit = guard.acquire();
    if (!permit) {
      at(sh.rejected).fetch_add(1);
      sleep_for(milliseconds(1));
      continue;
    }
    at(sh.admitted).fetch_add(1);
    const Nanos t0 = clock.now();
    const Nanos natural = t0 + milliseconds(length(rng));
    // A deadline already past (admitted with a stale clock reading) ends the call at once.
    const Nanos stop = c.honour ? std::max(t0, std::min(natural, permit->deadline())) : natural;
    const std::int64_t slot = at(sh.calls).fetch_add(1);
    if (slot < static_cast<std::int64_t>(kMaxCalls)) {
      at(sh.call_start_ns[slot]).store(t0.count());
      at(sh.call_end_ns[slot]).store(stop.count());
    }
    sleep_for(stop - clock.now());
    permit->release(stop < natural ? Outcome::kDropped : Outcome::kSuccess, clock.now() - t0);
  }
}

// ---- membership and the start barrier ----

// Counts this node once it has been granted with the whole fleet; the last one to do so
// stamps the moment membership is stable (plus one lease, for grants in flight to settle).
class MembershipWatch {
 public:
  MembershipWatch(const Config& c, Shared& sh, const FleetGuard& guard, const Clock& clock)
      : c_(c), sh_(sh), guard_(guard), clock_(clock) {}

  void poll() {
    const std::uint32_t nodes = guard_.stats().nodes;
    if (counted_ && nodes < static_cast<std::uint32_t>(c_.nodes) && at(sh_.start_ns).load() != 0)
      at(sh_.evicted).store(1);  // a peer's record expired (or it left)
    if (counted_ || nodes != static_cast<std::uint32_t>(c_.nodes)) return;
    counted_ = true;
    if (at(sh_.full).fetch_add(1) + 1 == c_.nodes)
      at(sh_.stable_ns).store((clock_.now() + c_.lease()).count());
  }

 private:
  const Config& c_;
  Shared& sh_;
  const FleetGuard& guard_;
  const Clock& clock_;
  bool counted_ = false;
};

bool ready_to_start(const Config& c, const FleetGuard& guard) {
  const FleetGuardStats s = guard.stats();
  if (s.phase != FleetPhase::kActive) return false;
  if (c.mode == "jobs") return true;  // the first grant
  return s.nodes == static_cast<std::uint32_t>(c.nodes) && s.share > 0 &&
         s.share >= s.l_global / s.nodes;  // the fair share
}

// Waits (polling the membership) until `done` holds; false at the barrier deadline.
bool wait_for(const std::function<bool()>& done, MembershipWatch& watch, Nanos deadline,
              const Clock& clock) {
  while (!done()) {
    watch.poll();
    if (clock.now() >= deadline) return false;
    sleep_for(microseconds(200));
  }
  return true;
}

// The common start time, or nullopt if the peers did not all come before the deadline.
std::optional<Nanos> barrier(const Config& c, Shared& sh, const FleetGuard& guard,
                             MembershipWatch& watch, const Clock& clock) {
  const Nanos deadline = clock.now() + seconds(c.barrier_s);
  if (!wait_for([&] { return ready_to_start(c, guard); }, watch, deadline, clock))
    return std::nullopt;
  if (at(sh.ready).fetch_add(1) + 1 == c.nodes) at(sh.start_ns).store(clock.now().count());
  if (!wait_for([&] { return at(sh.start_ns).load() != 0; }, watch, deadline, clock))
    return std::nullopt;
  return Nanos{at(sh.start_ns).load()};
}

// ---- one node ----

// Runs the callers from the common start; 0, or 2 on a barrier timeout.
int drive(const Config& c, Shared& sh, FleetGuard& guard, const Clock& clock) {
  MembershipWatch watch(c, sh, guard, clock);
  const std::optional<Nanos> start = barrier(c, sh, guard, watch, clock);
  if (!start) {
    std::fprintf(stderr, "%s: barrier timeout (ready %lld of %lld)\n", c.node.c_str(),
                 static_cast<long long>(at(sh.ready).load()), static_cast<long long>(c.nodes));
    return 2;
  }
  std::atomic<int> running{static_cast<int>(c.threads)};
  std::vector<std::thread> callers;
  for (int i = 0; i < c.threads; ++i) {
    callers.emplace_back([&, i] {
      if (c.mode == "jobs") {
        job_caller(c, sh, guard, clock);
      } else if (c.mode == "freeze") {
        freeze_caller(c, sh, guard, clock, i, *start);
      } else {
        rate_caller(c, sh, guard, clock, i, *start);
      }
      running.fetch_sub(1, std::memory_order_relaxed);
    });
  }
  while (running.load(std::memory_order_relaxed) > 0) {
    watch.poll();
    sleep_for(milliseconds(1));
  }
  for (std::thread& t : callers) t.join();
  return 0;
}

void print_node_stats(const Config& c, const FleetGuard& guard) {
  const FleetGuardStats s = guard.stats();
  std::printf(
      "node %s: heartbeats %llu errors %llu fences %llu off_cycle %llu accepted %llu rejected "
      "%llu share %u l_global %u nodes %u stale_refusals %llu late_releases %llu\n",
      c.node.c_str(), static_cast<unsigned long long>(s.heartbeats),
      static_cast<unsigned long long>(s.heartbeat_errors),
      static_cast<unsigned long long>(s.fences), static_cast<unsigned long long>(s.off_cycle_beats),
      static_cast<unsigned long long>(s.local.accepted),
      static_cast<unsigned long long>(s.local.rejected), s.share, s.l_global, s.nodes,
      static_cast<unsigned long long>(s.stale_refusals),
      static_cast<unsigned long long>(s.late_releases));
}

int run_node(const Config& c, Shared& sh) {
  const Clock& clock = SteadyClock::instance();
  RedisOptions redis;
  redis.port = c.port;
  CoordinatorConfig config;
  config.acknowledged_handoff = c.handoff;
  auto coordinator = RedisCoordinator::connect(redis, config);  // Redis server time
  if (!coordinator.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.node.c_str(), coordinator.status().to_string().c_str());
    return 1;
  }
  FleetGuardOptions options;
  options.node_id = c.node;
  options.key = c.key;
  options.heartbeat = milliseconds(c.heartbeat_ms);
  options.eager_handoff = c.eager;
  if (c.lease_ms > 0) options.lease_ttl = milliseconds(c.lease_ms);
  if (c.deadline_ms > 0) options.call_deadline = milliseconds(c.deadline_ms);
  if (c.local_only) options.outage = OutageMode::kLocalOnly;
  auto limit =
      std::make_unique<FixedLimit>(FixedLimitOptions{.limit = static_cast<std::uint32_t>(c.limit)});
  auto guard = FleetGuard::create(*coordinator.value(), std::move(limit), clock, options);
  if (!guard.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.node.c_str(), guard.status().to_string().c_str());
    return 1;
  }
  int rc = 0;
  {
    FleetGuardRunner runner(*guard.value(), clock);
    rc = drive(c, sh, *guard.value(), clock);
  }
  guard.value()->close();  // leaves the fleet
  print_node_stats(c, *guard.value());
  at(sh.exited).fetch_add(1);
  return rc;
}

// ---- report ----

// The most call intervals open at once (an end at t closes before a start at t opens).
std::int64_t max_overlap(Shared& sh) {
  const std::int64_t n = std::min<std::int64_t>(at(sh.calls).load(), kMaxCalls);
  std::vector<std::pair<std::int64_t, int>> edges;
  for (std::int64_t i = 0; i < n; ++i) {
    edges.emplace_back(at(sh.call_start_ns[i]).load(), +1);
    edges.emplace_back(at(sh.call_end_ns[i]).load(), -1);
  }
  std::sort(edges.begin(), edges.end());
  std::int64_t open = 0, most = 0;
  for (const auto& [t, d] : edges) most = std::max(most, open += d);
  return most;
}

void print_report(Shared& sh) {
  const std::int64_t stable = at(sh.stable_ns).load(), start = at(sh.start_ns).load();
  const std::int64_t violations = at(sh.violations).load();
  const std::int64_t recorded = std::min<std::int64_t>(violations, kMaxRecords);
  std::int64_t before = 0;  // unrecorded violations count as after: the conservative side
  for (std::int64_t i = 0; i < recorded; ++i)
    if (stable != 0 && at(sh.violation_ns[i]).load() < stable) ++before;
  const std::int64_t finish = at(sh.finish_ns).load();
  const std::pair<const char*, std::int64_t> rows[] = {
      {"ready", at(sh.ready).load()},
      {"exited", at(sh.exited).load()},
      {"stable", stable != 0 ? 1 : 0},
      {"stable_after_start_us", stable != 0 && start != 0 ? (stable - start) / 1000 : -1},
      {"elapsed_us", finish != 0 && start != 0 ? (finish - start) / 1000 : -1},
      {"jobs_done", at(sh.jobs_done).load()},
      {"admitted", at(sh.admitted).load()},
      {"rejected", at(sh.rejected).load()},
      {"missed", at(sh.missed).load()},
      {"in_flight", at(sh.in_flight).load()},
      {"max_in_flight", at(sh.max_in_flight).load()},
      {"violations", violations},
      {"violations_before_stable", before},
      {"violations_after_stable", violations - before},
      {"overdue_excess", at(sh.overdue_excess).load()},
      {"late_releases", at(sh.late_releases).load()},
      {"started", start != 0 ? 1 : 0},
      {"evicted", at(sh.evicted).load()},
      {"calls", at(sh.calls).load()},
      {"max_overlap", max_overlap(sh)},
  };
  for (const auto& [name, value] : rows)
    std::printf("%s %lld\n", name, static_cast<long long>(value));
}

int worker_main(int argc, char** argv) {
  Config c;
  if (const std::string why = parse(argc, argv, c); !why.empty()) {
    std::fprintf(stderr, "sluice_fleet_worker: %s\n", why.c_str());
    return 1;
  }
  Shared* sh = map_shared(c.shm);
  if (sh == nullptr) {
    std::fprintf(stderr, "sluice_fleet_worker: cannot map %s\n", c.shm.c_str());
    return 1;
  }
  const int rc = c.mode == "report" ? (print_report(*sh), 0) : run_node(c, *sh);
  std::fflush(stdout);
  ::munmap(sh, sizeof(Shared));
  return rc;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) { return sluice::worker_main(argc, argv); }
