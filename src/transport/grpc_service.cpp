#include "transport/grpc_service.h"

#include <limits>
#include <optional>
#include <vector>

namespace sluice::transport {
namespace {

namespace pb = sluice::v1;
using server::AdmitCall;
using server::AdmitResult;
using server::CheckCall;
using server::PolicyInfo;

// A Duration field as Nanos; an error names the field when it is out of range.
StatusOr<std::optional<Nanos>> get_duration(bool has, const google::protobuf::Duration& d,
                                            const char* field) {
  if (!has) return std::optional<Nanos>();
  constexpr std::int64_t kMaxSeconds = std::numeric_limits<std::int64_t>::max() / 1'000'000'000 - 1;
  if (d.seconds() < 0 || d.nanos() < 0 || d.nanos() > 999'999'999 || d.seconds() > kMaxSeconds)
    return Status(StatusCode::kInvalidArgument,
                  std::string(field) + ": must be a non-negative duration");
  return std::optional<Nanos>(Nanos{d.seconds() * 1'000'000'000 + d.nanos()});
}

void fill(pb::Decision* out, const RateDecision& d) {
  out->set_allowed(d.allowed);
  out->set_limit(d.limit);
  out->set_remaining(d.remaining);
  to_proto(d.reset_after, out->mutable_reset_after());
  to_proto(d.retry_after, out->mutable_retry_after());
}

CheckCall call_of(const pb::CheckRequest& r) {
  return CheckCall{r.policy(), r.key(), r.has_hits() ? r.hits() : 1};
}

// An enum value this server does not know (a newer client's) is an error, not a success whose
// RTT would mislead the limit algorithm.
StatusOr<server::CallResult> outcome_of(pb::Outcome o) {
  switch (o) {
    case pb::OUTCOME_UNSPECIFIED:
    case pb::OUTCOME_SUCCESS:
      return server::CallResult::kSuccess;
    case pb::OUTCOME_DROPPED:
      return server::CallResult::kDropped;
    case pb::OUTCOME_IGNORED:
      return server::CallResult::kIgnored;
    case pb::OUTCOME_FAILED:
      return server::CallResult::kFailed;
    default:
      return Status(StatusCode::kInvalidArgument,
                    "outcome: unknown value " + std::to_string(static_cast<int>(o)));
  }
}

grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* ctx, const grpc::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(s);
  return r;
}

}  // namespace

// A decision of T that a policy defers: the reactor is finished when it comes (gRPC lets a
// unary reactor finish later, from any thread; `answer` fills the response, which lives until
// then).
template <class T, class Answer>
class FinishLater final : public server::Deferral<T> {
 public:
  FinishLater(grpc::ServerUnaryReactor* reactor, Answer answer)
      : reactor_(reactor), answer_(std::move(answer)) {}
  server::Completion<T> defer() override {
    return [reactor = reactor_, answer = answer_](StatusOr<T> v) { reactor->Finish(answer(v)); };
  }

 private:
  grpc::ServerUnaryReactor* reactor_;
  Answer answer_;
};

grpc::ServerUnaryReactor* GrpcService::Check(grpc::CallbackServerContext* ctx,
                                             const pb::CheckRequest* req, pb::CheckResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const auto answer = [resp](const StatusOr<RateDecision>& d) {
    if (d.ok()) fill(resp->mutable_decision(), d.value());
    return to_grpc(d.status());
  };
  FinishLater<RateDecision, decltype(answer)> later(reactor, answer);
  if (auto d = engine_.check(call_of(*req), later)) reactor->Finish(answer(*d));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Peek(grpc::CallbackServerContext* ctx,
                                            const pb::CheckRequest* req, pb::CheckResponse* resp) {
  auto d = engine_.peek(call_of(*req));
  if (d.ok()) fill(resp->mutable_decision(), d.value());
  return finish(ctx, to_grpc(d.status()));
}

grpc::ServerUnaryReactor* GrpcService::CheckMany(grpc::CallbackServerContext* ctx,
                                                 const pb::CheckManyRequest* req,
                                                 pb::CheckManyResponse* resp) {
  std::vector<CheckCall> calls;
  calls.reserve(static_cast<std::size_t>(req->checks_size()));
  for (const auto& c : req->checks()) calls.push_back(call_of(c));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const auto answer = [resp](const StatusOr<server::CheckManyResult>& r) {
    if (r.ok()) {
      resp->set_allowed(r.value().allowed);
      resp->set_denied_index(r.value().denied_index);
      for (const RateDecision& d : r.value().decisions) fill(resp->add_decisions(), d);
    }
    return to_grpc(r.status());
  };
  FinishLater<server::CheckManyResult, decltype(answer)> later(reactor, answer);
  if (auto r = engine_.check_many(calls, later)) reactor->Finish(answer(*r));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Admit(grpc::CallbackServerContext* ctx,
                                             const pb::AdmitRequest* req, pb::AdmitResponse* resp) {
  auto ttl = get_duration(req->has_ttl(), req->ttl(), "ttl");
  if (!ttl.ok()) return finish(ctx, to_grpc(ttl.status()));
  auto r = engine_.admit(AdmitCall{req->policy(), req->key(), req->tenant(), req->upstream(),
                                   req->route(), ttl.value()});
  if (!r.ok()) return finish(ctx, to_grpc(r.status()));
  const AdmitResult& a = r.value();
  resp->set_admitted(a.admitted);
  if (a.admitted) {
    resp->set_lease_id(a.lease_id);
    to_proto(a.ttl, resp->mutable_ttl());
    resp->set_chosen(a.chosen);
  } else {
    const Rejection& r = a.refusal;
    pb::Rejection* j = resp->mutable_rejection();
    j->set_status(r.status);
    j->set_type(std::string(r.type));
    j->set_title(std::string(r.title));
    j->set_detail(r.detail());
    to_proto(r.retry_after, j->mutable_retry_after());
    j->set_policy(std::string(r.policy));
    j->set_level(std::string(r.limit_kind()));
    j->set_current(r.current_in_flight);
    j->set_limit(r.max_concurrent);
    j->set_problem_json(problem_json(r));
  }
  return finish(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcService::Release(grpc::CallbackServerContext* ctx,
                                               const pb::ReleaseRequest* req,
                                               pb::ReleaseResponse* resp) {
  auto rtt = get_duration(req->has_rtt(), req->rtt(), "rtt");
  if (!rtt.ok()) return finish(ctx, to_grpc(rtt.status()));
  const auto outcome = outcome_of(req->outcome());
  if (!outcome.ok()) return finish(ctx, to_grpc(outcome.status()));
  auto held = engine_.release(req->lease_id(), outcome.value(), rtt.value());
  if (held.ok()) to_proto(held.value(), resp->mutable_held());
  return finish(ctx, to_grpc(held.status()));
}

grpc::ServerUnaryReactor* GrpcService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                 const pb::HeartbeatRequest* req,
                                                 pb::HeartbeatResponse* resp) {
  auto ttl = get_duration(req->has_ttl(), req->ttl(), "ttl");
  if (!ttl.ok()) return finish(ctx, to_grpc(ttl.status()));
  auto applied = engine_.heartbeat(req->lease_id(), ttl.value());
  if (applied.ok()) to_proto(applied.value(), resp->mutable_ttl());
  return finish(ctx, to_grpc(applied.status()));
}

grpc::ServerUnaryReactor* GrpcService::ListPolicies(grpc::CallbackServerContext* ctx,
                                                    const pb::ListPoliciesRequest* /*req*/,
                                                    pb::ListPoliciesResponse* resp) {
  for (const PolicyInfo& p : engine_.policies()) {
    pb::PolicyState* s = resp->add_policies();
    s->set_name(p.name);
    s->set_kind(p.kind);
    s->set_rate(p.rate);
    s->set_in_flight(p.in_flight);
    s->set_limit(p.limit);
    s->set_state_json(p.state_json);
  }
  resp->set_leases(engine_.leases());
  resp->set_config_generation(engine_.generation());
  return finish(ctx, grpc::Status::OK);
}

}  // namespace sluice::transport
