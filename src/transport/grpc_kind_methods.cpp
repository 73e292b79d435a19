#include "transport/grpc_kind_methods.h"

#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "transport/wire.h"

namespace sluice::transport {
namespace {

constexpr std::string_view kShouldRateLimit =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

// The bytes of `b`: in place when they are one slice (`one` holds it), else copied into `copy`.
std::string_view bytes_of(const grpc::ByteBuffer& b, grpc::Slice& one, std::string& copy) {
  if (b.TrySingleSlice(&one).ok()) return {reinterpret_cast<const char*>(one.begin()), one.size()};
  std::vector<grpc::Slice> slices;
  if (!b.Dump(&slices).ok()) return {};
  for (const grpc::Slice& s : slices)
    copy.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return copy;
}

// One call of a kind's method: read the request, answer it, finish; deletes itself when gRPC
// is done with it.
class KindCall final : public grpc::ServerGenericBidiReactor {
 public:
  KindCall(server::Engine& engine, std::string method)
      : engine_(engine), method_(std::move(method)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok)
      return Finish(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request: no message received"));
    const server::PolicyRegistry::Method* m = engine_.kinds().method(method_);
    if (m == nullptr)
      return Finish(
          grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "method: no method named " + method_));
    Later later(this);
    grpc::Slice one;
    std::string copy;
    if (auto r =
            m->method.handle(bytes_of(request_, one, copy), *engine_.policies_of(m->kind), later))
      answer(*r);
  }
  void OnWriteDone(bool /*ok*/) override {}
  void OnDone() override { delete this; }

 private:
  class Later final : public server::Deferral<std::string> {
   public:
    explicit Later(KindCall* call) : call_(call) {}
    server::Completion<std::string> defer() override {
      return [call = call_](StatusOr<std::string> r) { call->answer(r); };
    }

   private:
    KindCall* call_;
  };

  void answer(const StatusOr<std::string>& r) {
    if (!r.ok()) return Finish(to_grpc(r.status()));
    grpc::Slice slice(r.value());
    response_ = grpc::ByteBuffer(&slice, 1);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

  server::Engine& engine_;
  const std::string method_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

}  // namespace

namespace {

// Finishes `reactor` with `r`, the reply's bytes going to `out`.
void finish_unary(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out,
                  const StatusOr<std::string>& r) {
  if (!r.ok()) return reactor->Finish(to_grpc(r.status()));
  grpc::Slice slice(r.value());
  *out = grpc::ByteBuffer(&slice, 1);
  reactor->Finish(grpc::Status::OK);
}

// A unary call's reply deferred by its handler: it finishes the call when it comes (gRPC lets
// a unary reactor finish later, from any thread).
class FinishUnaryLater final : public server::Deferral<std::string> {
 public:
  FinishUnaryLater(grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out)
      : reactor_(reactor), out_(out) {}
  server::Completion<std::string> defer() override {
    return [reactor = reactor_, out = out_](StatusOr<std::string> r) {
      finish_unary(reactor, out, r);
    };
  }

 private:
  grpc::ServerUnaryReactor* reactor_;
  grpc::ByteBuffer* out_;
};

}  // namespace

// The call runs on the context's default reactor, as sluice.v1.Sluice's do: gRPC then runs its
// end inline, where a reactor of its own would have it handed to gRPC's executor thread (a
// thread hop per call).
grpc::ServerUnaryReactor* run_kind_method(server::Engine& engine, std::string_view method,
                                          grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const server::PolicyRegistry::Method* m = engine.kinds().method(method);
  if (m == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 "method: no method named " + std::string(method)));
    return reactor;
  }
  FinishUnaryLater later(reactor, out);
  grpc::Slice one;
  std::string copy;
  if (auto r = m->method.handle(bytes_of(*in, one, copy), *engine.policies_of(m->kind), later))
    finish_unary(reactor, out, *r);
  return reactor;
}

grpc::ServerUnaryReactor* RateLimitService::ShouldRateLimit(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* in,
                                                            grpc::ByteBuffer* out) {
  return run_kind_method(engine_, kShouldRateLimit, ctx, in, out);
}

grpc::ServerGenericBidiReactor* GrpcKindMethods::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  return new KindCall(engine_, ctx->method());
}

}  // namespace sluice::transport
