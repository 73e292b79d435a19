// The gRPC API without a channel: GrpcService's methods called directly over a fresh Engine
// (fuzz_support.h), each with a CallbackServerContext whose default reactor is in gRPC's test
// mode (grpcpp/test/default_reactor_test_peer.h), so the status the service finishes with is
// seen here; Admit answers on a reactor of its own, whose status the service's on_admit_finish
// hook tells.
//
// An input is a sequence of records: a byte (low 3 bits: the call: Check, Peek, CheckMany,
// Admit, Release, Heartbeat, ListPolicies, and 7 the throttler kind's own method
// sluice.v1.Throttler/Check, called as GrpcKindMethods calls it; bit 3 set: Charge, whatever the
// low bits; bits 4-5: how far the clock moves
// first: 0, 10ms, 1s, 2m), a two-byte little-endian length and that many bytes: the raw request, as
// the service receives it (it decodes requests itself: bytes that do not decode must be
// INVALID_ARGUMENT). A Release or Heartbeat whose lease_id is "LEASE" gets the last lease an admit
// returned (lease ids are random).
//
// Invariants: every call finishes inline (these policies never defer) with OK or a code the
// API documents (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE), with a
// message when not OK; an admitted Admit has a lease id and a positive TTL, a refused one a
// rejection of status 429 or 503 whose problem_json parses and carries that status; a
// CheckMany's decisions never outnumber its checks, and it is allowed iff its denied_index is
// -1; an OK Release reports how long it was held; an OK Charge leaves no more remaining than
// its limit, and nothing remaining while overdrawn; ListPolicies counts the engine's leases; the
// engine's lease count is always admits minus releases and expiries; and after the input, the
// listings still answer (fuzz_support.h: check_listings).
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/test/default_reactor_test_peer.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "sluice/v1/sluice.pb.h"
#include "transport/grpc_service.h"

namespace {

namespace pb = sluice::v1;
using sluice::fuzz::EngineUnderTest;
using sluice::fuzz::require;
using sluice::transport::GrpcService;

constexpr std::string_view kLeasePlaceholder = "LEASE";

// Calls `method` on the service with `bytes` as the raw request and a test-mode context;
// returns the status it finished with (the response decoded into `resp` when OK). Bytes that
// do not decode as the request must be INVALID_ARGUMENT, never anything else.
template <class Req, class Resp>
grpc::Status call(GrpcService& service,
                  grpc::ServerUnaryReactor* (GrpcService::*method)(grpc::CallbackServerContext*,
                                                                   const grpc::ByteBuffer*,
                                                                   grpc::ByteBuffer*),
                  std::string_view bytes, Resp& resp, const char* name) {
  Req req;
  const bool decodes = req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  grpc::Slice slice(bytes.data(), bytes.size());
  const grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  grpc::CallbackServerContext ctx;
  std::optional<grpc::Status> finished;
  grpc::testing::DefaultReactorTestPeer peer(&ctx, [&finished](grpc::Status s) { finished = s; });
  const bool admit = method == &GrpcService::Admit;
  // Admit answers on a reactor of its own; the service tells its status through a hook.
  if (admit) service.on_admit_finish([&finished](const grpc::Status& s) { finished = s; });
  grpc::ServerUnaryReactor* reactor = (service.*method)(&ctx, &in, &out);
  require(admit ? reactor != peer.reactor() : reactor == peer.reactor(),
          std::string(name) +
              (admit ? " answers on a reactor of its own" : " answers on the default reactor"));
  require(finished.has_value(), std::string(name) + " must finish inline");
  if (admit) {
    service.on_admit_finish(nullptr);
    reactor->OnDone();  // no call holds it: its end, which frees it
  }
  const grpc::Status& s = *finished;
  if (!decodes) {
    require(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT && !s.error_message().empty(),
            std::string(name) + ": undecodable bytes must be INVALID_ARGUMENT, got " +
                std::to_string(static_cast<int>(s.error_code())) + ": " + s.error_message());
    return s;
  }
  switch (s.error_code()) {
    case grpc::StatusCode::OK: {
      grpc::ByteBuffer copy(out);
      require(grpc::SerializationTraits<Resp>::Deserialize(&copy, &resp).ok(),
              std::string(name) + ": the response decodes");
      break;
    }
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::UNAVAILABLE:
      require(!s.error_message().empty(), std::string(name) + ": an error without a message");
      break;
    default:
      require(false, std::string(name) + " finished with code " +
                         std::to_string(static_cast<int>(s.error_code())) + ": " +
                         s.error_message() + "\nrequest: " + req.ShortDebugString());
  }
  return s;
}

// `bytes` with a Release's or Heartbeat's lease_id "LEASE" replaced by the last lease admitted.
template <class Req>
std::string with_lease(EngineUnderTest& t, std::string_view bytes) {
  Req req;
  if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) ||
      req.lease_id() != kLeasePlaceholder)
    return std::string(bytes);
  req.set_lease_id(t.last_lease());
  return req.SerializeAsString();
}

// A kind method's deferral: the methods fuzzed here answer inline, never defer.
class NoDeferral final : public sluice::server::Deferral<std::string> {
 public:
  sluice::server::Completion<std::string> defer() override {
    require(false, "a kind method deferred its answer");
    return [](sluice::StatusOr<std::string>) {};
  }
};

void check_decision(const pb::Decision& d, const char* name) {
  require(d.allowed() || d.has_retry_after(), std::string(name) + ": a denial has a retry_after");
}

void run_record(EngineUnderTest& t, GrpcService& service, unsigned what, std::string_view bytes) {
  switch (what) {
    case 0:
    case 1: {
      pb::CheckResponse resp;
      const bool peek = what == 1;
      const grpc::Status s =
          peek ? call<pb::CheckRequest>(service, &GrpcService::Peek, bytes, resp, "Peek")
               : call<pb::CheckRequest>(service, &GrpcService::Check, bytes, resp, "Check");
      if (s.ok()) {
        require(resp.has_decision(), "an OK check has a decision");
        check_decision(resp.decision(), "Check");
      }
      break;
    }
    case 2: {
      pb::CheckManyRequest req;
      const bool decodes = req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
      pb::CheckManyResponse resp;
      if (call<pb::CheckManyRequest>(service, &GrpcService::CheckMany, bytes, resp, "CheckMany")
              .ok() &&
          decodes) {
        require(resp.decisions_size() <= req.checks_size(),
                "CheckMany: more decisions than checks");
        require(resp.allowed() == (resp.denied_index() == -1),
                "CheckMany: allowed iff denied_index is -1");
        if (!resp.allowed())
          require(resp.denied_index() >= 0 && resp.denied_index() < resp.decisions_size() &&
                      !resp.decisions(resp.denied_index()).allowed(),
                  "CheckMany: denied_index names a denied decision");
        for (const pb::Decision& d : resp.decisions()) check_decision(d, "CheckMany");
      }
      break;
    }
    case 3: {
      pb::AdmitResponse resp;
      if (!call<pb::AdmitRequest>(service, &GrpcService::Admit, bytes, resp, "Admit").ok()) break;
      if (resp.admitted()) {
        require(resp.ttl().seconds() > 0 || resp.ttl().nanos() > 0, "a lease has a TTL");
        t.admitted(resp.lease_id());
      } else {
        const pb::Rejection& r = resp.rejection();
        require(r.status() == 429 || r.status() == 503, "a refusal is 429 or 503");
        const auto j = nlohmann::json::parse(r.problem_json(), nullptr, false);
        require(j.is_object() && j.value("status", 0u) == r.status() &&
                    j.value("detail", "") == r.detail() && j.value("title", "") == r.title(),
                "a refusal's problem_json agrees with its fields: " + r.problem_json());
      }
      break;
    }
    case 4: {
      const std::string req = with_lease<pb::ReleaseRequest>(t, bytes);
      pb::ReleaseResponse resp;
      if (call<pb::ReleaseRequest>(service, &GrpcService::Release, req, resp, "Release").ok()) {
        require(resp.has_held(), "an OK Release says how long the lease was held");
        t.released();
      }
      break;
    }
    case 5: {
      const std::string req = with_lease<pb::HeartbeatRequest>(t, bytes);
      pb::HeartbeatResponse resp;
      if (call<pb::HeartbeatRequest>(service, &GrpcService::Heartbeat, req, resp, "Heartbeat").ok())
        require(resp.has_ttl(), "an OK Heartbeat gives the TTL");
      break;
    }
    case 8: {
      pb::ChargeResponse resp;
      if (call<pb::ChargeRequest>(service, &GrpcService::Charge, bytes, resp, "Charge").ok()) {
        require(resp.remaining() <= resp.limit(), "Charge: more remaining than the limit");
        require(resp.overdraft() == 0 || resp.remaining() == 0,
                "Charge: overdrawn with hits remaining");
      }
      break;
    }
    case 7: {
      // A kind's own method, as GrpcKindMethods passes it: sluice.v1.Throttler/Check, whose
      // request the throttler kind decodes with the generated message (the api layer).
      const auto* m = t.engine().kinds().method("/sluice.v1.Throttler/Check");
      require(m != nullptr, "the throttler kind registers /sluice.v1.Throttler/Check");
      NoDeferral later;
      const auto r = m->method.handle(std::string(bytes), *t.engine().policies_of(m->kind), later);
      require(r.has_value(), "Throttler/Check answers inline");
      if (r->ok()) {
        pb::ThrottlerCheckResponse resp;
        require(resp.ParseFromString(r->value()), "Throttler/Check: the response decodes");
        require(resp.status_code() == 200 || resp.status_code() == 429 ||
                    resp.status_code() == 417 || resp.status_code() == 404,
                "Throttler/Check: a status the API documents, got " +
                    std::to_string(resp.status_code()));
        pb::ThrottlerCheckRequest req;
        if (req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
          require(req.app().empty() || resp.app() == req.app(),
                  "Throttler/Check answers for the app asked");
      } else {
        const auto code = r->status().code();
        require((code == sluice::StatusCode::kInvalidArgument ||
                 code == sluice::StatusCode::kNotFound) &&
                    !r->status().message().empty(),
                "Throttler/Check: an error is INVALID_ARGUMENT or NOT_FOUND with a message, got " +
                    r->status().to_string());
      }
      break;
    }
    default: {
      pb::ListPoliciesRequest req;
      if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        pb::ListPoliciesResponse ignored;
        (void)call<pb::ListPoliciesRequest>(service, &GrpcService::ListPolicies, bytes, ignored,
                                            "ListPolicies");
        break;
      }
      pb::ListPoliciesResponse resp;
      require(call<pb::ListPoliciesRequest>(service, &GrpcService::ListPolicies, bytes, resp,
                                            "ListPolicies")
                  .ok(),
              "ListPolicies always answers");
      require(resp.leases() == t.engine().leases(), "ListPolicies counts the engine's leases");
      require(
          resp.policies_size() == static_cast<int>(sluice::fuzz::engine_config().policies.size()),
          "ListPolicies lists every policy");
      break;
    }
  }
}

}  // namespace

// Invalid UTF-8 in a string field fails the parse, as it should; protobuf would also log each.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  EngineUnderTest t;
  GrpcService service(t.engine());
  for (int n = 0; n < 64 && in.size() >= 3; ++n) {
    const auto head = static_cast<unsigned char>(in[0]);
    const std::size_t len = static_cast<unsigned char>(in[1]) |
                            (static_cast<std::size_t>(static_cast<unsigned char>(in[2])) << 8);
    in.remove_prefix(3);
    const std::string_view bytes = in.substr(0, len);
    in.remove_prefix(bytes.size());
    t.advance((head >> 4) & 3u);
    run_record(t, service, (head & 8u) != 0 ? 8u : head & 7u, bytes);
    t.check_leases("after a call");
  }
  t.check_listings();
  return 0;
}
