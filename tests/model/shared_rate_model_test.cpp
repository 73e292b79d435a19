// Exhaustive search of shared rate limits through losses of state: every sequence of calls,
// snapshots and losses, up to a depth, on the production core (sluice::apply of
// core/shared_rate.h, over the strategies of core/rate_strategy.h); the coordinator's storage and
// its failures are modelled here.
//
// One key of a small rule, one coordinator (it serialises every call, so how many servers send
// them does not matter). Time is in ticks (1 tick = 1 ns). Actions, in every order:
//   check     a check of 1 or 2 hits (or of the whole burst) at the current time;
//   refund    1 hit of the last admitted check given back (CheckMany's rollback);
//   tick      time moves on by 1 or by 2 ticks;
//   snapshot  the storage is saved (an RDB snapshot, or what an AOF had synced);
//   restore   the storage goes back to the last snapshot and the coordinator finds it has lost
//             state (a restart that reloads it, a failover to a replica that had it): the
//             origin becomes now;
//   empty     the storage is lost entirely (a restart without persistence): the origin is now.
// Invariant, in every reachable sequence: the admitted checks (and their refunds), replayed in
// order at their times through the local strategy on a state that never lost anything, are all
// admitted: a shared key admits, through any losses, nothing an exact limiter would refuse.
//
// The same search without the raise (a coordinator that forgets its origin) finds a sequence that
// admits more than the rule, for every strategy: the rule is what holds the bound.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "sluice/core/shared_rate.h"

namespace sluice {
namespace {

struct Event {
  bool refund = false;
  std::uint64_t hits = 0;
  Nanos at{0};
};

struct Search {
  RateRule rule;
  int depth = 0;
  bool raise = true;  // false: the broken variant, the origin never set
  std::uint64_t sequences = 0;
  std::uint64_t admitted = 0;
  std::string violation;  // the first sequence over the rule, spelled out

  // Whether `events` replayed on a state that never lost anything are all admitted.
  bool exact(const std::vector<Event>& events) const {
    SharedRateState s;
    for (const Event& e : events) {
      SharedRateRequest r;
      r.rule = rule;
      r.hits = e.hits;
      r.op = e.refund ? SharedRateOp::kRefund : SharedRateOp::kCheck;
      const SharedRateReply out = apply(s, r, e.at, kNoLoss);
      if (!e.refund && !out.decision.allowed) return false;
    }
    return true;
  }

  void run(SharedRateState s, SharedRateState saved, Nanos now, Nanos origin,
           std::vector<Event>& events, std::string& trail, int left) {
    ++sequences;
    if (!violation.empty()) return;
    if (!exact(events)) {
      violation = trail;
      return;
    }
    if (left == 0) return;
    const auto step = [&](const std::string& what, const std::function<void()>& act) {
      const std::size_t n = events.size(), len = trail.size();
      trail += what + " ";
      act();
      events.resize(n);
      trail.resize(len);
    };
    const std::uint64_t burst = rule.burst != 0 ? rule.burst : rule.limit;
    for (std::uint64_t hits : {std::uint64_t{1}, std::uint64_t{2}, burst}) {
      step("check" + std::to_string(hits) + "@" + std::to_string(now.count()), [&] {
        SharedRateState next = s;
        SharedRateRequest r;
        r.rule = rule;
        r.hits = hits;
        if (apply(next, r, now, origin).decision.allowed) {
          ++admitted;
          events.push_back({false, hits, now});
        }
        run(next, saved, now, origin, events, trail, left - 1);
      });
      if (hits == burst) break;
    }
    // A refund of one hit of the last admitted check, if it was the last event.
    if (!events.empty() && !events.back().refund && events.back().at == now) {
      step("refund@" + std::to_string(now.count()), [&] {
        SharedRateState next = s;
        SharedRateRequest r;
        r.rule = rule;
        r.op = SharedRateOp::kRefund;
        r.hits = 1;
        (void)apply(next, r, now, origin);
        events.push_back({true, 1, now});
        run(next, saved, now, origin, events, trail, left - 1);
      });
    }
    for (int d : {1, 2})
      step("tick" + std::to_string(d),
           [&] { run(s, saved, now + Nanos{d}, origin, events, trail, left - 1); });
    step("snapshot", [&] { run(s, s, now, origin, events, trail, left - 1); });
    step("restore", [&] { run(saved, saved, now, raise ? now : origin, events, trail, left - 1); });
    step("empty", [&] {
      run(SharedRateState{}, saved, now, raise ? now : origin, events, trail, left - 1);
    });
  }

  void go() {
    std::vector<Event> events;
    std::string trail;
    run(SharedRateState{}, SharedRateState{}, Nanos{0}, kNoLoss, events, trail, depth);
  }
};

RateRule small(RateStrategy s, std::uint64_t limit, std::int64_t period, std::uint64_t burst = 0) {
  RateRule r;
  r.strategy = s;
  r.limit = limit;
  r.period = Nanos{period};
  r.burst = burst;
  return r;
}

struct Case {
  const char* name;
  RateRule rule;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"fixed window 2 per 3", small(RateStrategy::kFixedWindow, 2, 3)},
      {"sliding window 2 per 3", small(RateStrategy::kSlidingWindow, 2, 3)},
      {"gcra 2 per 4", small(RateStrategy::kGcra, 2, 4)},
      {"gcra 1 per 3, burst 2", small(RateStrategy::kGcra, 1, 3, 2)},
  };
  return all;
}

TEST(SharedRateModel, NoSequenceOfLossesAdmitsWhatAnExactLimiterWouldRefuse) {
  for (const Case& c : cases()) {
    Search s;
    s.rule = c.rule;
    s.depth = 7;
    s.go();
    EXPECT_EQ(s.violation, "") << c.name;
    std::printf("%s: %llu sequences, %llu admissions\n", c.name,
                static_cast<unsigned long long>(s.sequences),
                static_cast<unsigned long long>(s.admitted));
    // The search reached losses after admissions, and enough of them.
    EXPECT_GT(s.sequences, 500'000u) << c.name;
    EXPECT_GT(s.admitted, 10'000u) << c.name;
  }
}

TEST(SharedRateModel, WithoutTheRaiseALossAdmitsMoreThanTheRule) {
  for (const Case& c : cases()) {
    Search s;
    s.rule = c.rule;
    s.depth = 7;
    s.raise = false;
    s.go();
    EXPECT_NE(s.violation, "") << c.name << ": the broken variant was not caught";
  }
}

}  // namespace
}  // namespace sluice
