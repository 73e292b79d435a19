// shared_rate.h: a rate rule's keys kept at a coordinator, so that every server that checks a key
// decides on one state (the `rate` kind with `coordinator:`).
//
// What it is: the three rate strategies of sluice/core/rate_strategy.h (fixed window, sliding
// window, GCRA), run on a key's state that lives at a coordinator instead of in one server. A
// server sends each check (or peek, refund, charge) to the coordinator, which decides it there,
// on its own clock, with apply() below: every backend (memory, Redis, PostgreSQL) runs apply()
// atomically per key, and gives identical replies to an identical sequence of calls at identical
// times (the conformance test). A decision is exactly the local strategy's on the same sequence of
// calls at the same times (same fields, same rounding), as long as the coordinator keeps its state.
//
// State per key: the strategy's state, the limit it was last written under and the coordinator
// time of that write. A key's state is kept per (key, strategy, period): rules that differ in
// either never share one. Rules that differ only in limit or burst (servers part-way through a
// reload) share it, and each call carries it to its own rule first (rate_strategy.h: carry), so
// what the key has spent, in hits, is kept whichever rule decides.
//
// Loss of state. A coordinator that may have lost writes it acknowledged (a Redis restarted from
// its snapshot, a failover, an eviction; the backends say how they find out) names the time it
// found out: its `origin`. A key's state written at or before the origin may be missing writes, so
// apply() first raises it to what a key spent to its limit at the origin would hold:
//   fixed window    count >= limit in the origin's window;
//   sliding window  current >= limit in the origin's window, and previous >= limit in the one
//                   before;
//   GCRA            tat >= origin + burst * period / limit (the whole burst spent at origin).
// The true state at the origin held at most that much (a check never takes a key past its
// limit), so every decision after a loss is at least as strict as the exact one: the admitted
// hits stay within the rule (tests/model/shared_rate_model_test.cpp replays every admitted
// sequence through an exact local limiter after losses at every step; spec/shared_rate_loss.pml
// is the same for spin; docs/simulations/shared-rate.md measures it). The cost is the wait a key's
// full allowance takes to come back: up to a period (fixed window), two periods (sliding), burst *
// period / limit (GCRA) after the loss. Hits charged past the limit (an overdraft) before a loss
// are forgotten beyond that.
//
// Thread-safety: apply() is a pure function on caller-owned values; SharedRateStore
// implementations are safe to call from any number of threads.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/core/status.h"

namespace sluice {

// kTake: as many of `hits` as fit now, at most (a lease of hits to spend elsewhere, the leased
// mode's): min(hits, what a check of 0 hits reports remaining) hits are admitted, all at once.
enum class SharedRateOp : std::uint8_t { kCheck, kPeek, kRefund, kCharge, kTake };

[[nodiscard]] std::string_view to_string(SharedRateOp op) noexcept;

struct SharedRateRequest {
  SharedRateOp op = SharedRateOp::kCheck;
  RateRule rule;
  std::uint64_t hits = 1;
};

struct SharedRateReply {
  // check and peek: the decision; refund: what a peek of 0 hits answers after it; charge: what
  // a peek of 0 hits answers after it (the key's allowance), with `charge` set; take: the check
  // of the hits it took (of 1 hit, not committed, when it took none; of 0 when asked for 0).
  RateDecision decision;
  RateCharge charge;          // charge only
  std::uint64_t granted = 0;  // take only: the hits it took
  Nanos coordinator_now{0};
  friend bool operator==(const SharedRateReply&, const SharedRateReply&) = default;
};

// One key's state at a coordinator.
struct SharedRateState {
  std::uint64_t limit = 0;           // the rule's limit when last written; 0: never written
  std::int64_t written = INT64_MIN;  // coordinator time (ns) of the last write
  FixedWindowState fixed;            // the strategy's state (only its own is used)
  SlidingWindowState sliding;
  GcraState gcra;
  friend bool operator==(const SharedRateState&, const SharedRateState&) = default;
};

// No loss known: the origin of a coordinator that never lost its state.
inline constexpr Nanos kNoLoss = Nanos::min();

// Applies `request` to `s` at coordinator time `now`, after a loss found at `origin` (kNoLoss:
// none): raises a state written before it (above), carries it to the request's limit, then
// checks, peeks, refunds or charges. `changed` (optional) is set when `s` must be written back.
// Requires request.rule.validate() to be empty.
[[nodiscard]] SharedRateReply apply(SharedRateState& s, const SharedRateRequest& request, Nanos now,
                                    Nanos origin, bool* changed = nullptr) noexcept;

// The coordinator time from which `s`, last written under `rule`'s strategy and period (and its
// own limit), decides like a fresh key unless written again: when a store may forget it. Later
// than idle_within(rule) after its last write for a key charged past its limit.
[[nodiscard]] Nanos idle_at(const SharedRateState& s, const RateRule& rule) noexcept;

// The state a key spent to its limit at `origin` holds (what apply() raises an older state to).
[[nodiscard]] SharedRateState spent_at(const RateRule& rule, Nanos origin) noexcept;

// One call of a SharedRateStore::apply_many().
struct SharedRateCall {
  std::string_view key;
  const SharedRateRequest* request = nullptr;  // non-null
};

// A coordinator's side of shared rate limits. Errors are values: kInvalidArgument for a request
// it cannot serve (naming the field), kUnavailable when it cannot be reached, kDeadlineExceeded
// when the call did not finish within `timeout`. Never throws.
class SharedRateStore {
 public:
  virtual ~SharedRateStore() = default;
  [[nodiscard]] virtual StatusOr<SharedRateReply> apply(std::string_view key,
                                                        const SharedRateRequest& request,
                                                        Nanos timeout) noexcept = 0;
  // Several calls (of different keys, or the same) at once: exactly what apply() would reply to
  // each, in order, each as if made in that order. A backend that pipelines sends them in one
  // round trip (Redis); the default makes one apply() after another. Empty when it could not
  // allocate (every call failed).
  [[nodiscard]] virtual std::vector<StatusOr<SharedRateReply>> apply_many(
      std::span<const SharedRateCall> calls, Nanos timeout) noexcept {
    std::vector<StatusOr<SharedRateReply>> out;
    try {
      out.reserve(calls.size());
      for (const SharedRateCall& c : calls) out.push_back(apply(c.key, *c.request, timeout));
    } catch (...) {
      out.clear();
    }
    return out;
  }
  // Why this backend cannot serve `rule` (empty: it can), naming the field. No I/O.
  [[nodiscard]] virtual std::string rule_error(const RateRule& /*rule*/) const { return {}; }
  // Tells the store that no state it holds was lost: the origin is set long past, so keys are
  // not counted as spent for a loss (a new Redis or database, which the store cannot tell from
  // one that lost everything). For an operator who knows. Default: kFailedPrecondition.
  [[nodiscard]] virtual Status adopt(Nanos /*timeout*/) noexcept {
    return Status(StatusCode::kFailedPrecondition, "this coordinator cannot be adopted");
  }
  // Ok when the coordinator answers.
  [[nodiscard]] virtual Status health(Nanos timeout) noexcept = 0;
  // "memory", "redis": for stats and logs.
  [[nodiscard]] virtual std::string_view backend() const noexcept = 0;
};

}  // namespace sluice
