// status.h: "could not decide" as a value: a code with retry meaning and a message.
//
// What it is: the error type of every I/O boundary (coordinators, config loading, the server).
// A rejection is never a Status (it is a decision); a Status says the decision could not be
// made and whether trying again may help:
//   kInvalidArgument   bad input or config: do not retry until it is fixed
//   kNotFound          the named thing does not exist
//   kUnavailable       the backend is unreachable: retry (with backoff)
//   kDeadlineExceeded  the call took too long (possibly a partition): retry
//   kAborted           lost a race (e.g. a transaction conflict): redo
//   kPermissionDenied  the backend refused the credentials: fix them
//   kFailedPrecondition  the call does not fit the target's state or kind (e.g. Check on a
//                      concurrency policy): do not retry unchanged
//   kInternal          a bug or a broken invariant: report it
//   kAlreadyExists     the name is another's (a fleet node id another live process reports
//                      under): do not retry unchanged until it is freed
// StatusOr<T> holds a T or a non-ok Status.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace sluice {

enum class StatusCode : std::uint8_t {
  kOk,
  kInvalidArgument,
  kNotFound,
  kUnavailable,
  kDeadlineExceeded,
  kAborted,
  kPermissionDenied,
  kFailedPrecondition,
  kResourceExhausted,  // no capacity left (every node of a cascade at its limit)
  kInternal,
  kAlreadyExists,
};

[[nodiscard]] std::string_view to_string(StatusCode code) noexcept;

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  [[nodiscard]] bool ok() const noexcept { return code_ == StatusCode::kOk; }
  [[nodiscard]] StatusCode code() const noexcept { return code_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  // Whether the same call may succeed later without a change on the caller's side.
  [[nodiscard]] bool retryable() const noexcept {
    return code_ == StatusCode::kUnavailable || code_ == StatusCode::kDeadlineExceeded ||
           code_ == StatusCode::kAborted;
  }
  // "unavailable: connection refused"
  [[nodiscard]] std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  // Precondition: !status.ok().
  StatusOr(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  // Precondition: ok().
  [[nodiscard]] T& value() noexcept { return *std::get_if<T>(&v_); }
  [[nodiscard]] const T& value() const noexcept { return *std::get_if<T>(&v_); }
  // The error; an ok Status when ok().
  [[nodiscard]] Status status() const { return ok() ? Status{} : *std::get_if<Status>(&v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace sluice
