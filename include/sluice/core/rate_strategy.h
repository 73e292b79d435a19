// rate_strategy.h: the rate strategies' decisions on one key, as pure functions.
//
// What it is: the three strategies a RateLimiter (sluice/local/rate_limiter.h) runs per key, each a
// function of (the key's state, the rule, hits, now) that returns the decision and updates the
// state only when the hits are admitted. Time is a parameter; nothing here reads a clock.
//
//   fixed window    windows aligned on multiples of `period`; admits while count + hits <=
//                   limit. State: 16 bytes (window start, count).
//   sliding window  the weighted previous-window counter: estimate = previous * (1 - elapsed /
//                   period) + current, admits while estimate + hits <= limit. State: 24 bytes.
//   GCRA            the generic cell rate algorithm (a token bucket as one timestamp): each hit
//                   costs period / limit; admits while the theoretical arrival time after the
//                   hits is within `burst` hits' worth of now. State: 16 bytes.
//
// Exactness. Every decision is exact in whole numbers, for every limit and period a rule
// accepts, with no rounding that accumulates. The windows count hits (saturating: `count +
// hits` cannot wrap, whatever the limit). GCRA keeps the theoretical arrival time scaled by the
// limit (tat * limit, 128 bits), in which a hit costs exactly `period` and the tolerance is
// exactly burst * period, so, with L = limit, P = period (ns), B = burst, n = now (ns) and
// T = max(tat * L, n * L), `hits` are admitted at n iff
//     T + hits * P <= n * L + B * P
// (limit: 3, period: 1s admits 3 from idle, not 2). This holds while |now| < 2^62 ns (146
// years); beyond, the arithmetic saturates towards refusing.
//
// Rounding of the durations (every strategy): retry_after is the smallest whole number of ns d
// such that the same request at now + d would be admitted (exactly: it is refused at
// now + d - 1 ns); reset_after is the smallest whole number of ns after which the key is back to
// its full allowance; remaining is rounded down (the most hits that would pass now).
//
// Every decision carries what an HTTP 429 needs: limit, remaining (after this request),
// reset_after (until the key is back to its full allowance) and retry_after (0 when allowed;
// when refused, the earliest time the same request could pass; Nanos::max() when it never can,
// i.e. hits > limit, or > burst for GCRA).
//
// A state that decides exactly like a fresh one is "idle" (is_idle): the limiter may forget it
// without changing any future decision, which is how memory stays bounded under key churn.
//
// Thread-safety: pure functions on caller-owned values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/core/clock.h"

namespace sluice {

enum class RateStrategy : std::uint8_t { kFixedWindow, kSlidingWindow, kGcra };

[[nodiscard]] std::string_view to_string(RateStrategy s) noexcept;

// The longest period a rule may have: 100 years of 365 days (window arithmetic adds two periods
// to a time in ns, which stays far from overflow below this).
inline constexpr Nanos kMaxRatePeriod = std::chrono::hours(24 * 365 * 100);

struct RateRule {
  RateStrategy strategy = RateStrategy::kGcra;
  std::uint64_t limit = 100;               // hits per period; >= 1
  Nanos period = std::chrono::seconds(1);  // > 0
  // GCRA only: hits admitted at once from idle; 0 means `limit`. Default 0.
  std::uint64_t burst = 0;

  // Empty when valid, else what is wrong, naming the field.
  [[nodiscard]] std::string validate() const;
};

struct RateDecision {
  bool allowed = false;
  // Refused because the limiter holds as many keys as it may (RateLimiterOptions::max_keys) and
  // this key is new, not because of its rate: retry_after is then a hint, not a promise.
  bool key_capacity = false;
  std::uint64_t limit = 0;
  std::uint64_t remaining = 0;
  Nanos reset_after{0};
  Nanos retry_after{0};
  // Denied: why, when it is more than the key's own limit ("key_capacity" with key_capacity, a
  // federated policy's reasons, e.g. "coordinator_unreachable"); empty otherwise. A static
  // string.
  std::string_view reason;
  // Allowed only because its policy runs in shadow: the policy would have refused it (`reason`
  // and retry_after say what it would have answered), and nothing was debited.
  bool would_deny = false;
  friend bool operator==(const RateDecision&, const RateDecision&) = default;
};

// One key's state: the fields each strategy uses (a limiter stores only its strategy's).
struct FixedWindowState {
  std::int64_t window_start = INT64_MIN;  // ns; INT64_MIN: never used
  std::uint64_t count = 0;
};
struct SlidingWindowState {
  std::int64_t window_start = INT64_MIN;
  std::uint64_t current = 0;
  std::uint64_t previous = 0;
};
struct GcraState {
  __extension__ typedef __int128 Scaled;
  // The lowest value: never used.
  static constexpr Scaled kUnused = -(((Scaled{1} << 126) - 1) * 2 + 1) - 1;
  // The theoretical arrival time times the rule's limit (ns * limit). A hit adds the rule's
  // period to it.
  Scaled tat_scaled = kUnused;
};

// `commit` false: the decision a request would get, the state untouched (a peek).
RateDecision decide(FixedWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now,
                    bool commit = true) noexcept;
RateDecision decide(SlidingWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now,
                    bool commit = true) noexcept;
RateDecision decide(GcraState& s, const RateRule& rule, std::uint64_t hits, Nanos now,
                    bool commit = true) noexcept;

// Gives back `hits` that a committed decision at `now` admitted (the rollback of an
// all-or-nothing batch). The windows give them back only while the key is still in the window
// they were admitted in (once a later check has moved it on they stay spent: never more
// permissive than before those hits). GCRA gives back their cost; that is exact unless the key
// drained completely and restarted between the check and the refund (see the definition).
void refund(FixedWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now) noexcept;
void refund(SlidingWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now) noexcept;
void refund(GcraState& s, const RateRule& rule, std::uint64_t hits, Nanos now) noexcept;

// What a charge leaves: the key's allowance after it.
struct RateCharge {
  // False: nothing was recorded (`reason` says why: "key_capacity", a new key while the limiter
  // holds as many keys as it may).
  bool recorded = true;
  std::uint64_t limit = 0;
  std::uint64_t remaining = 0;  // hits a check could take now
  // Hits charged past the limit that later checks are still waiting out (0: none). The windows
  // count them until their window ends (fixed) or its weight has fallen away (sliding); GCRA
  // until its debt has drained, at the rule's rate.
  std::uint64_t overdraft = 0;
  // Federated: hits charged in this region beyond its escrow, being taken from the global budget
  // now (whatever that cannot cover is forgiven when its window ends).
  std::uint64_t pending = 0;
  Nanos reset_after{0};     // until the key's allowance is whole again
  Nanos retry_after{0};     // until a check of one hit could pass (0: now)
  std::string_view reason;  // a static string
  friend bool operator==(const RateCharge&, const RateCharge&) = default;
};

// Charges `hits` after the fact (a cost known only once the call is over): they are counted
// like admitted hits, whatever the key has left, so a charge may take it past its limit (an
// overdraft) and later checks are refused until it has been waited out (RateCharge::overdraft).
// Saturating: a charge never wraps a count. Returns the key's allowance after it.
RateCharge charge(FixedWindowState& s, const RateRule& rule, std::uint64_t hits,
                  Nanos now) noexcept;
RateCharge charge(SlidingWindowState& s, const RateRule& rule, std::uint64_t hits,
                  Nanos now) noexcept;
RateCharge charge(GcraState& s, const RateRule& rule, std::uint64_t hits, Nanos now) noexcept;

// Carrying a key's state to a new rule (an in-place reload). Possible when the strategy and the
// period are the same (a window's count, or a GCRA key's debt, means the same thing under the
// new rule); a new limit (or burst) then applies to what the key has already spent: a fixed
// window that counted 40 of 100 has 10 of a new limit of 50 left, a GCRA key that owes 40 hits
// owes them under the new rate (its debt, in hits, is kept exactly). A strategy or period
// change cannot be carried (a window's count does not say when in the window its hits came).
[[nodiscard]] bool can_carry(const RateRule& from, const RateRule& to) noexcept;
// Rewrites `s` (made under `from`, last decided at or before `now`) for `to`, decided at `now`
// from then on. Requires can_carry(from, to). The windows need nothing; GCRA rescales.
void carry(FixedWindowState& s, const RateRule& from, const RateRule& to, Nanos now) noexcept;
void carry(SlidingWindowState& s, const RateRule& from, const RateRule& to, Nanos now) noexcept;
void carry(GcraState& s, const RateRule& from, const RateRule& to, Nanos now) noexcept;

// The longest a key stays non-idle after its last admitted hit: a period (fixed window), two
// (sliding window), the tolerance burst * period / limit rounded up (GCRA).
[[nodiscard]] Nanos idle_within(const RateRule& rule) noexcept;

[[nodiscard]] bool is_idle(const FixedWindowState& s, const RateRule& rule, Nanos now) noexcept;
[[nodiscard]] bool is_idle(const SlidingWindowState& s, const RateRule& rule, Nanos now) noexcept;
[[nodiscard]] bool is_idle(const GcraState& s, const RateRule& rule, Nanos now) noexcept;

}  // namespace sluice
