#include "client.h"

#include <fmt/core.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/config/config.h"
#include "sluice/v1/sluice.grpc.pb.h"
#include "transport/wire.h"

namespace sluice::cli {
namespace {

namespace pb = sluice::v1;
using nlohmann::json;

using transport::is_never;
using transport::seconds_of;
using transport::to_proto;

// A gRPC status code by its name in the gRPC spec ("NOT_FOUND"), as gRPC tools print it.
std::string_view code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::DO_NOT_USE:
      break;
  }
  return "UNKNOWN";
}

int failed(const grpc::Status& s, const ClientOptions& o) {
  fmt::print(stderr, "sluice: {} ({}): {}\n", o.server, code_name(s.error_code()),
             s.error_message());
  return 2;
}

// A Duration as people read it ("30s", "1.5s", "250ms"); "never" for the wire's never.
std::string duration_text(const google::protobuf::Duration& d) {
  if (is_never(d)) return "never";
  return format_duration(Nanos{std::chrono::seconds(d.seconds())} + Nanos{d.nanos()});
}

// One call to the server: a stub, a context with the options' deadline, the call. A failed call
// is printed and gives nullopt (the command then exits 2).
template <class Response, class Request>
std::optional<Response> call(const ClientOptions& o,
                             grpc::Status (pb::Sluice::Stub::*method)(grpc::ClientContext*,
                                                                      const Request&, Response*),
                             const Request& request) {
  auto stub =
      pb::Sluice::NewStub(grpc::CreateChannel(o.server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(static_cast<std::int64_t>(o.timeout_seconds * 1e6)));
  Response response;
  const grpc::Status s = ((*stub).*method)(&ctx, request, &response);
  if (!s.ok()) {
    failed(s, o);
    return std::nullopt;
  }
  return response;
}

// A duration option ("250ms", "30s") into `out`; empty text leaves it unset. False (with the
// error printed) when malformed.
bool duration_arg(const std::string& text, const char* name, std::optional<Nanos>& out) {
  if (text.empty()) return true;
  out = parse_duration(text);
  if (!out)
    fmt::print(stderr, "sluice: --{}: '{}' is not a duration (e.g. 250ms, 30s)\n", name, text);
  return out.has_value();
}

json decision_json(const pb::Decision& d) {
  json j = {{"allowed", d.allowed()},
            {"limit", d.limit()},
            {"remaining", d.remaining()},
            {"reset_after_seconds", seconds_of(d.reset_after())},
            // never: null, as over HTTP
            {"retry_after_seconds",
             is_never(d.retry_after()) ? json(nullptr) : json(seconds_of(d.retry_after()))}};
  if (!d.reason().empty()) j["reason"] = d.reason();
  if (!d.detail().empty()) j["detail"] = d.detail();
  if (d.would_deny()) j["would_deny"] = true;
  return j;
}

json charge_json(const pb::ChargeResponse& c) {
  return {{"limit", c.limit()},
          {"remaining", c.remaining()},
          {"overdraft", c.overdraft()},
          {"pending", c.pending()},
          {"reset_after_seconds", seconds_of(c.reset_after())},
          {"retry_after_seconds", seconds_of(c.retry_after())}};
}

// "12 of 100 remaining (full again in 40s)", or what is overdrawn and until when.
std::string charge_text(const pb::ChargeResponse& c) {
  std::string text = fmt::format("{} of {} remaining", c.remaining(), c.limit());
  if (c.overdraft() > 0)
    text += fmt::format(", {} over the limit: checks pass again in {}", c.overdraft(),
                        duration_text(c.retry_after()));
  if (c.pending() > 0) text += fmt::format(", {} being taken from the global budget", c.pending());
  return text + fmt::format(" (full again in {})", duration_text(c.reset_after()));
}

// The table's columns that depend on the kind. A rate policy holds no leases, and its limit is
// hits per period; a concurrency policy has no single limit (each tenant, upstream, binding and
// route has its own), so its LIMIT is "-" and its NOTE says why.
struct PolicyRow {
  std::string in_flight, limit, note;
};

PolicyRow policy_row(const pb::PolicyState& p) {
  const json state = json::parse(p.state_json(), nullptr, false);
  const auto number = [&](const char* key) {
    return state.is_object() && state.contains(key) && state[key].is_number()
               ? std::optional<double>(state[key].get<double>())
               : std::nullopt;
  };
  PolicyRow row{std::to_string(p.in_flight()), std::to_string(p.limit()), ""};
  if (p.kind() == "rate") {
    row.in_flight = "-";
    if (const auto period = number("period_seconds"))
      row.note = "per " + format_duration(Nanos{std::llround(*period * 1e9)});
    if (const auto burst = number("burst"))
      row.note += fmt::format("{}burst {}", row.note.empty() ? "" : ", ", *burst);
  } else if (p.kind() == "federated") {
    row.in_flight = "-";
    if (const auto window = number("window_seconds"))
      row.note = "per " + format_duration(Nanos{std::llround(*window * 1e9)}) + " in all regions";
    if (state.is_object() && state.contains("region") && state["region"].is_string())
      row.note += fmt::format(" (this one: {})", state["region"].get<std::string>());
  } else if (p.kind() == "concurrency") {
    row.limit = "-";
    row.note = "a limit per tenant, upstream, binding and route (see its config)";
  } else if (p.kind() == "throttler") {
    // Each metric's worst host against its threshold ("load 1.85/32").
    row.in_flight = "-";
    row.limit = "-";
    if (state.is_object() && state.contains("metrics") && state["metrics"].is_array())
      for (const json& m : state["metrics"]) {
        double worst = 0;
        bool failed = false;
        for (const json& h : m.value("hosts", json::array())) {
          worst = std::max(worst, h.value("value", 0.0));
          failed = failed || h.contains("error");
        }
        row.note += fmt::format("{}{} {}{}/{}", row.note.empty() ? "" : ", ",
                                m.value("name", std::string("?")), failed ? "failed " : "", worst,
                                m.value("threshold", 0.0));
      }
  }
  return row;
}

}  // namespace

int run_check(const ClientOptions& o, const CheckArgs& a) {
  pb::CheckRequest req;
  req.set_policy(a.policy);
  req.set_key(a.key);
  req.set_hits(a.hits);
  const auto resp = call(o, a.peek ? &pb::Sluice::Stub::Peek : &pb::Sluice::Stub::Check, req);
  if (!resp) return 2;
  const pb::Decision& d = resp->decision();
  if (o.json) {
    fmt::print("{}\n", decision_json(d).dump());
  } else if (d.would_deny()) {
    fmt::print("allowed in shadow: the policy would deny it; retry after {}{}\n",
               duration_text(d.retry_after()),
               d.reason().empty() ? "" : fmt::format(" ({})", d.reason()));
  } else if (d.allowed()) {
    fmt::print("allowed: {} of {} remaining (full again in {})\n", d.remaining(), d.limit(),
               duration_text(d.reset_after()));
  } else if (is_never(d.retry_after())) {
    fmt::print("denied: {} hits can never pass (the limit is {})\n", a.hits, d.limit());
  } else {
    fmt::print("denied: {} of {} remaining; retry after {}{}\n", d.remaining(), d.limit(),
               duration_text(d.retry_after()),
               d.reason().empty() ? "" : fmt::format(" ({})", d.reason()));
    if (!d.detail().empty()) fmt::print("{}\n", d.detail());
  }
  return d.allowed() ? 0 : 1;
}

int run_admit(const ClientOptions& o, const AdmitArgs& a) {
  pb::AdmitRequest req;
  req.set_policy(a.policy);
  req.set_key(a.key);
  req.set_tenant(a.tenant);
  req.set_upstream(a.upstream);
  req.set_route(a.route);
  for (const std::string& node : a.exclude) req.add_exclude(node);
  for (const std::string& nv : a.attributes) {
    const std::size_t eq = nv.find('=');
    if (eq == std::string::npos || eq == 0) {
      fmt::print(stderr, "sluice: --attribute: '{}' is not name=value\n", nv);
      return 2;
    }
    pb::Attribute* at = req.add_attributes();
    at->set_name(nv.substr(0, eq));
    at->set_value(nv.substr(eq + 1));
  }
  std::optional<Nanos> ttl;
  if (!duration_arg(a.ttl, "ttl", ttl)) return 2;
  if (ttl) to_proto(*ttl, req.mutable_ttl());
  std::optional<Nanos> max_wait;
  if (!duration_arg(a.max_wait, "max-wait", max_wait)) return 2;
  if (max_wait) to_proto(*max_wait, req.mutable_max_wait());
  const auto reply = call(o, &pb::Sluice::Stub::Admit, req);
  if (!reply) return 2;
  const pb::AdmitResponse& resp = *reply;
  if (o.json) {
    json j = {{"admitted", resp.admitted()}};
    if (resp.has_waited()) j["waited_seconds"] = seconds_of(resp.waited());
    if (resp.admitted()) {
      j["lease_id"] = resp.lease_id();
      j["ttl_seconds"] = seconds_of(resp.ttl());
      if (!resp.chosen().empty()) j["chosen"] = resp.chosen();
      for (const pb::Attribute& at : resp.attributes()) {
        json& v = j["attributes"][at.name()];
        if (v.is_null())
          v = at.value();
        else if (v.is_array())
          v.push_back(at.value());
        else
          v = json::array({v, at.value()});
      }
      if (resp.has_call_deadline()) j["call_deadline_seconds"] = seconds_of(resp.call_deadline());
    }
    if (resp.would_deny()) j["would_deny"] = true;
    if (!resp.admitted() || resp.would_deny()) {
      j["rejection"] = json::parse(resp.rejection().problem_json(), nullptr, false);
    }
    fmt::print("{}\n", j.dump());
  } else if (resp.admitted()) {
    fmt::print("{}\n", resp.lease_id());
    fmt::print(stderr, "admitted: lease {} for {} (release it with: sluice release {})\n",
               resp.lease_id(), duration_text(resp.ttl()), resp.lease_id());
    if (!resp.chosen().empty()) fmt::print(stderr, "chosen node: {}\n", resp.chosen());
    for (const pb::Attribute& at : resp.attributes())
      fmt::print(stderr, "{}: {}\n", at.name(), at.value());
    if (resp.has_waited())
      fmt::print(stderr, "waited {} in the queue\n", duration_text(resp.waited()));
    if (resp.has_call_deadline())
      fmt::print(stderr, "the call must end within {} (the fleet's call deadline)\n",
                 duration_text(resp.call_deadline()));
    if (resp.would_deny())
      fmt::print(stderr, "in shadow: the policy would have refused it ({} {}): {}\n",
                 resp.rejection().status(), resp.rejection().title(), resp.rejection().detail());
  } else {
    const pb::Rejection& r = resp.rejection();
    fmt::print("refused ({} {}): {}; retry after {}{}\n", r.status(), r.title(), r.detail(),
               duration_text(r.retry_after()),
               resp.has_waited()
                   ? fmt::format(" (waited {} in the queue)", duration_text(resp.waited()))
                   : std::string());
  }
  return resp.admitted() ? 0 : 1;
}

int run_release(const ClientOptions& o, const ReleaseArgs& a) {
  pb::ReleaseRequest req;
  req.set_lease_id(a.lease_id);
  const StatusOr<server::CallResult> outcome = transport::call_result_of(a.outcome, "--outcome");
  if (!outcome.ok()) {
    fmt::print(stderr, "sluice: {}\n", outcome.status().message());
    return 2;
  }
  req.set_outcome(transport::to_proto(outcome.value()));
  std::optional<Nanos> rtt;
  if (!duration_arg(a.rtt, "rtt", rtt)) return 2;
  if (rtt) to_proto(*rtt, req.mutable_rtt());
  if (a.cost) req.set_cost(*a.cost);
  const auto resp = call(o, &pb::Sluice::Stub::Release, req);
  if (!resp) return 2;
  if (o.json) {
    json j = {{"released", true}, {"held_seconds", seconds_of(resp->held())}};
    if (resp->has_charged()) j["charged"] = charge_json(resp->charged());
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("released after {}\n", duration_text(resp->held()));
    if (resp->has_charged()) fmt::print("{}\n", charge_text(resp->charged()));
  }
  return 0;
}

int run_charge(const ClientOptions& o, const ChargeArgs& a) {
  pb::ChargeRequest req;
  req.set_policy(a.policy);
  req.set_key(a.key);
  req.set_hits(a.hits);
  const auto resp = call(o, &pb::Sluice::Stub::Charge, req);
  if (!resp) return 2;
  if (o.json)
    fmt::print("{}\n", charge_json(*resp).dump());
  else
    fmt::print("{} {} hits: {}\n", a.hits > 0 ? "charged" : "gave back",
               a.hits > 0 ? a.hits : -a.hits, charge_text(*resp));
  return 0;
}

int run_heartbeat(const ClientOptions& o, const std::string& lease_id, const std::string& ttl) {
  pb::HeartbeatRequest req;
  req.set_lease_id(lease_id);
  std::optional<Nanos> extend_by;
  if (!duration_arg(ttl, "ttl", extend_by)) return 2;
  if (extend_by) to_proto(*extend_by, req.mutable_ttl());
  const auto resp = call(o, &pb::Sluice::Stub::Heartbeat, req);
  if (!resp) return 2;
  if (o.json)
    fmt::print("{}\n", json{{"extended", true}, {"ttl_seconds", seconds_of(resp->ttl())}}.dump());
  else
    fmt::print("lease extended: expires in {}\n", duration_text(resp->ttl()));
  return 0;
}

int run_policies(const ClientOptions& o) {
  const auto reply = call(o, &pb::Sluice::Stub::ListPolicies, pb::ListPoliciesRequest{});
  if (!reply) return 2;
  const pb::ListPoliciesResponse& resp = *reply;
  if (o.json) {
    json ps = json::array();
    for (const auto& p : resp.policies()) ps.push_back(json::parse(p.state_json(), nullptr, false));
    fmt::print("{}\n", json{{"generation", resp.config_generation()},
                            {"leases", resp.leases()},
                            {"policies", std::move(ps)}}
                           .dump());
    return 0;
  }
  const auto print_row = [](std::string_view name, std::string_view kind,
                            std::string_view in_flight, std::string_view limit,
                            std::string_view rate, std::string_view note) {
    std::string line = fmt::format("{:<20} {:<12} {:>10} {:>10}  {:<10}  {}", name, kind, in_flight,
                                   limit, rate, note);
    line.erase(line.find_last_not_of(' ') + 1);
    fmt::print("{}\n", line);
  };
  print_row("POLICY", "KIND", "IN_FLIGHT", "LIMIT", "RATE", "NOTE");
  for (const auto& p : resp.policies()) {
    const PolicyRow row = policy_row(p);
    print_row(p.name(), p.kind(), row.in_flight, row.limit, p.rate().empty() ? "-" : p.rate(),
              row.note);
  }
  fmt::print("config generation {}, {} lease(s) held\n", resp.config_generation(), resp.leases());
  return 0;
}

}  // namespace sluice::cli
