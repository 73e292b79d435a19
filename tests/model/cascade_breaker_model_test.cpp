// Exhaustive search of a cascade node's breaker and limit (src/local/circuit_breaker.cpp as
// src/local/fallback_cascade.cpp drives it; spec/cascade_breaker.pml is the same protocol for
// spin, with the closed path's separate loads as their own steps).
//
// The production CircuitBreaker, on a manual clock, and a node limit of 1 or 2 permits. Two
// callers; every sequence of up to kDepth moves is run, each from a fresh breaker (the breaker
// cannot be copied, so a state is its path), with breakers opening after 1 and after 2
// failures. A move is:
//   enter(c)   an idle caller enters the breaker (refused: it stays idle);
//   take(c)    a caller let through takes a permit if one is free, and cancels its ticket if not
//              (a full node: a probe gives its place back) -- a separate move, because the
//              cascade does it after enter() returns, and the breaker may change in between;
//   end(c, r)  a caller holding a permit gives it back and tells the breaker r: success,
//              failure or neutral;
//   time       the clock moves by open_for (an open spell may end).
// Checked in every state reached:
//   Cap       with one probe allowed, never two probe tickets held at once (a probe's place is
//             never handed out twice), and never more permits than the limit;
//   NoStuck   from the state, once every caller has ended its call (neutral) and the longest
//             open spell has passed, a call is let through again: the breaker is never left
//             refusing the node forever (no probe place leaked, no spell without an end).
// A deliberately broken variant -- a caller that does not cancel its ticket when the node is
// full -- must be caught by NoStuck.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sluice/local/circuit_breaker.h"

namespace sluice {
namespace {

using std::chrono::seconds;
using Ticket = CircuitBreaker::Ticket;
using Result = CircuitBreaker::Result;

constexpr int kCallers = 2;
constexpr std::size_t kDepth = 11;

enum class Move : std::uint8_t { kEnter, kTake, kEnd, kTime };
struct Step {
  Move move;
  int caller = 0;
  Result result = Result::kNeutral;
};

CircuitBreakerOptions options(std::uint32_t failures) {
  CircuitBreakerOptions o;
  o.failures = failures;
  o.open_for = seconds(5);
  o.max_open_for = seconds(10);
  o.probes = 1;
  o.successes = 1;
  return o;
}

// One run of a path from a fresh breaker.
struct World {
  bool cancel_when_full = true;  // false: the broken variant
  int limit = 2;
  std::uint32_t failures = 2;
  CircuitBreaker breaker{options(failures)};
  Nanos now = seconds(1000);
  int held = 0;
  std::optional<Ticket> entered[kCallers];  // let through, no permit yet
  std::optional<Ticket> holding[kCallers];  // holding a permit

  World(bool cancel, int lim, std::uint32_t f)
      : cancel_when_full(cancel), limit(lim), failures(f), breaker(options(f)) {}

  // Applies `s`; false when the move is not possible in this state.
  bool apply(const Step& s) {
    switch (s.move) {
      case Move::kEnter: {
        const int c = s.caller;
        if (holding[c] || entered[c]) return false;
        const Ticket t = breaker.enter(now);
        if (t.admitted()) entered[c] = t;
        return true;
      }
      case Move::kTake: {
        const int c = s.caller;
        if (!entered[c]) return false;
        if (held < limit) {
          ++held;
          holding[c] = entered[c];
        } else if (cancel_when_full) {
          breaker.cancel(*entered[c]);
        }
        entered[c].reset();
        return true;
      }
      case Move::kEnd: {
        const int c = s.caller;
        if (!holding[c]) return false;
        --held;
        breaker.finish(*holding[c], s.result, now);
        holding[c].reset();
        return true;
      }
      case Move::kTime:
        now += options(failures).open_for;
        return true;
    }
    return false;
  }

  [[nodiscard]] std::string cap_violation() const {
    int probes = 0;
    for (const auto& h : holding)
      if (h && h->kind == Ticket::Kind::kProbe) ++probes;
    if (probes > 1) return "two probe tickets held at once";
    if (held > limit) return "more permits than the limit";
    return {};
  }

  // NoStuck, run on this world (it is spent afterwards).
  [[nodiscard]] bool lets_a_call_through_eventually() {
    for (auto& e : entered)
      if (e) {
        if (cancel_when_full) breaker.cancel(*e);  // as a full node would: not made
        e.reset();
      }
    for (auto& h : holding)
      if (h) {
        --held;
        breaker.finish(*h, Result::kNeutral, now);
        h.reset();
      }
    now += options(failures).max_open_for;
    return breaker.enter(now).admitted();
  }
};

std::vector<Step> moves() {
  std::vector<Step> out = {{Move::kTime}};
  for (int c = 0; c < kCallers; ++c) {
    out.push_back({Move::kEnter, c});
    out.push_back({Move::kTake, c});
    for (const Result r : {Result::kSuccess, Result::kFailure, Result::kNeutral})
      out.push_back({Move::kEnd, c, r});
  }
  return out;
}

std::string describe(const std::vector<Step>& path) {
  std::string out;
  for (const Step& s : path) {
    switch (s.move) {
      case Move::kEnter:
        out += " enter(" + std::to_string(s.caller) + ")";
        break;
      case Move::kTake:
        out += " take(" + std::to_string(s.caller) + ")";
        break;
      case Move::kEnd:
        out += " end(" + std::to_string(s.caller) + ",";
        out += s.result == Result::kSuccess ? "ok)" : s.result == Result::kFailure ? "fail)" : "-)";
        break;
      case Move::kTime:
        out += " time";
        break;
    }
  }
  return out;
}

struct Search {
  bool cancel_when_full = true;
  int limit = 2;
  std::uint32_t failures = 2;
  std::uint64_t states = 0;
  std::string violation;  // the first one found, with its path

  void run(std::vector<Step>& path) {
    if (!violation.empty()) return;
    // Replay the path, then check the state it reaches.
    World w(cancel_when_full, limit, failures);
    for (const Step& s : path)
      if (!w.apply(s)) return;  // not a possible path
    ++states;
    if (std::string why = w.cap_violation(); !why.empty()) {
      violation = why + " after" + describe(path);
      return;
    }
    if (!w.lets_a_call_through_eventually()) {
      violation = "the breaker refuses forever after" + describe(path);
      return;
    }
    if (path.size() == kDepth) return;
    for (const Step& s : moves()) {
      path.push_back(s);
      run(path);
      path.pop_back();
    }
  }
};

TEST(CascadeBreakerModel, EveryPathKeepsTheCapAndNeverLeavesTheNodeRefusedForever) {
  for (const int limit : {1, 2})
    for (const std::uint32_t failures : {1u, 2u}) {
      Search s;
      s.limit = limit;
      s.failures = failures;
      std::vector<Step> path;
      s.run(path);
      EXPECT_EQ(s.violation, "") << "limit " << limit << ", failures " << failures;
      EXPECT_GT(s.states, 10'000u);  // the search really ran
      std::printf("breaker model, limit %d, failures %u: %llu states (paths of up to %d moves)\n",
                  limit, failures, static_cast<unsigned long long>(s.states),
                  static_cast<int>(kDepth));
    }
}

TEST(CascadeBreakerModel, CatchesAProbeThatKeepsItsPlaceWhenTheNodeIsFull) {
  // A probe finds the node full of a call let through before the breaker opened.
  Search s;
  s.cancel_when_full = false;
  s.limit = 1;
  s.failures = 1;
  std::vector<Step> path;
  s.run(path);
  EXPECT_NE(s.violation.find("refuses forever"), std::string::npos) << s.violation;
}

}  // namespace
}  // namespace sluice
