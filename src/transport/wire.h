// wire.h: what the gRPC API's encoding means, shared by the server's service and the CLI.
//
// What it is: durations to and from google.protobuf.Duration (with the encoding of "never"),
// and the mapping of sluice's status codes to gRPC's.
//
// Thread-safety: pure functions.
#pragma once

#include <google/protobuf/duration.pb.h>
#include <grpcpp/support/status.h>

#include <cstdint>

#include "sluice/core/clock.h"
#include "sluice/core/status.h"

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

}  // namespace sluice::transport
