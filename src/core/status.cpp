#include "sluice/core/status.h"

namespace sluice {

std::string_view to_string(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kDeadlineExceeded:
      return "deadline exceeded";
    case StatusCode::kAborted:
      return "aborted";
    case StatusCode::kPermissionDenied:
      return "permission denied";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kInternal:
      return "internal";
    case StatusCode::kAlreadyExists:
      return "already exists";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(sluice::to_string(code_)) + ": " + message_;
}

}  // namespace sluice
