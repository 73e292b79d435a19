// wire.h: what the gRPC API's encoding means, shared by the server's service and the CLI.
//
// What it is: durations to and from google.protobuf.Duration (with the encoding of "never"),
// the mapping of sluice's status codes to gRPC's, an admit's attributes, and the outcome vocabulary
// (server::CallResult) as each transport spells it: the API's Outcome enum, and the words of HTTP's
// JSON and the CLI's --outcome.
//
// Thread-safety: pure functions.
#pragma once

#include <google/protobuf/duration.pb.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "server/calls.h"
#include "server/permit.h"
#include "sluice/core/clock.h"
#include "sluice/core/status.h"
#include "sluice/v1/sluice.pb.h"

namespace sluice::transport {

// "Never" on the wire (a request for more hits than a policy's limit can never pass): the
// largest google.protobuf.Duration, 10,000 years.
inline constexpr std::int64_t kNeverSeconds = 315'576'000'000;
// Nanos -> Duration; Nanos::max() becomes kNeverSeconds.
void to_proto(Nanos n, google::protobuf::Duration* d);
[[nodiscard]] double seconds_of(const google::protobuf::Duration& d) noexcept;
[[nodiscard]] inline bool is_never(const google::protobuf::Duration& d) noexcept {
  return d.seconds() >= kNeverSeconds;
}

// Maps an Engine status to its gRPC status.
[[nodiscard]] grpc::Status to_grpc(const Status& s);

// An admit's attributes as the engine reads them (server::CallAttribute): the shorthand fields
// first (`tenant`, `upstream`, `route`: an empty one gives none; `exclude`: each value), then
// `attributes` in order. The views point into `req`.
void attributes_of(const v1::AdmitRequest& req, std::vector<server::CallAttribute>& out);

// The outcome a word names ("success", "dropped", "timeout", "overload", "ignored", "failed");
// an error naming `field` and the words otherwise.
[[nodiscard]] StatusOr<server::CallResult> call_result_of(std::string_view word,
                                                          std::string_view field = "outcome");
// The outcome an API enum value names (unspecified is success); an error for a value this
// server does not know (a newer client's), not a success whose RTT would mislead a limit.
[[nodiscard]] StatusOr<server::CallResult> call_result_of(v1::Outcome o);
// The API's enum value of an outcome.
[[nodiscard]] v1::Outcome to_proto(server::CallResult r) noexcept;

}  // namespace sluice::transport
