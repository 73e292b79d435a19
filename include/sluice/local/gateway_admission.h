// gateway_admission.h: the values the gateway's hot path returns.
//
// What it is: Resolution (a Target, or a ResolveError naming the unknown id) and Admission (a
// GatewayPermit, a Rejection, or - only from the by-name path - a ResolveError). A Rejection is
// a decision ("at capacity, retry later"); a ResolveError means the gateway could not decide
// because the call names something the config does not have (do not retry).
//
// Thread-safety: plain values, owned by one thread at a time.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "sluice/local/gateway_permit.h"
#include "sluice/local/rejection.h"

namespace sluice {

struct ResolveError {
  enum class Code {
    kUnknownTenant,
    kUnknownUpstream,
    kUnknownRoute,
    kNotBound,  // the upstream is neither the tenant's own nor bound to it
  };
  Code code = Code::kUnknownTenant;
  std::string id;  // the id that failed (for kNotBound: the upstream's)
  std::string tenant;
  // Starts with the call's field that failed, e.g. "upstream: unknown upstream 'billing'".
  [[nodiscard]] std::string message() const;
};

class [[nodiscard]] Resolution {
 public:
  Resolution(Target target) noexcept : v_(target) {}        // NOLINT: implicit by design
  Resolution(ResolveError error) : v_(std::move(error)) {}  // NOLINT
  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  // Precondition: ok().
  [[nodiscard]] const Target& target() const noexcept { return *std::get_if<Target>(&v_); }
  // Null when ok().
  [[nodiscard]] const ResolveError* error() const noexcept {
    return std::get_if<ResolveError>(&v_);
  }

 private:
  std::variant<Target, ResolveError> v_;
};

class [[nodiscard]] Admission {
 public:
  Admission(GatewayPermit permit) noexcept : v_(std::move(permit)) {}    // NOLINT
  Admission(Rejection rejection) noexcept : v_(std::move(rejection)) {}  // NOLINT
  Admission(ResolveError error) : v_(std::move(error)) {}                // NOLINT

  [[nodiscard]] bool admitted() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return admitted(); }
  // Precondition: admitted().
  [[nodiscard]] GatewayPermit& permit() noexcept { return *std::get_if<GatewayPermit>(&v_); }
  // Null unless rejected.
  [[nodiscard]] const Rejection* rejection() const noexcept { return std::get_if<Rejection>(&v_); }
  [[nodiscard]] Rejection* rejection() noexcept { return std::get_if<Rejection>(&v_); }
  // Null unless the by-name path could not resolve the call.
  [[nodiscard]] const ResolveError* error() const noexcept {
    return std::get_if<ResolveError>(&v_);
  }

 private:
  std::variant<GatewayPermit, Rejection, ResolveError> v_;
};

}  // namespace sluice
