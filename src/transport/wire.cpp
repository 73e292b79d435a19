#include "transport/wire.h"

namespace sluice::transport {

void to_proto(Nanos n, google::protobuf::Duration* d) {
  if (n == Nanos::max()) {
    d->set_seconds(kNeverSeconds);
    d->set_nanos(0);
    return;
  }
  d->set_seconds(n.count() / 1'000'000'000);
  d->set_nanos(static_cast<std::int32_t>(n.count() % 1'000'000'000));
}

double seconds_of(const google::protobuf::Duration& d) noexcept {
  return static_cast<double>(d.seconds()) + d.nanos() / 1e9;
}

grpc::Status to_grpc(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return grpc::Status::OK;
    case StatusCode::kInvalidArgument:
      return {grpc::StatusCode::INVALID_ARGUMENT, s.message()};
    case StatusCode::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, s.message()};
    case StatusCode::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, s.message()};
    case StatusCode::kDeadlineExceeded:
      return {grpc::StatusCode::DEADLINE_EXCEEDED, s.message()};
    case StatusCode::kAborted:
      return {grpc::StatusCode::ABORTED, s.message()};
    case StatusCode::kPermissionDenied:
      return {grpc::StatusCode::PERMISSION_DENIED, s.message()};
    case StatusCode::kFailedPrecondition:
      return {grpc::StatusCode::FAILED_PRECONDITION, s.message()};
    case StatusCode::kResourceExhausted:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, s.message()};
    case StatusCode::kAlreadyExists:
      return {grpc::StatusCode::ALREADY_EXISTS, s.message()};
    case StatusCode::kInternal:
      break;
  }
  return {grpc::StatusCode::INTERNAL, s.message()};
}

}  // namespace sluice::transport
