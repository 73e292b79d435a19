// The refusal's renderings: problem_json() and to_http_response() (sluice/local/rejection.h) of a
// Rejection built from the input.
//
// Every text field is valid UTF-8, as every one the server fills is: they come from the config
// (whose loader refuses text that is not UTF-8), a JSON body or a protobuf string field (both
// validated on parsing).
//
// Invariants: the document parses as a JSON object with the rejection's type, title, status,
// detail and limit_type; `policy` iff one is set; the gateway's ids and reason iff the source is
// the gateway; limit/remaining for a rate refusal, else current_in_flight/max_concurrent;
// retry_after_seconds iff the call may ever pass, rounded up; instance, trace_id, tenant_id and
// route_id iff set. The HTTP response has the status, the problem+json content type, the
// source header, Retry-After iff retry_after_seconds, and the same body.
#include <fuzzer/FuzzedDataProvider.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.h"
#include "sluice/local/rejection.h"

namespace {

using nlohmann::json;
using sluice::Nanos;
using sluice::Rejection;
using sluice::fuzz::require;

// `s` with every byte that is not part of a well-formed UTF-8 sequence replaced by '?'.
std::string valid_utf8(std::string s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n != 0 && i + n <= s.size();
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1fu) : n == 3 ? (c & 0x0fu) : (c & 0x07u);
    for (std::size_t k = 1; ok && k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      ok = (d >> 6) == 2;
      cp = (cp << 6) | (d & 0x3fu);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    if (ok && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
               (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff))
      ok = false;
    if (!ok) {
      s[i] = '?';
      n = 1;
    }
    i += n;
  }
  return s;
}

std::string text(FuzzedDataProvider& in) { return valid_utf8(in.ConsumeRandomLengthString(64)); }

template <class T>
void require_field(const json& j, const char* name, const T& want) {
  require(j.contains(name), std::string("problem+json lacks ") + name + ": " + j.dump());
  require(j[name] == json(want), std::string("problem+json's ") + name + " is " + j[name].dump() +
                                     ", not " + json(want).dump());
}

void require_absent(const json& j, const char* name) {
  require(!j.contains(name), std::string("problem+json has ") + name + " unset: " + j.dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  // The strings a Rejection views, kept alive here.
  const std::string source = in.PickValueInArray<std::string>(
      {"gateway", "rate", "concurrency", std::string("gateway") + "x"});
  const std::string limit_type = in.ConsumeBool() ? text(in) : std::string();
  const std::string type = text(in), title = text(in), policy = text(in);
  const std::string upstream = text(in), host = text(in), tenant = text(in), route = text(in);
  Rejection r;
  r.source = source;
  r.level = static_cast<sluice::LimitLevel>(in.ConsumeIntegralInRange<int>(0, 4));
  r.reason = static_cast<sluice::RejectReason>(in.ConsumeIntegralInRange<int>(0, 2));
  r.limit_type = limit_type;
  r.type = type;
  r.title = title;
  r.status = in.ConsumeIntegral<std::uint16_t>();
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      r.retry_after = Nanos::max();
      break;
    case 1:
      r.retry_after =
          Nanos{in.ConsumeIntegralInRange<std::int64_t>(-1'000'000'000, 10'000'000'000)};
      break;
    default:
      r.retry_after = Nanos{in.ConsumeIntegral<std::int64_t>()};
      break;
  }
  r.policy = policy;
  r.upstream_id = upstream;
  r.host = host;
  r.tenant_id = tenant;
  r.route_id = route;
  r.current_in_flight = in.ConsumeIntegral<std::uint64_t>();
  r.max_concurrent = in.ConsumeIntegral<std::uint64_t>();
  if (in.ConsumeBool()) r.remaining = in.ConsumeIntegral<std::uint64_t>();
  if (in.ConsumeBool()) r.detail_text = text(in);
  if (in.ConsumeBool()) r.instance = text(in);
  if (in.ConsumeBool()) r.trace_id = text(in);

  const std::string doc = sluice::problem_json(r);
  const json j = json::parse(doc, nullptr, /*allow_exceptions=*/false);
  require(j.is_object(), "problem+json is not a JSON object: " + doc);
  require_field(j, "type", type);
  require_field(j, "title", title);
  require_field(j, "status", r.status);
  require_field(j, "detail", r.detail());
  require_field(j, "limit_type", std::string(r.limit_kind()));
  require(!r.limit_kind().empty(), "limit_kind() is never empty");
  if (policy.empty())
    require_absent(j, "policy");
  else
    require_field(j, "policy", policy);
  if (source == "gateway") {
    require_field(j, "upstream_id", upstream);
    require_field(j, "host", host);
    require_field(j, "reason", std::string(sluice::to_string(r.reason)));
  } else {
    require_absent(j, "upstream_id");
    require_absent(j, "reason");
  }
  if (r.remaining) {
    require_field(j, "limit", r.max_concurrent);
    require_field(j, "remaining", *r.remaining);
    require_absent(j, "current_in_flight");
  } else {
    require_field(j, "current_in_flight", r.current_in_flight);
    require_field(j, "max_concurrent", r.max_concurrent);
    require_absent(j, "remaining");
  }
  const std::optional<std::uint64_t> retry = r.retry_after_seconds();
  if (r.retry_after == Nanos::max()) {
    require(!retry.has_value(), "never is no Retry-After");
    require_absent(j, "retry_after_seconds");
  } else {
    // Rounded up to whole seconds; a negative wait is 0.
    const std::int64_t ns = std::max<std::int64_t>(0, r.retry_after.count());
    const std::uint64_t want =
        static_cast<std::uint64_t>(ns / 1'000'000'000 + (ns % 1'000'000'000 != 0 ? 1 : 0));
    require(retry == want, "retry_after_seconds() is " +
                               (retry ? std::to_string(*retry) : std::string("none")) + ", not " +
                               std::to_string(want));
    require_field(j, "retry_after_seconds", want);
  }
  if (r.instance)
    require_field(j, "instance", *r.instance);
  else
    require_absent(j, "instance");
  if (r.trace_id)
    require_field(j, "trace_id", *r.trace_id);
  else
    require_absent(j, "trace_id");
  if (tenant.empty())
    require_absent(j, "tenant_id");
  else
    require_field(j, "tenant_id", tenant);
  if (route.empty())
    require_absent(j, "route_id");
  else
    require_field(j, "route_id", route);

  const sluice::HttpResponse res = sluice::to_http_response(r);
  require(res.status == r.status, "the response's status is the rejection's");
  require(res.header("content-type") == "application/problem+json", "problem+json content type");
  require(res.header("X-Sluice-Error-Source") == source, "X-Sluice-Error-Source is the source");
  const std::string_view retry_header = res.header("Retry-After");
  if (retry)
    require(retry_header == std::to_string(*retry), "Retry-After is retry_after_seconds");
  else
    require(retry_header.empty(), "no Retry-After when the call can never pass");
  require(res.body == doc, "the response's body is problem_json()");
  return 0;
}
