// rate_allowance.h: a rate policy's hits taken from a sluice server in blocks and spent at the
// call site, so that most calls are admitted without a round trip (RemoteRateAdmitter's
// `allowance`; the Python and Node adapters keep the same rules).
//
// The server is asked for `block` hits at once (one Check of hits = block); the calls after it
// spend them here, each within `hold` of the answer that granted them, after which what is
// left is dropped. When a call leaves half of a block or less, the next block is asked for in
// the background (a refill: local() says so, the caller sends the Check and hands its answer
// to refilled()), so that a key's steady calls do not wait for a Check when a block runs out;
// the older block's hits are spent first, each still within `hold` of its own grant. A refill
// the server does not grant is not asked again for that block. A key the server refused is
// refused here until its retry_after (a refusal is always safe to repeat), but for hits held:
// they were granted, and are spent first. A block that a call waits for and the server does
// not grant is asked again as what the server says remains when that is enough for the call,
// else as the call's own hits: near the limit a call gets the answer it would have had
// without an allowance, a round trip later.
//
// What it can cost, and nothing else:
//  - No hit is spent that the server did not grant, and each within `hold` of its grant: in
//    any interval of T, the calls admitted through every allowance together are at most what
//    the policy grants in T + hold (for a rate of r hits a second, r x hold more than the
//    policy alone would in T; a fixed window: the hits granted in a window's last `hold` may be
//    spent in the first `hold` of the next).
//  - Hits not spent within `hold` of their grant are lost to every client. At most two blocks
//    are held per key (the newest, and what is left of the one before), one refill is in
//    flight at a time, and hits are spent oldest first: of the blocks granted in any interval
//    of `hold`, all but the last two are spent in full (but for fewer than a call's hits when
//    a call waited for the next). So at most two blocks per key, per allowance, per hold are
//    lost. Choose a block no larger than the calls per key in a hold.
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
  // Allowed: hits to ask the server for now, in the background (0: none); its answer goes to
  // refilled().
  std::uint64_t refill = 0;
};

struct AllowanceStats {
  std::uint64_t local_admits = 0;
  std::uint64_t local_refusals = 0;
  std::uint64_t blocks_granted = 0;
  std::uint64_t blocks_refused = 0;
  std::uint64_t hits_dropped = 0;
  std::uint64_t calls_asked = 0;  // calls that waited for the server (ask())
  std::uint64_t refills_granted = 0;
  std::uint64_t refills_refused = 0;  // not granted, or not answered
  std::uint64_t hits_held = 0;        // now, every key's (expired ones until the next look)
};

class RateAllowances {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // block >= 1 (1: no allowance), hold > 0, max_keys >= 1; anything else throws
  // std::invalid_argument naming the field. Past max_keys keys, the expired ones are
  // forgotten, and a key that finds no room is asked every time.
  RateAllowances(std::uint64_t block, std::chrono::nanoseconds hold, std::size_t max_keys = 10000);

  // The decision made here for `hits` on `key` at `now`: allowed from the hits held
  // (debited, the older block's first; with a refill to ask for when it left half a block or
  // less), or refused until the server's retry_after; nullopt: ask the server.
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

  // Records the answer to a refill of `asked` hits that local() asked for (nullopt: none
  // came). Granted, it is the key's block from now; the hits left of the one before are spent
  // first, until their own hold ends.
  void refilled(std::string_view key, std::uint64_t asked, const std::optional<RateAnswer>& answer,
                TimePoint now);

  // Hits held for `key` now (expired ones until the next look).
  [[nodiscard]] std::uint64_t held(std::string_view key) const;
  [[nodiscard]] std::size_t keys() const;
  [[nodiscard]] AllowanceStats stats() const;

 private:
  struct Key {
    std::uint64_t tokens = 0;  // the newest block's hits not spent
    TimePoint expires{};
    std::uint64_t granted = 0;       // the newest block's size
    bool refill_asked = false;       // for the newest block
    bool refilling = false;          // a refill is in flight (one at a time)
    std::uint64_t older_tokens = 0;  // the block before it, spent first
    TimePoint older_expires{};
    TimePoint refused_until{};
    RateAnswer last;
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };

  void drop(Key& k);
  // A block of `tokens` left of `granted`, granted at `now`, is the key's newest; what is left
  // of the one before it (a refill that came while a call waited for this one) is spent first.
  void push(Key& k, std::uint64_t tokens, std::uint64_t granted, TimePoint now);
  void forget_expired(TimePoint now);

  const std::uint64_t block_;
  const std::chrono::nanoseconds hold_;
  const std::size_t max_keys_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Key, Hash, std::equal_to<>> keys_;
  AllowanceStats stats_;
};

}  // namespace sluice::adapters
