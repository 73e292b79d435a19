#include "transport/grpc_kind_methods.h"

#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <string>
#include <vector>

#include "transport/wire.h"

namespace sluice::transport {
namespace {

std::string bytes_of(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!b.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
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
    const std::string request = bytes_of(request_);
    if (auto r = m->method.handle(request, engine_.policies_of(m->kind), later)) answer(*r);
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

// One unary call of a kind's method through a registered service: answered now, or when a
// deferred handler completes. Deletes itself once gRPC is done with it.
class UnaryKindCall final : public grpc::ServerUnaryReactor, public server::Deferral<std::string> {
 public:
  UnaryKindCall(server::Engine& engine, grpc::ByteBuffer* out) : engine_(engine), out_(out) {}

  void start(const std::string& method, const grpc::ByteBuffer* in) {
    const server::PolicyRegistry::Method* m = engine_.kinds().method(method);
    if (m == nullptr)
      return Finish(
          grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "method: no method named " + method));
    if (auto r = m->method.handle(bytes_of(*in), engine_.policies_of(m->kind), *this)) answer(*r);
  }
  server::Completion<std::string> defer() override {
    return [this](StatusOr<std::string> r) { answer(r); };
  }
  void OnDone() override { delete this; }

 private:
  void answer(const StatusOr<std::string>& r) {
    if (!r.ok()) return Finish(to_grpc(r.status()));
    grpc::Slice slice(r.value());
    *out_ = grpc::ByteBuffer(&slice, 1);
    Finish(grpc::Status::OK);
  }

  server::Engine& engine_;
  grpc::ByteBuffer* out_;
};

grpc::ServerUnaryReactor* run_kind_method(server::Engine& engine, std::string method,
                                          grpc::CallbackServerContext* /*ctx*/,
                                          const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
  auto* call = new UnaryKindCall(engine, out);
  call->start(method, in);
  return call;
}

grpc::ServerUnaryReactor* RateLimitService::ShouldRateLimit(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* in,
                                                            grpc::ByteBuffer* out) {
  return run_kind_method(engine_, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                         ctx, in, out);
}

grpc::ServerGenericBidiReactor* GrpcKindMethods::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  return new KindCall(engine_, ctx->method());
}

}  // namespace sluice::transport
