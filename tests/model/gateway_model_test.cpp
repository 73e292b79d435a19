// Exhaustive state-space search of the gateway's admission protocol (the "BFS twin" of
// src/local/gateway.cpp; spec/gateway_queue.pml is the same protocol for spin).
//
// Every thread runs `iterations` calls: tenant level -> upstream pool -> route, each a
// fetch_add-then-check semaphore with a rollback step when refused, then holds and releases the
// chain in reverse. With the queue strategy each call is explored both as acquire_async (it
// queues when refused) and as try_acquire (it is rejected), and the pool follows the
// implementation's protocol step by step: every decrement of the pool's count outside the mutex
// (a release, a refused claim's rollback) is followed by a read of `waiters` and, if non-zero,
// a drain under the mutex; an arrival that may queue locks, increments `waiters`, retries when
// the queue is empty, queues (or is rejected when the queue is full) and drains before it
// unlocks; a drain serves head waiters while claims succeed, taking each one's route on its
// behalf. Every atomic step is one transition; the search visits every interleaving under
// sequential consistency (the queue protocol's atomics are seq_cst in the implementation) and
// checks, in every state:
//   Cap        no level has more admitted holders than its max, not even for an instant;
// and in every state where no thread can move:
//   Progress   every thread has finished (no waiter is stranded: no lost wake-up);
//   NoLeak     every counter is back at 0, the queue is empty, the mutex is free.
// Three deliberately broken variants must be caught by the same search: a check-then-act pool
// semaphore (load, then store) breaks Cap; a releaser that reads `waiters` before giving its
// unit back, and a refused claim rolled back without reading `waiters`, strand a waiter.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>

#include "state_space.h"

namespace sluice {
namespace {

using sluice::model::StateSpace;

constexpr int kMaxThreads = 3;
constexpr int kT = 0, kP = 1, kR = 2;  // levels: tenant, pool, route
constexpr std::uint8_t kBit[3] = {1, 2, 4};

enum class Variant { kCorrect, kCheckThenAct, kReadWaitersBeforeRelease, kSilentRollback };

struct Config {
  int threads = 3;
  int iterations = 2;
  std::array<int, 3> max = {2, 1, 1};
  bool queued = false;
  int depth = 2;
  Variant variant = Variant::kCorrect;
};

enum Pc : std::uint8_t {
  kStart,
  kTAdd,
  kTRollback,
  kPEntry,
  kPAdd,
  kPLoad,   // check-then-act variant: read
  kPStore,  // check-then-act variant: write
  kPRollback,
  kFLoadW,   // after a refused claim's rollback: read waiters
  kFLock,    // ... and drain
  kFUnlock,  // ... then queue (acquire_async) or be rejected (try_acquire)
  kSLock,
  kSInc,
  kSTry,
  kSRollback,
  kSDepth,
  kSFullDec,
  kSFullUnlock,
  kSUnlockWait,
  kWaiting,
  kSDecOk,
  kSUnlockOk,
  kRAdd,
  kRRollback,
  kHold,
  kRelR,
  kRelP,
  kRelLoadW,
  kDLock,
  kDLoop,  // drain: a subroutine run under the mutex; returns to Thread::ret
  kDRollback,
  kDPop,
  kDTail,
  kDTailRollback,
  kDRejPool,
  kDRejTenant,
  kDUnlock,
  kRelT,
  kRelTRej,
  kDone,
};

enum Handed : std::uint8_t { kNotYet, kAdmitted, kRejected };

struct Thread {
  std::uint8_t pc = kStart;
  std::uint8_t iter = 0;
  std::uint8_t held = 0;  // bits of kBit: admitted units this thread holds
  std::uint8_t tmp = 0;   // check-then-act: the read said "room"; drain: the waiter served
  std::uint8_t handed = kNotYet;
  std::uint8_t ret = kStart;  // where the drain subroutine returns
  std::uint8_t queuing = 0;   // this call is an acquire_async (1) or a try_acquire (0)
};

struct State {
  std::array<std::int8_t, 3> raw{};  // raw semaphore counts (refused acquirers included)
  std::int8_t waiters = 0;
  std::int8_t mutex = -1;  // owner, or -1
  std::uint8_t qlen = 0;
  std::array<std::uint8_t, kMaxThreads> queue{};
  std::array<Thread, kMaxThreads> th{};
};
static_assert(std::is_trivially_copyable_v<State>);
static_assert(std::has_unique_object_representations_v<State>);  // compared and hashed as bytes

struct Result {
  std::size_t states = 0;
  std::string violation;  // empty: every invariant held in every state
};

class Explorer {
 public:
  explicit Explorer(Config c) : c_(c) {}

  Result run() {
    State init;
    std::memset(static_cast<void*>(&init), 0,
                sizeof(init));  // padding too: states are compared as bytes
    init.mutex = -1;
    for (int i = 0; i < kMaxThreads; ++i) init.th[i].pc = i < c_.threads ? kStart : kDone;
    StateSpace<State> space;
    space.add(init);
    Result r;
    for (std::size_t at = 0; at < space.size(); ++at) {
      const State s = space[at].state;
      ++r.states;
      if (auto v = check_cap(s)) return {r.states, *v};
      bool moved = false;
      for (int t = 0; t < c_.threads; ++t) {
        for (int choice = 0; choice < 2; ++choice) {
          State n = s;
          if (!step(n, t, choice)) continue;
          moved = true;
          space.add(n);
        }
      }
      if (!moved) {
        if (auto v = check_final(s)) return {r.states, *v};
      }
    }
    return r;
  }

 private:
  // Cap: admitted holders per level, counting a unit a releaser holds for a waiter mid-drain.
  std::optional<std::string> check_cap(const State& s) const {
    for (int level = 0; level < 3; ++level) {
      int holders = 0;
      for (int t = 0; t < c_.threads; ++t) {
        holders += (s.th[t].held & kBit[level]) != 0;
        const std::uint8_t pc = s.th[t].pc;
        if (level == kP && (pc == kDPop || pc == kDTail || pc == kDTailRollback || pc == kDRejPool))
          ++holders;
      }
      if (holders > c_.max[level])
        return "Cap: level " + std::to_string(level) + " has " + std::to_string(holders) +
               " holders, max " + std::to_string(c_.max[level]);
    }
    return std::nullopt;
  }

  std::optional<std::string> check_final(const State& s) const {
    for (int t = 0; t < c_.threads; ++t)
      if (s.th[t].pc != kDone)
        return "Progress: thread " + std::to_string(t) + " stuck at pc " +
               std::to_string(s.th[t].pc) + (s.th[t].pc == kWaiting ? " (stranded waiter)" : "");
    for (int level = 0; level < 3; ++level)
      if (s.raw[level] != 0) return "NoLeak: level " + std::to_string(level) + " count not 0";
    if (s.waiters != 0 || s.qlen != 0 || s.mutex != -1) return "NoLeak: queue state not reset";
    return std::nullopt;
  }

  // One atomic step of thread t; false if t cannot move (done, blocked on the mutex, waiting)
  // or if `choice` 1 is asked of a step that has only one outcome. The one choice: at the start
  // of a call on a queue pool, whether the call may queue.
  bool step(State& s, int t, int choice) const {
    Thread& me = s.th[t];
    if (choice == 1 && !(me.pc == kStart && c_.queued && me.iter < c_.iterations)) return false;
    auto try_add = [&](int level) { return s.raw[level]++ < c_.max[level]; };
    auto finish_call = [&] {
      ++me.iter;
      me.pc = kStart;
    };
    auto drain = [&](Pc ret) {
      me.ret = ret;
      me.pc = kDLoop;
    };
    switch (me.pc) {
      case kStart:
        me.queuing = static_cast<std::uint8_t>(c_.queued && choice == 1);
        me.pc = me.iter == c_.iterations ? kDone : kTAdd;
        return true;
      case kTAdd:
        if (try_add(kT)) {
          me.held |= kBit[kT];
          me.pc = kPEntry;
        } else {
          me.pc = kTRollback;
        }
        return true;
      case kTRollback:
        --s.raw[kT];
        finish_call();
        return true;
      case kPEntry:  // queued: the fast path reads `waiters` first
        if (c_.queued && s.waiters != 0) {
          me.pc = me.queuing ? kSLock : kRelTRej;
        } else {
          me.pc = c_.variant == Variant::kCheckThenAct ? kPLoad : kPAdd;
        }
        return true;
      case kPAdd:
        if (try_add(kP)) {
          me.held |= kBit[kP];
          me.pc = kRAdd;
        } else {
          me.pc = kPRollback;
        }
        return true;
      case kPLoad:
        me.tmp = s.raw[kP] < c_.max[kP];
        me.pc = kPStore;
        return true;
      case kPStore:
        if (me.tmp) {
          ++s.raw[kP];
          me.held |= kBit[kP];
          me.pc = kRAdd;
        } else {
          me.pc = me.queuing ? kSLock : kRelTRej;
        }
        me.tmp = 0;
        return true;
      case kPRollback:
        --s.raw[kP];
        if (!c_.queued) {
          me.pc = kRelTRej;
        } else if (c_.variant == Variant::kSilentRollback) {
          me.pc = me.queuing ? kSLock : kRelTRej;
        } else {
          me.pc = kFLoadW;
        }
        return true;
      case kFLoadW:
        if (s.waiters != 0) {
          me.pc = kFLock;
        } else {
          me.pc = me.queuing ? kSLock : kRelTRej;
        }
        return true;
      case kFLock:
        if (s.mutex != -1) return false;
        s.mutex = static_cast<std::int8_t>(t);
        drain(kFUnlock);
        return true;
      case kFUnlock:
        s.mutex = -1;
        me.pc = me.queuing ? kSLock : kRelTRej;
        return true;
      case kSLock:
        if (s.mutex != -1) return false;
        s.mutex = static_cast<std::int8_t>(t);
        me.pc = kSInc;
        return true;
      case kSInc:
        ++s.waiters;
        me.pc = kSTry;
        return true;
      case kSTry:
        if (s.qlen != 0) {
          me.pc = kSDepth;
        } else if (try_add(kP)) {
          me.held |= kBit[kP];
          me.pc = kSDecOk;
        } else {
          me.pc = kSRollback;
        }
        return true;
      case kSRollback:
        --s.raw[kP];  // under the mutex: the drain below covers it
        me.pc = kSDepth;
        return true;
      case kSDepth:
        if (s.qlen >= c_.depth) {
          me.pc = kSFullDec;
        } else {
          s.queue[s.qlen++] = static_cast<std::uint8_t>(t);
          me.handed = kNotYet;
          drain(kSUnlockWait);
        }
        return true;
      case kSFullDec:
        --s.waiters;
        drain(kSFullUnlock);
        return true;
      case kSFullUnlock:
        s.mutex = -1;
        me.pc = kRelTRej;
        return true;
      case kSUnlockWait:
        s.mutex = -1;
        me.pc = kWaiting;
        return true;
      case kWaiting:
        if (me.handed == kNotYet) return false;
        if (me.handed == kAdmitted) {
          me.pc = kHold;  // the drainer set our P and R bits when it admitted us
        } else {
          finish_call();  // the drainer gave back our pool and tenant units
        }
        me.handed = kNotYet;
        return true;
      case kSDecOk:
        --s.waiters;
        me.pc = kSUnlockOk;
        return true;
      case kSUnlockOk:
        s.mutex = -1;
        me.pc = kRAdd;
        return true;
      case kRAdd:
        if (try_add(kR)) {
          me.held |= kBit[kR];
          me.pc = kHold;
        } else {
          me.pc = kRRollback;
        }
        return true;
      case kRRollback:
        --s.raw[kR];
        me.pc = kRelP;  // refused at the route: give back the pool, then the tenant
        return true;
      case kHold:
        me.pc = kRelR;
        return true;
      case kRelR:
        --s.raw[kR];
        me.held &= ~kBit[kR];
        me.pc = kRelP;
        return true;
      case kRelP:
        if (c_.queued && c_.variant == Variant::kReadWaitersBeforeRelease && me.tmp == 0) {
          me.tmp = s.waiters != 0 ? 2 : 1;  // broken: decides before giving the unit back
          return true;
        }
        --s.raw[kP];
        me.held &= ~kBit[kP];
        if (!c_.queued) {
          me.pc = kRelT;
        } else if (c_.variant == Variant::kReadWaitersBeforeRelease) {
          me.pc = me.tmp == 2 ? kDLock : kRelT;
          me.tmp = 0;
        } else {
          me.pc = kRelLoadW;
        }
        return true;
      case kRelLoadW:
        me.pc = s.waiters != 0 ? kDLock : kRelT;
        return true;
      case kDLock:
        if (s.mutex != -1) return false;
        s.mutex = static_cast<std::int8_t>(t);
        drain(kDUnlock);
        return true;
      case kDLoop:
        if (s.qlen == 0) {
          me.pc = me.ret;
        } else if (try_add(kP)) {
          me.pc = kDPop;
        } else {
          me.pc = kDRollback;
        }
        return true;
      case kDRollback:
        --s.raw[kP];
        me.pc = me.ret;
        return true;
      case kDPop:
        me.tmp = s.queue[0];
        for (int i = 1; i < s.qlen; ++i) s.queue[i - 1] = s.queue[i];
        s.queue[--s.qlen] = 0;
        --s.waiters;
        me.pc = kDTail;
        return true;
      case kDTail:
        if (try_add(kR)) {
          s.th[me.tmp].held |= kBit[kP] | kBit[kR];
          s.th[me.tmp].handed = kAdmitted;
          me.tmp = 0;
          me.pc = kDLoop;
        } else {
          me.pc = kDTailRollback;
        }
        return true;
      case kDTailRollback:
        --s.raw[kR];
        me.pc = kDRejPool;
        return true;
      case kDRejPool:
        --s.raw[kP];  // offered to the next waiter by the loop
        me.pc = kDRejTenant;
        return true;
      case kDRejTenant:
        --s.raw[kT];
        s.th[me.tmp].held &= ~kBit[kT];
        s.th[me.tmp].handed = kRejected;
        me.tmp = 0;
        me.pc = kDLoop;
        return true;
      case kDUnlock:
        s.mutex = -1;
        me.pc = kRelT;
        return true;
      case kRelT:
      case kRelTRej:
        --s.raw[kT];
        me.held &= ~kBit[kT];
        finish_call();
        return true;
      default:
        return false;
    }
  }

  Config c_;
};

Result explore(Config c) {
  Result r = Explorer(c).run();
  std::printf("[model] threads=%d iterations=%d max={%d,%d,%d} queued=%d depth=%d: %zu states%s\n",
              c.threads, c.iterations, c.max[0], c.max[1], c.max[2], c.queued ? 1 : 0, c.depth,
              r.states, r.violation.empty() ? "" : (" -> " + r.violation).c_str());
  return r;
}

TEST(GatewayModel, RejectStrategyNeverOverAdmitsAndNeverLeaks) {
  for (const auto& max : {std::array<int, 3>{2, 1, 1}, std::array<int, 3>{1, 2, 1},
                          std::array<int, 3>{2, 2, 1}, std::array<int, 3>{3, 2, 1}}) {
    Config c;
    c.max = max;
    const Result r = explore(c);
    EXPECT_EQ(r.violation, "");
    EXPECT_GT(r.states, 1000u);
  }
}

TEST(GatewayModel, QueueHandoffNeverOverAdmitsLosesNoWakeUpAndNeverLeaks) {
  // Pool of 1 with a full queue of 1 reachable; pool of 1 with the tenant level binding; pool
  // of 2 with a route of 1 (handed-over waiters refused at the route).
  struct Case {
    std::array<int, 3> max;
    int depth;
  };
  for (const Case& k : {Case{{3, 1, 1}, 1}, Case{{2, 1, 1}, 2}, Case{{3, 2, 1}, 2}}) {
    Config c;
    c.max = k.max;
    c.queued = true;
    c.depth = k.depth;
    const Result r = explore(c);
    EXPECT_EQ(r.violation, "");
    EXPECT_GT(r.states, 1'000'000u);
  }
}

TEST(GatewayModel, SearchCatchesACheckThenActSemaphore) {
  Config c;
  c.max = {3, 1, 3};
  c.variant = Variant::kCheckThenAct;
  const Result r = explore(c);
  EXPECT_EQ(r.violation.rfind("Cap: level 1", 0), 0u) << r.violation;
}

TEST(GatewayModel, SearchCatchesAReleaserThatReadsWaitersTooEarly) {
  Config c;
  c.max = {3, 1, 3};
  c.queued = true;
  c.variant = Variant::kReadWaitersBeforeRelease;
  const Result r = explore(c);
  EXPECT_NE(r.violation.find("stranded waiter"), std::string::npos) << r.violation;
}

TEST(GatewayModel, SearchCatchesARefusedClaimRolledBackSilently) {
  Config c;
  c.max = {3, 1, 3};
  c.queued = true;
  c.variant = Variant::kSilentRollback;
  const Result r = explore(c);
  EXPECT_NE(r.violation.find("stranded waiter"), std::string::npos) << r.violation;
}

}  // namespace
}  // namespace sluice
