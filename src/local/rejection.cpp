#include "sluice/local/rejection.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <nlohmann/json.hpp>

namespace sluice {
namespace {

// Appended piece by piece: `"(" + std::to_string(...)` trips g++ 12's bogus -Wrestrict at -O3
// (GCC bug 105651).
std::string counts(const Rejection& r) {
  std::string out = "(";
  out += std::to_string(r.current_in_flight);
  out += '/';
  out += std::to_string(r.max_concurrent);
  out += ')';
  return out;
}

std::string limit_detail(const Rejection& r) {
  const std::string host(r.host);
  const std::string tenant(r.tenant_id);
  switch (r.level) {
    case LimitLevel::kTenant:
      return "Tenant " + tenant + " has reached max concurrent requests " + counts(r);
    case LimitLevel::kUpstream:
      return "Upstream " + host + " has reached max concurrent requests " + counts(r);
    case LimitLevel::kBinding:
      return "Tenant " + tenant + " has reached its max concurrent requests to upstream " + host +
             " " + counts(r);
    case LimitLevel::kPerTenant:
      return "Tenant " + tenant + " has reached max concurrent requests per tenant on upstream " +
             host + " " + counts(r);
    case LimitLevel::kRoute:
      return "Route " + std::string(r.route_id) + " of upstream " + host +
             " has reached max concurrent requests " + counts(r);
  }
  return {};
}

bool iequals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  });
}

}  // namespace

std::string_view to_string(LimitLevel level) noexcept {
  switch (level) {
    case LimitLevel::kTenant:
      return "tenant";
    case LimitLevel::kUpstream:
      return "upstream";
    case LimitLevel::kBinding:
      return "binding";
    case LimitLevel::kPerTenant:
      return "per_tenant";
    case LimitLevel::kRoute:
      return "route";
  }
  return "unknown";
}

std::string_view to_string(RejectReason reason) noexcept {
  switch (reason) {
    case RejectReason::kLimitReached:
      return "limit_reached";
    case RejectReason::kQueueFull:
      return "queue_full";
    case RejectReason::kQueueTimeout:
      return "queue_timeout";
  }
  return "unknown";
}

std::string Rejection::detail() const {
  if (!detail_text.empty()) return detail_text;
  const std::string host(this->host);
  switch (reason) {
    case RejectReason::kLimitReached:
      return limit_detail(*this);
    case RejectReason::kQueueFull:
      return "Upstream " + host + " has reached max concurrent requests " + counts(*this) +
             " and its queue is full";
    case RejectReason::kQueueTimeout:
      return "Upstream " + host + " has reached max concurrent requests " + counts(*this) +
             " and the wait in its queue timed out";
  }
  return {};
}

std::string_view Rejection::limit_kind() const noexcept {
  return limit_type.empty() ? to_string(level) : limit_type;
}

std::optional<std::uint64_t> Rejection::retry_after_seconds() const noexcept {
  if (retry_after == Nanos::max()) return std::nullopt;
  const std::int64_t ns = std::max<std::int64_t>(0, retry_after.count());
  // Rounded up without ns + 999'999'999, which overflows within a second of Nanos::max().
  return static_cast<std::uint64_t>(ns / 1'000'000'000 + (ns % 1'000'000'000 != 0 ? 1 : 0));
}

std::string problem_json(const Rejection& r) {
  nlohmann::json j = {{"type", r.type},
                      {"title", r.title},
                      {"status", r.status},
                      {"detail", r.detail()},
                      {"limit_type", r.limit_kind()}};
  if (!r.policy.empty()) j["policy"] = r.policy;
  if (r.source == "gateway") {
    j["upstream_id"] = r.upstream_id;
    j["host"] = r.host;
    j["reason"] = to_string(r.reason);
  }
  if (r.remaining) {
    j["limit"] = r.max_concurrent;
    j["remaining"] = *r.remaining;
  } else {
    j["current_in_flight"] = r.current_in_flight;
    j["max_concurrent"] = r.max_concurrent;
  }
  if (const auto s = r.retry_after_seconds()) j["retry_after_seconds"] = *s;
  if (r.waited) j["waited_seconds"] = std::chrono::duration<double>(*r.waited).count();
  if (r.instance) j["instance"] = *r.instance;
  if (r.trace_id) j["trace_id"] = *r.trace_id;
  if (!r.tenant_id.empty()) j["tenant_id"] = r.tenant_id;
  if (!r.route_id.empty()) j["route_id"] = r.route_id;
  // A tenant or route id that is not UTF-8 is written with U+FFFD, never an exception.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpResponse to_http_response(const Rejection& r) {
  HttpResponse out;
  out.status = r.status;
  out.headers.push_back({"Content-Type", "application/problem+json"});
  if (const auto s = r.retry_after_seconds())
    out.headers.push_back({"Retry-After", std::to_string(*s)});
  out.headers.push_back({"X-Sluice-Error-Source", std::string(r.source)});
  out.body = problem_json(r);
  return out;
}

std::string_view HttpResponse::header(std::string_view name) const noexcept {
  for (const HttpHeader& h : headers)
    if (iequals(h.name, name)) return h.value;
  return {};
}

}  // namespace sluice
