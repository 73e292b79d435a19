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

struct CheckCall {
  std::string_view policy;
  std::string_view key;
  std::int64_t hits = 1;
};

struct CheckManyResult {
  bool allowed = false;
  std::vector<RateDecision> decisions;  // up to and including the first denial
  int denied_index = -1;
};

struct AdmitCall {
  std::string_view policy;
  std::string_view key;
  std::string_view tenant;
  std::string_view upstream;
  std::string_view route;
  std::optional<Nanos> ttl;
  // Nodes a cascade must not choose (those a caller's retry already tried); at most kMaxBatch
  // names. Other kinds choose no node and ignore it.
  std::span<const std::string> exclude = {};
  // The most the caller waits for a permit, from when the call arrives (its own deadline): a
  // kind that queues calls (a concurrency policy's `queue` strategy) never keeps it longer.
  // Unset: the kind's own bound (the queue's timeout). Zero: no wait at all.
  std::optional<Nanos> max_wait = std::nullopt;
};

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
  Rejection refusal;  // when !admitted
  // Keeps alive what `refusal`'s views point into (the policy that refused).
  std::shared_ptr<const void> refusal_owner;
  // How long the call waited in a queue before this answer (admitted or refused); 0: none.
  Nanos waited{0};
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
