// calls.h: the calls the engine and its policies answer, and what they answer with.
//
// What it is: the request and result types both wire APIs map onto (CheckCall, AdmitCall,
// CheckManyResult, AdmitResult, PolicyInfo) and the limits on request fields. The engine
// and the policies share them; neither owns them, so a policy never includes the engine.
//
// Thread-safety: plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/core/status.h"
#include "sluice/local/rejection.h"

namespace sluice::server {

// A duration in seconds (for messages and JSON).
[[nodiscard]] inline double seconds_of(Nanos d) noexcept {
  return std::chrono::duration<double>(d).count();
}

// INVALID_ARGUMENT naming the field: "<field>: <why>".
[[nodiscard]] inline Status invalid(std::string_view field, std::string_view why) {
  std::string message(field);
  message += ": ";
  message += why;
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

// Limits on request fields.
inline constexpr std::size_t kMaxKeyBytes = 1024;
inline constexpr std::size_t kMaxNameBytes = 256;
inline constexpr std::int64_t kMaxHits = 1'000'000'000;
inline constexpr std::size_t kMaxBatch = 128;
// The most calls a Release reports as carried by its lease before it (Release.earlier).
inline constexpr std::size_t kMaxEarlier = 1024;

struct CheckCall {
  std::string_view policy;
  std::string_view key;
  std::int64_t hits = 1;
};

// A Release's answer: how long the lease was held and, with a cost, its chained rate key's
// allowance after the charge.
struct Released {
  Nanos held{0};
  std::optional<RateCharge> charged;
  // With keep: whether the lease carries its client's next call within the policy's limit
  // (false: it is over it; the client releases the lease once that call ends).
  bool kept = false;
};

struct CheckManyResult {
  bool allowed = false;
  std::vector<RateDecision> decisions;  // up to and including the first denial
  int denied_index = -1;
};

// A request field of one kind: an admit call names the policy, its key and the lease's terms;
// anything else is an attribute that the kind it names reads and checks for itself (a
// concurrency policy its tenant, upstream and route; a cascade the nodes to exclude). A name
// given more than once is a list (each value in order); a kind ignores names it does not read.
struct CallAttribute {
  std::string_view name;
  std::string_view value;
};

// Limits on an admit's attributes: how many in all, and each name and value (the engine checks
// these; a kind checks what its own attributes mean).
inline constexpr std::size_t kMaxAttributes = 256;

// "<field>: is N bytes; at most M", or "must not be empty" when `required`: the checks every
// request field gets (the engine's and each kind's).
[[nodiscard]] inline Status check_field(std::string_view field, std::string_view v, std::size_t max,
                                        bool required) {
  if (v.empty()) return required ? invalid(field, "must not be empty") : Status{};
  if (v.size() > max)
    return invalid(field,
                   "is " + std::to_string(v.size()) + " bytes; at most " + std::to_string(max));
  return {};
}

struct AdmitCall {
  std::string_view policy = {};
  std::string_view key = {};
  std::optional<Nanos> ttl = std::nullopt;
  // The most the caller waits for a permit, from when the call arrives (its own deadline): a
  // kind that queues calls (a concurrency policy's `queue` strategy) never keeps it longer.
  // Unset: the kind's own bound (the queue's timeout). Zero: no wait at all.
  std::optional<Nanos> max_wait = std::nullopt;
  // What the kind reads beyond the fields above (see CallAttribute); the views are the
  // caller's, valid while the call is being answered inline.
  std::span<const CallAttribute> attributes = {};

  // How many values `name` has.
  [[nodiscard]] std::size_t count(std::string_view name) const noexcept {
    std::size_t n = 0;
    for (const CallAttribute& a : attributes) n += a.name == name ? 1 : 0;
    return n;
  }
  // The value of an attribute that takes one: empty when absent; an error naming it when it is
  // given more than once.
  [[nodiscard]] StatusOr<std::string_view> single(std::string_view name) const {
    std::string_view out;
    bool seen = false;
    for (const CallAttribute& a : attributes) {
      if (a.name != name) continue;
      if (seen) return invalid(name, "takes one value, given " + std::to_string(count(name)));
      seen = true;
      out = a.value;
    }
    return out;
  }
  // Every value of `name`, in order.
  [[nodiscard]] std::vector<std::string_view> all(std::string_view name) const {
    std::vector<std::string_view> out;
    for (const CallAttribute& a : attributes)
      if (a.name == name) out.push_back(a.value);
    return out;
  }
};

// What a kind answers beyond the common fields (a name and a value; a name more than once is a
// list), as a call's attributes are asked.
using AnswerAttributes = std::vector<std::pair<std::string, std::string>>;

struct AdmitResult {
  bool admitted = false;
  std::string lease_id;
  Nanos ttl{0};
  std::string chosen;  // what the policy chose (a cascade's node); empty when it names nothing
  // When the call must have ended (the engine's clock), for the backend; unset: no deadline.
  std::optional<Nanos> call_deadline;
  // The same as time left from the admission (what the transports send: the caller's clock is
  // not the engine's). Never negative.
  std::optional<Nanos> call_timeout;
  // Admitted only because its policy runs in shadow (server/shadow.h): the policy (or the rate
  // policy it chains) would have refused it; `refusal` says how. The lease holds no permit.
  bool would_deny = false;
  // Admitted on a lease its client may keep for its next call (Release with keep): an adaptive
  // policy's, chaining no rate policy and not in shadow (each of whose calls must be decided).
  bool reusable = false;
  Rejection refusal;  // when !admitted, or would_deny
  // Keeps alive what `refusal`'s views point into (the policy that refused).
  std::shared_ptr<const void> refusal_owner;
  // How long the call waited in a queue before this answer (admitted or refused); 0: none.
  Nanos waited{0};
  // Admitted: what the kind answers beyond the fields above (its own, in its own words).
  AnswerAttributes attributes;
};

struct PolicyInfo {
  std::string name;
  std::string kind;
  std::string rate;
  std::uint64_t in_flight = 0;
  std::uint64_t limit = 0;
  std::string state_json;  // one JSON object
};

}  // namespace sluice::server
