// rate_allowance.h: a rate policy's hits taken from a sluice server in blocks and spent at the
// call site, so that most calls are admitted without a round trip (RemoteRateAdmitter's
// `allowance`; the Python and Node adapters keep the same rules).
//
// The server is asked for `block` hits at once (one Check of hits = block); the calls after it
// spend them here, each within `hold` of the answer that granted them, after which what is
// left is dropped. A key the server refused is refused here until its retry_after (a refusal
// is always safe to repeat). A block the server does not grant is asked again as what it says
// remains when that is enough for the call, else as the call's own hits: near the limit a
// call gets the answer it would have had without an allowance, a round trip later.
//
// What it can cost, and nothing else:
//  - No hit is spent that the server did not grant, and each within `hold` of its grant: in
//    any interval of T, the calls admitted through every allowance together are at most what
//    the policy grants in T + hold (for a rate of r hits a second, r x hold more than the
//    policy alone would in T; a fixed window: the hits granted in a window's last `hold` may be
//    spent in the first `hold` of the next).
//  - A block's hits not spent within `hold` are lost to every client: at most block - 1 per
//    key, per allowance, per hold. Choose a block no larger than the calls per key in a hold.
//
// Thread-safe; the caller passes the time (a steady clock's), so the rules are tested on a
// clock of the test's own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace sluice::adapters {

// What the server answered a check (the fields the allowance needs).
struct RateAnswer {
  bool allowed = false;
  bool would_deny = false;  // allowed only in shadow: nothing was debited
  bool has_reason = false;  // refused for more than the key's own limit (federation's reasons)
  std::uint64_t limit = 0;
  std::uint64_t remaining = 0;
  std::optional<std::chrono::nanoseconds> retry_after;  // refused: nullopt never passes
};

// A decision made here.
struct LocalDecision {
  bool allowed = false;
  std::uint64_t limit = 0;
  std::uint64_t remaining = 0;             // allowed: the server's figure at the grant + held
  std::chrono::nanoseconds retry_after{};  // refused: until the server's retry_after
};

struct AllowanceStats {
  std::uint64_t local_admits = 0;
  std::uint64_t local_refusals = 0;
  std::uint64_t blocks_granted = 0;
  std::uint64_t blocks_refused = 0;
  std::uint64_t hits_dropped = 0;
};

class RateAllowances {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // block >= 1 (1: no allowance), hold > 0, max_keys >= 1; anything else throws
  // std::invalid_argument naming the field. Past max_keys keys, the expired ones are
  // forgotten, and a key that finds no room is asked every time.
  RateAllowances(std::uint64_t block, std::chrono::nanoseconds hold, std::size_t max_keys = 10000);

  // The decision made here for `hits` on `key` at `now`: allowed from the hits held
  // (debited), or refused until the server's retry_after; nullopt: ask the server.
  [[nodiscard]] std::optional<LocalDecision> local(std::string_view key, std::uint64_t hits,
                                                   TimePoint now);

  // Hits to ask the server for, for a call of `hits`: a block, no larger than the policy's
  // limit when known, never fewer than `hits`.
  [[nodiscard]] std::uint64_t ask(std::string_view key, std::uint64_t hits);

  // Records the server's answer to a check of `asked` hits for a call of `hits` at `now`.
  // nullopt: the call has its answer; else the hits to ask for next (fewer than `asked`, at
  // least `hits`).
  [[nodiscard]] std::optional<std::uint64_t> answered(std::string_view key, std::uint64_t asked,
                                                      std::uint64_t hits, const RateAnswer& answer,
                                                      TimePoint now);

  // Hits held for `key` now (expired ones until the next look).
  [[nodiscard]] std::uint64_t held(std::string_view key) const;
  [[nodiscard]] std::size_t keys() const;
  [[nodiscard]] AllowanceStats stats() const;

 private:
  struct Key {
    std::uint64_t tokens = 0;
    TimePoint expires{};
    TimePoint refused_until{};
    RateAnswer last;
    bool answered = false;
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };

  void drop(Key& k);
  void forget_expired(TimePoint now);

  const std::uint64_t block_;
  const std::chrono::nanoseconds hold_;
  const std::size_t max_keys_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Key, Hash, std::equal_to<>> keys_;
  AllowanceStats stats_;
};

}  // namespace sluice::adapters
