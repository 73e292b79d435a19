// federated_key_state.h: what the federation searches (federation_model_test.cpp,
// federation_pool_model_test.cpp) share to hold the core's values in a few bytes: window
// indexes, times on a tick clock and small counts (Packing), and a FederatedKey packed
// (PackedKey) with the folds that keep the space finite and exact.
//
// A value out of its byte's range is a harness error: the search stops and names it, rather than
// explore a state the bytes cannot hold.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "sluice/core/federated_key.h"

namespace sluice::model {

inline constexpr std::int8_t kNone = -1;          // no window (INT64_MIN in the core)
inline constexpr std::int8_t kExpired = -100;     // an expiry folded as long past
inline constexpr std::int8_t kNoTime = INT8_MIN;  // a key's time never set, or passed
inline constexpr std::uint8_t kUnknown = 255;     // a key's budget left, not known
inline constexpr int kMaxParked = 2;              // checks parked behind a key's lease, at most

// Windows of `period` ticks as indexes, times and counts as bytes.
class Packing {
 public:
  explicit Packing(std::int64_t period) : period_(period) {}

  [[nodiscard]] std::int64_t start_of(std::int8_t w) const {
    return w == kNone ? INT64_MIN : w * period_;
  }
  std::int8_t index_of(std::int64_t start) {
    if (start == INT64_MIN) return kNone;
    if (start < 0 || start % period_ != 0 || start / period_ > 100) harness_error_ = "window";
    return static_cast<std::int8_t>(start / period_);
  }
  std::uint8_t small(std::uint64_t v, const char* what) {
    if (v > 250 && harness_error_.empty()) harness_error_ = std::string(what) + " out of range";
    return static_cast<std::uint8_t>(v);
  }
  std::int8_t tiny(std::int64_t v, const char* what) {
    if ((v < -100 || v > 100) && harness_error_.empty())
      harness_error_ = std::string(what) + " out of range";
    return static_cast<std::int8_t>(v);
  }
  // A key's time <-> its byte (kNoTime: not set).
  [[nodiscard]] static Nanos time_of(std::int8_t v) {
    return Nanos{v == kNoTime ? kFederatedNever : v};
  }
  std::int8_t byte_of(Nanos t, const char* what) {
    return t.count() == kFederatedNever ? kNoTime : tiny(t.count(), what);
  }

 protected:
  std::int64_t period_;
  std::string harness_error_;  // set by the first value out of range, or by the search
};

// A FederatedKey, packed: times on its holder's clock, windows as indexes, the parked checks'
// hits in order (0: a free slot).
struct PackedKey {
  std::int8_t e_window;  // the Escrow
  std::int8_t e_expires;
  std::uint8_t e_units;
  std::uint8_t e_granted;
  std::uint8_t e_spent;
  std::uint8_t e_relinquished;
  std::uint8_t leasing;
  std::uint8_t global_left;  // kUnknown: not known
  std::int8_t window_end;
  std::int8_t closed_until;
  std::uint8_t closed_reason;  // a FederatedReason while closed_until is set
  std::int8_t unreachable_until;
  std::int8_t short_until;
  std::uint8_t owed;  // charged beyond the escrow, to be paid from the next grants
  std::int8_t owed_until;
  std::array<std::uint8_t, kMaxParked> parked;
};

// The rules a searched key runs with: the limiter's defaults for `budget` and `batch`, a retry
// backoff of one tick, fail-closed.
inline FederatedKeyRules key_rules(BudgetSpec budget, std::uint64_t batch) {
  FederatedKeyRules r;
  r.budget = budget;
  r.batch = batch;
  r.refill_below = std::max<std::uint64_t>(1, batch / 4);  // the limiter's default
  r.retry_backoff = Nanos{1};
  r.regional_only = false;
  return r;
}

// The key as the core holds it, in `k` (a scratch key: its queue keeps its allocation).
inline FederatedKey& unpack(const Packing& p, const PackedKey& g, FederatedKey& k) {
  k.escrow.window_start = p.start_of(g.e_window);
  k.escrow.expires_at = Nanos{g.e_expires};
  k.escrow.units = g.e_units;
  k.escrow.granted = g.e_granted;
  k.escrow.spent = g.e_spent;
  k.escrow.relinquished = g.e_relinquished;
  k.leasing = g.leasing != 0;
  k.global_left = g.global_left == kUnknown ? UINT64_MAX : g.global_left;
  k.window_end = Packing::time_of(g.window_end);
  k.closed_until = Packing::time_of(g.closed_until);
  k.closed_reason = static_cast<FederatedReason>(g.closed_reason);
  k.unreachable_until = Packing::time_of(g.unreachable_until);
  k.short_until = Packing::time_of(g.short_until);
  k.owed = g.owed;
  k.owed_until = Packing::time_of(g.owed_until);
  k.waiting.clear();
  for (const std::uint8_t hits : g.parked)
    if (hits != 0) k.waiting.push_back(hits);
  k.spec_in_force.reset();
  k.mismatch_told = Nanos{kFederatedNever};
  k.expiry_ppm = 0;
  return k;
}

// Packs `k` into `g`; `error` is set when `k` holds what the bytes cannot: more than `parked`
// checks parked, or a spec mismatch or a drift allowance (which the searches never produce).
inline void pack(Packing& p, const FederatedKey& k, int parked, PackedKey& g, std::string& error) {
  g.e_window = p.index_of(k.escrow.window_start);
  g.e_expires = p.tiny(k.escrow.expires_at.count(), "expires_at");
  g.e_units = p.small(k.escrow.units, "units");
  g.e_granted = p.small(k.escrow.granted, "escrow granted");
  g.e_spent = p.small(k.escrow.spent, "escrow spent");
  g.e_relinquished = p.small(k.escrow.relinquished, "escrow relinquished");
  g.leasing = k.leasing ? 1 : 0;
  g.global_left = k.global_left == UINT64_MAX ? kUnknown : p.small(k.global_left, "global_left");
  g.window_end = p.byte_of(k.window_end, "window_end");
  g.closed_until = p.byte_of(k.closed_until, "closed_until");
  g.closed_reason = static_cast<std::uint8_t>(k.closed_reason);
  g.unreachable_until = p.byte_of(k.unreachable_until, "unreachable_until");
  g.short_until = p.byte_of(k.short_until, "short_until");
  g.owed = p.small(k.owed, "owed");
  g.owed_until = p.byte_of(k.owed_until, "owed_until");
  if (k.waiting.size() > static_cast<std::size_t>(parked))
    error = "more checks parked than the model parks";
  g.parked.fill(0);
  for (std::size_t j = 0; j < k.waiting.size() && j < kMaxParked; ++j)
    g.parked[j] = p.small(k.waiting[j], "parked hits");
  if (k.spec_in_force || k.mismatch_told.count() != kFederatedNever || k.expiry_ppm != 0)
    error = "a spec mismatch or a drift allowance";
}

// A key, as a trace shows it.
inline std::string describe(const PackedKey& g) {
  std::string out;
  if (g.e_window != kNone)
    out += "w" + std::to_string(g.e_window) + " u=" + std::to_string(g.e_units) +
           " exp=" + std::to_string(g.e_expires) + " g/s/r=" + std::to_string(g.e_granted) + "/" +
           std::to_string(g.e_spent) + "/" + std::to_string(g.e_relinquished);
  if (g.global_left != kUnknown) out += " left=" + std::to_string(g.global_left);
  if (g.window_end != kNoTime) out += " end=" + std::to_string(g.window_end);
  if (g.closed_until != kNoTime)
    out += " closed<" + std::to_string(g.closed_until) + " " +
           std::string(to_string(static_cast<FederatedReason>(g.closed_reason)));
  if (g.unreachable_until != kNoTime) out += " unreachable<" + std::to_string(g.unreachable_until);
  if (g.short_until != kNoTime) out += " short<" + std::to_string(g.short_until);
  if (g.owed != 0)
    out += " owed(" + std::to_string(g.owed) + "<" + std::to_string(g.owed_until) + ")";
  for (const std::uint8_t hits : g.parked)
    if (hits != 0) out += " parked(" + std::to_string(hits) + ")";
  return out;
}

// Values of a key that behave alike from `now` on (its holder's clock) become one: an escrow
// expiry a window or more past, a time passed, the reason of a refusal no longer in force, and
// a budget left that nothing reads as a number.
inline void fold(PackedKey& g, std::int64_t now, std::int64_t period) {
  if (g.e_expires != kExpired && now - g.e_expires >= period) g.e_expires = kExpired;
  for (std::int8_t* t :
       {&g.window_end, &g.closed_until, &g.unreachable_until, &g.short_until, &g.owed_until})
    if (*t != kNoTime && *t <= now) *t = kNoTime;
  if (g.closed_until == kNoTime)
    g.closed_reason = static_cast<std::uint8_t>(FederatedKey{}.closed_reason);
  // The budget left is read fresh from a reply, or as "none" (a refill) or, while a short
  // refusal lasts, as a number: outside that, any non-zero value reads as not known.
  if (g.short_until == kNoTime && g.global_left != 0) g.global_left = kUnknown;
}

}  // namespace sluice::model
