// gateway_rejection.h: why the gateway refused a call, as a value, and its HTTP rendering.
//
// What it is: a Rejection carries everything a problem+json response needs (type, title,
// status, detail, instance, upstream_id, host, limit_type, current_in_flight, max_concurrent,
// retry_after_seconds, trace_id). Building one on the reject path allocates nothing: the ids,
// host, type and title are views of strings the Gateway owns, and the detail text is composed
// only when rendered. `instance` and `trace_id` are filled by the caller when it knows them.
//
// Invariants: the string views stay valid as long as the Gateway that made the Rejection.
// Thread-safety: a plain value; render functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
  LimitLevel level = LimitLevel::kUpstream;
  RejectReason reason = RejectReason::kLimitReached;
  std::string_view type;
  std::string_view title;
  std::uint16_t status = 503;
  std::uint32_t retry_after_seconds = 1;
  std::string_view upstream_id;
  std::string_view host;
  std::string_view tenant_id;
  std::string_view route_id;  // empty unless the call named a route
  // The refusing level's count and max when it refused.
  std::uint32_t current_in_flight = 0;
  std::uint32_t max_concurrent = 0;
  // Set by the caller (request path, trace id) before rendering; empty fields are omitted.
  std::optional<std::string> instance;
  std::optional<std::string> trace_id;

  // E.g. "Upstream api.openai.com has reached max concurrent requests (100/100)".
  [[nodiscard]] std::string detail() const;
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

// The problem+json document of a rejection.
[[nodiscard]] std::string problem_json(const Rejection& rejection);

// status, Content-Type: application/problem+json, Retry-After, X-Sluice-Error-Source: gateway,
// and the problem+json body.
[[nodiscard]] HttpResponse to_http_response(const Rejection& rejection);

}  // namespace sluice
