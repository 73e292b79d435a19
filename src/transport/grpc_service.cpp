#include "transport/grpc_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api/decode_errors.h"

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
  if (!d.reason.empty()) out->set_reason(std::string(d.reason));
  if (d.would_deny) out->set_would_deny(true);
}

void fill(pb::ChargeResponse* out, const RateCharge& c) {
  out->set_limit(c.limit);
  out->set_remaining(c.remaining);
  out->set_overdraft(c.overdraft);
  out->set_pending(c.pending);
  to_proto(c.reset_after, out->mutable_reset_after());
  to_proto(c.retry_after, out->mutable_retry_after());
}

CheckCall call_of(const pb::CheckRequest& r) {
  return CheckCall{r.policy(), r.key(), r.has_hits() ? r.hits() : 1};
}

// Protobuf logs a string field that is not valid UTF-8 as it refuses the message. That is the
// client's error, answered to the client (undecodable() names the field), and not logged: a
// client could fill the log with it. Everything else protobuf logs goes to stderr as before.
void protobuf_log(google::protobuf::LogLevel level, const char* file, int line,
                  const std::string& message) {
  if (message.find("invalid UTF-8") != std::string::npos) return;
  static const char* const kLevels[] = {"INFO", "WARNING", "ERROR", "FATAL"};
  std::fprintf(stderr, "[libprotobuf %s %s:%d] %s\n", kLevels[level], file, line, message.c_str());
}

// Why the bytes `in` do not decode as a `top` (the error starts with the field it names).
grpc::Status undecodable(const google::protobuf::Descriptor* top, const grpc::ByteBuffer* in) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (in != nullptr && in->Dump(&slices).ok())
    for (const grpc::Slice& sl : slices)
      bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, api::why_undecodable(*top, bytes));
}

// One unary call: its request decoded from the raw bytes, its response encoded when it
// finishes (once, from any thread: now, or when a deferred decision comes) on the context's
// default reactor. It lives from start() to finish() and deletes itself there, the response
// being bytes by then.
template <class Req, class Resp>
class Unary final {
 public:
  // Decodes `in`; nullptr when it cannot be decoded (`reactor` is then finished with why).
  static Unary* start(grpc::ServerUnaryReactor* reactor, const grpc::ByteBuffer* in,
                      grpc::ByteBuffer* out) {
    auto* call = new Unary(reactor, out);
    grpc::ByteBuffer copy(*in);  // decoding consumes its buffer; the copy shares the slices
    if (!grpc::SerializationTraits<Req>::Deserialize(&copy, &call->req).ok()) {
      delete call;
      reactor->Finish(undecodable(Req::descriptor(), in));
      return nullptr;
    }
    return call;
  }

  void finish(grpc::Status s) {
    if (s.ok()) {
      bool own = false;
      if (grpc::Status e = grpc::SerializationTraits<Resp>::Serialize(resp, out_, &own); !e.ok())
        s = e;
    }
    grpc::ServerUnaryReactor* reactor = reactor_;
    delete this;
    reactor->Finish(std::move(s));
  }

  Req req;
  Resp resp;

 private:
  Unary(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out) : reactor_(reactor), out_(out) {}
  grpc::ServerUnaryReactor* reactor_;
  grpc::ByteBuffer* out_;
};

}  // namespace

// A decision of T that a policy defers: the call finishes when it comes (gRPC lets a unary
// reactor finish later, from any thread; `answer` fills the response, which the call owns).
template <class T, class Call, class Answer>
class FinishLater final : public server::Deferral<T> {
 public:
  FinishLater(Call* call, Answer answer) : call_(call), answer_(std::move(answer)) {}
  server::Completion<T> defer() override {
    return [call = call_, answer = answer_](StatusOr<T> v) { call->finish(answer(v)); };
  }

 private:
  Call* call_;
  Answer answer_;
};

GrpcService::GrpcService(server::Engine& engine) : engine_(engine) {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&protobuf_log); });
}

grpc::ServerUnaryReactor* GrpcService::Check(grpc::CallbackServerContext* ctx, const Bytes* in,
                                             Bytes* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto* call = Unary<pb::CheckRequest, pb::CheckResponse>::start(reactor, in, out);
  if (call == nullptr) return reactor;
  const auto answer = [this, call](const StatusOr<RateDecision>& d) {
    if (d.ok()) {
      fill(call->resp.mutable_decision(), d.value());
      if (!d.value().allowed && !d.value().reason.empty())
        call->resp.mutable_decision()->set_detail(
            engine_.refusal_detail(call_of(call->req), d.value()));
    }
    return to_grpc(d.status());
  };
  FinishLater<RateDecision, std::remove_pointer_t<decltype(call)>, decltype(answer)> later(call,
                                                                                           answer);
  if (auto d = engine_.check(call_of(call->req), later)) call->finish(answer(*d));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Peek(grpc::CallbackServerContext* ctx, const Bytes* in,
                                            Bytes* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto* call = Unary<pb::CheckRequest, pb::CheckResponse>::start(reactor, in, out);
  if (call == nullptr) return reactor;
  auto d = engine_.peek(call_of(call->req));
  if (d.ok()) fill(call->resp.mutable_decision(), d.value());
  call->finish(to_grpc(d.status()));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Charge(grpc::CallbackServerContext* ctx, const Bytes* in,
                                              Bytes* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto* call = Unary<pb::ChargeRequest, pb::ChargeResponse>::start(reactor, in, out);
  if (call == nullptr) return reactor;
  const pb::ChargeRequest& req = call->req;
  auto c = engine_.charge(CheckCall{req.policy(), req.key(), req.hits()});
  if (c.ok()) fill(&call->resp, c.value());
  call->finish(to_grpc(c.status()));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::CheckMany(grpc::CallbackServerContext* ctx, const Bytes* in,
                                                 Bytes* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto* call = Unary<pb::CheckManyRequest, pb::CheckManyResponse>::start(reactor, in, out);
  if (call == nullptr) return reactor;
  std::vector<CheckCall> calls;
  calls.reserve(static_cast<std::size_t>(call->req.checks_size()));
  for (const auto& c : call->req.checks()) calls.push_back(call_of(c));
  const auto answer = [resp = &call->resp](const StatusOr<server::CheckManyResult>& r) {
    if (r.ok()) {
      resp->set_allowed(r.value().allowed);
      resp->set_denied_index(r.value().denied_index);
      for (const RateDecision& d : r.value().decisions) fill(resp->add_decisions(), d);
    }
    return to_grpc(r.status());
  };
  FinishLater<server::CheckManyResult, std::remove_pointer_t<decltype(call)>, decltype(answer)>
      later(call, answer);
  if (auto r = engine_.check_many(calls, later)) call->finish(answer(*r));
  return reactor;
}

namespace {

// An Admit: a reactor of its own (not the context's default one), so that a client that cancels
// or goes away while its call is queued (a concurrency policy's `queue` strategy) is seen at
// once (OnCancel) and its place in the queue given up. It deletes itself in OnDone.
class AdmitReactor final : public grpc::ServerUnaryReactor, public server::Deferral<AdmitResult> {
 public:
  AdmitReactor(server::Engine& engine, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out,
               const std::function<void(const grpc::Status&)>& finished)
      : engine_(engine), ctx_(ctx), out_(out), finished_(finished) {}

  void start(const grpc::ByteBuffer* in) {
    grpc::ByteBuffer copy(*in);  // decoding consumes its buffer; the copy shares the slices
    if (!grpc::SerializationTraits<pb::AdmitRequest>::Deserialize(&copy, &req_).ok())
      return done(undecodable(pb::AdmitRequest::descriptor(), in));
    auto ttl = get_duration(req_.has_ttl(), req_.ttl(), "ttl");
    if (!ttl.ok()) return finish(ttl.status());
    auto max_wait = get_duration(req_.has_max_wait(), req_.max_wait(), "max_wait");
    if (!max_wait.ok()) return finish(max_wait.status());
    attributes_of(req_, attributes_);
    AdmitCall admit{.policy = req_.policy(),
                    .key = req_.key(),
                    .ttl = ttl.value(),
                    .max_wait = max_wait.value(),
                    .attributes = attributes_};
    // The call's own deadline bounds any wait too, less a margin for the answer's way back (a
    // tenth of the time left, 5 to 50 ms).
    const auto deadline = ctx_->deadline();
    if (deadline != std::chrono::system_clock::time_point::max()) {
      const Nanos left =
          std::chrono::duration_cast<Nanos>(deadline - std::chrono::system_clock::now());
      const Nanos margin =
          std::clamp<Nanos>(left / 10, std::chrono::milliseconds(5), std::chrono::milliseconds(50));
      const Nanos bound = std::max(Nanos{0}, left - margin);
      admit.max_wait = admit.max_wait ? std::min(*admit.max_wait, bound) : bound;
    }
    if (auto r = engine_.admit(admit, *this)) answer(std::move(*r));
  }

  // Deferral: the call is queued; answered when its permit (or refusal) comes.
  server::Completion<AdmitResult> defer() override {
    return [this](StatusOr<AdmitResult> r) { answer(std::move(r)); };
  }
  void on_cancel(server::Once<void()> hook) override {
    {
      const std::lock_guard lock(mu_);
      if (!cancelled_) {
        cancel_ = std::move(hook);
        return;
      }
    }
    hook();  // gone already
  }
  void OnCancel() override {
    server::Once<void()> hook;
    {
      const std::lock_guard lock(mu_);
      cancelled_ = true;
      hook = std::move(cancel_);
    }
    if (hook) hook();
  }
  void OnDone() override { delete this; }

 private:
  void answer(StatusOr<AdmitResult> r) {
    if (!r.ok()) return finish(r.status());
    const AdmitResult& a = r.value();
    pb::AdmitResponse& resp = resp_;
    resp.set_admitted(a.admitted);
    if (a.waited > Nanos{0}) to_proto(a.waited, resp.mutable_waited());
    if (a.admitted) {
      resp.set_lease_id(a.lease_id);
      to_proto(a.ttl, resp.mutable_ttl());
      resp.set_chosen(a.chosen);
      for (const auto& [name, value] : a.attributes) {
        pb::Attribute* at = resp.add_attributes();
        at->set_name(name);
        at->set_value(value);
      }
      if (a.call_timeout) to_proto(*a.call_timeout, resp.mutable_call_deadline());
      if (a.reusable) resp.set_reusable(true);
    }
    if (!a.admitted || a.would_deny) {
      const Rejection& rj = a.refusal;
      pb::Rejection* j = resp.mutable_rejection();
      j->set_status(rj.status);
      j->set_type(std::string(rj.type));
      j->set_title(std::string(rj.title));
      j->set_detail(rj.detail());
      to_proto(rj.retry_after, j->mutable_retry_after());
      j->set_policy(std::string(rj.policy));
      j->set_level(std::string(rj.limit_kind()));
      j->set_current(rj.current_in_flight);
      j->set_limit(rj.max_concurrent);
      j->set_problem_json(problem_json(rj));
    }
    if (a.would_deny) resp.set_would_deny(true);
    finish(Status());
  }
  void finish(const Status& s) {
    grpc::Status g = to_grpc(s);
    if (g.ok()) {
      bool own = false;
      if (grpc::Status e =
              grpc::SerializationTraits<pb::AdmitResponse>::Serialize(resp_, out_, &own);
          !e.ok())
        g = e;
    }
    done(std::move(g));
  }
  void done(grpc::Status s) {
    if (finished_) finished_(s);
    Finish(std::move(s));
  }

  server::Engine& engine_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer* out_;
  const std::function<void(const grpc::Status&)>& finished_;  // the service's (it outlives us)
  pb::AdmitRequest req_;
  pb::AdmitResponse resp_;
  std::vector<server::CallAttribute> attributes_;  // views into req_
  std::mutex mu_;
  bool cancelled_ = false;       // guarded by mu_
  server::Once<void()> cancel_;  // guarded by mu_
};

}  // namespace

grpc::ServerUnaryReactor* GrpcService::Admit(grpc::CallbackServerContext* ctx, const Bytes* in,
                                             Bytes* out) {
  auto* reactor = new AdmitReactor(engine_, ctx, out, admit_finished_);
  reactor->start(in);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Release(grpc::CallbackServerContext* ctx, const Bytes* in,
                                               Bytes* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto* call = Unary<pb::ReleaseRequest, pb::ReleaseResponse>::start(reactor, in, out);
  if (call == nullptr) return reactor;
  const pb::ReleaseRequest& req = call->req;
  const auto status = [&]() -> Status {
    auto rtt = get_duration(req.has_rtt(), req.rtt(), "rtt");
    if (!rtt.ok()) return rtt.status();
    const auto outcome = call_result_of(req.outcome());
    if (!outcome.ok()) return outcome.status();
    std::vector<server::CallEnd> earlier;
    earlier.reserve(static_cast<std::size_t>(req.earlier_size()));
    for (int i = 0; i < req.earlier_size(); ++i) {
      const pb::CallOutcome& e = req.earlier(i);
      const std::string at = "earlier[" + std::to_string(i) + "].";
      const auto r = call_result_of(e.outcome());
      if (!r.ok()) return Status(r.status().code(), at + r.status().message());
      if (!e.has_rtt()) return server::invalid(at + "rtt", "required");
      auto took = get_duration(true, e.rtt(), (at + "rtt").c_str());
      if (!took.ok()) return took.status();
      earlier.push_back({r.value(), *took.value(), server::CallEnd::By::kClient});
    }
    auto released =
        engine_.release(req.lease_id(), outcome.value(), rtt.value(),
                        req.has_cost() ? std::optional<std::int64_t>(req.cost()) : std::nullopt,
                        req.keep(), earlier);
    if (!released.ok()) return released.status();
    to_proto(released.value().held, call->resp.mutable_held());
    if (released.value().kept) call->resp.set_kept(true);
    if (released.value().charged) fill(call->resp.mutable_charged(), *released.value().charged);
    return {};
  }();
  call->finish(to_grpc(status));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Heartbeat(grpc::CallbackServerContext* ctx, const Bytes* in,
                                                 Bytes* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto* call = Unary<pb::HeartbeatRequest, pb::HeartbeatResponse>::start(reactor, in, out);
  if (call == nullptr) return reactor;
  const pb::HeartbeatRequest& req = call->req;
  const auto status = [&]() -> Status {
    auto ttl = get_duration(req.has_ttl(), req.ttl(), "ttl");
    if (!ttl.ok()) return ttl.status();
    auto applied = engine_.heartbeat(req.lease_id(), ttl.value());
    if (applied.ok()) to_proto(applied.value(), call->resp.mutable_ttl());
    return applied.status();
  }();
  call->finish(to_grpc(status));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::ListPolicies(grpc::CallbackServerContext* ctx,
                                                    const Bytes* in, Bytes* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto* call = Unary<pb::ListPoliciesRequest, pb::ListPoliciesResponse>::start(reactor, in, out);
  if (call == nullptr) return reactor;
  pb::ListPoliciesResponse& resp = call->resp;
  for (const PolicyInfo& p : engine_.policies()) {
    pb::PolicyState* s = resp.add_policies();
    s->set_name(p.name);
    s->set_kind(p.kind);
    s->set_rate(p.rate);
    s->set_in_flight(p.in_flight);
    s->set_limit(p.limit);
    s->set_state_json(p.state_json);
  }
  resp.set_leases(engine_.leases());
  resp.set_config_generation(engine_.generation());
  call->finish(grpc::Status::OK);
  return reactor;
}

}  // namespace sluice::transport
