// rejection.h: why a call was not admitted, as one value, and its one rendering.
//
// What it is: a Rejection carries everything a problem+json response needs, whoever refused:
// a gateway level (tenant, upstream, binding, per-tenant, route), a server's rate policy (429)
// or an adaptive or fleet policy's concurrency limit (503). problem_json() and
// to_http_response() are the only renderings: the gateway library, the server's HTTP mirror, its
// gRPC replies (which carry the problem+json) and the CLI all show the same document, the same
// Retry-After and the same X-Sluice-Error-Source.
//
// Building one on the gateway's reject path allocates nothing: the ids, host, type and title are
// views of strings the Gateway owns, and the detail text is composed only when rendered. A
// server policy may give its detail as text instead (`detail_text`). `instance` and `trace_id`
// are filled by the caller when it knows them.
//
// Invariants: the string views stay valid as long as whatever made the Rejection (a Gateway, a
// server policy) does.
// Thread-safety: a plain value; render functions are pure.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"

namespace sluice {

// The level that refused, in acquisition order.
enum class LimitLevel : std::uint8_t {
  kTenant,     // the tenant's global_concurrency_limit
  kUpstream,   // the upstream pool (shared, or a private binding's own pool)
  kBinding,    // a descendant's stricter limit on a shared pool
  kPerTenant,  // the upstream's per_tenant_max
  kRoute,      // the route's max_concurrent
};
inline constexpr std::size_t kLimitLevelCount = 5;

// "tenant", "upstream", "binding", "per_tenant", "route": the `limit_type` field and the
// `level` metric label.
[[nodiscard]] std::string_view to_string(LimitLevel level) noexcept;

enum class RejectReason : std::uint8_t {
  kLimitReached,  // the level was at its max
  kQueueFull,     // the upstream was at its max and its queue at max_depth
  kQueueTimeout,  // waited in the upstream's queue past its timeout
};
[[nodiscard]] std::string_view to_string(RejectReason reason) noexcept;

struct Rejection {
  // What refused, sent as X-Sluice-Error-Source: "gateway" (a gateway level), "rate" (a rate
  // policy), "concurrency" (an adaptive or fleet policy's limit).
  std::string_view source = "gateway";
  LimitLevel level = LimitLevel::kUpstream;  // source "gateway": the level that refused
  RejectReason reason = RejectReason::kLimitReached;
  // The `limit_type` field; empty: the gateway level's name (to_string(level)).
  std::string_view limit_type;
  std::string_view type;
  std::string_view title;
  std::uint16_t status = 503;
  // When the same call may pass; Nanos::max(): never (more hits than the limit itself).
  Nanos retry_after = std::chrono::seconds(1);
  std::string_view policy;  // the server policy that refused; empty in the library
  std::string_view upstream_id;
  std::string_view host;
  std::string_view tenant_id;
  std::string_view route_id;  // empty unless the call named a route
  // The refusing limit's count and max when it refused (a rate policy: hits spent, the limit).
  std::uint64_t current_in_flight = 0;
  std::uint64_t max_concurrent = 0;
  // A rate policy's budget left in the window (shown as `remaining`).
  std::optional<std::uint64_t> remaining;
  // The detail as given; empty: composed from the gateway fields.
  std::string detail_text;
  // How long the call waited in a queue before this refusal (shown as `waited_seconds`); unset:
  // it did not wait.
  std::optional<Nanos> waited;
  // Set by the caller (request path, trace id) before rendering; empty fields are omitted.
  std::optional<std::string> instance;
  std::optional<std::string> trace_id;

  // detail_text, or e.g. "Upstream api.openai.com has reached max concurrent requests (100/100)".
  [[nodiscard]] std::string detail() const;
  // `limit_type`, or the gateway level's name.
  [[nodiscard]] std::string_view limit_kind() const noexcept;
  // Retry-After in whole seconds (rounded up); nullopt when the call can never pass.
  [[nodiscard]] std::optional<std::uint64_t> retry_after_seconds() const noexcept;
};

struct HttpHeader {
  std::string name;
  std::string value;
};

struct HttpResponse {
  std::uint16_t status = 503;
  std::vector<HttpHeader> headers;
  std::string body;
  // The value of the first header named `name` (ASCII case-insensitive), or empty.
  [[nodiscard]] std::string_view header(std::string_view name) const noexcept;
};

// The problem+json document (RFC 9457) of a rejection: type, title, status, detail, limit_type,
// retry_after_seconds (unless never), waited_seconds (when it waited), policy (when set), the
// counts its source has
// (current_in_flight and max_concurrent; a rate policy: limit and remaining), the gateway's ids,
// instance and trace_id.
[[nodiscard]] std::string problem_json(const Rejection& rejection);

// status, Content-Type: application/problem+json, Retry-After (unless never),
// X-Sluice-Error-Source (the rejection's source), and the problem+json body.
[[nodiscard]] HttpResponse to_http_response(const Rejection& rejection);

}  // namespace sluice
