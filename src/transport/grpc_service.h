// grpc_service.h: the sluice.v1.Sluice gRPC service over an Engine (callback API).
//
// What it is: each RPC maps its request onto one Engine call and finishes inline on the gRPC
// thread that received it (the Engine never blocks), so there is no thread hand-off per call;
// a check its policy decides later (server/completion.h) finishes its reactor when the decision
// comes, holding no thread meanwhile. A kind's own methods are GrpcKindMethods' (below).
// Engine errors map to gRPC codes one to one (wire.h) (INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, UNAVAILABLE); a refusal is an OK reply that says so.
//
// Thread-safety: as the Engine's.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>

#include "server/engine.h"
#include "sluice/v1/sluice.grpc.pb.h"
#include "transport/wire.h"

namespace sluice::transport {

// Every method is registered raw (bytes in, bytes out) and decodes its request itself: gRPC's
// own decoding answers a request it cannot decode (a string field holding invalid UTF-8, bytes
// that are not the message) with a bare UNIMPLEMENTED; here it is INVALID_ARGUMENT naming the
// field (`key: not valid UTF-8`) or the message. The wire API is unchanged.
using RawSluiceService = sluice::v1::Sluice::WithRawCallbackMethod_Check<
    sluice::v1::Sluice::WithRawCallbackMethod_CheckMany<
        sluice::v1::Sluice::WithRawCallbackMethod_Peek<
            sluice::v1::Sluice::WithRawCallbackMethod_Charge<
                sluice::v1::Sluice::WithRawCallbackMethod_Admit<
                    sluice::v1::Sluice::WithRawCallbackMethod_Release<
                        sluice::v1::Sluice::WithRawCallbackMethod_Heartbeat<
                            sluice::v1::Sluice::WithRawCallbackMethod_ListPolicies<
                                sluice::v1::Sluice::Service>>>>>>>>;

class GrpcService final : public RawSluiceService {
 public:
  explicit GrpcService(server::Engine& engine);

  using Reactor = grpc::ServerUnaryReactor;
  using Bytes = grpc::ByteBuffer;
  Reactor* Check(grpc::CallbackServerContext* ctx, const Bytes* req, Bytes* resp) override;
  Reactor* CheckMany(grpc::CallbackServerContext* ctx, const Bytes* req, Bytes* resp) override;
  Reactor* Peek(grpc::CallbackServerContext* ctx, const Bytes* req, Bytes* resp) override;
  Reactor* Charge(grpc::CallbackServerContext* ctx, const Bytes* req, Bytes* resp) override;
  Reactor* Admit(grpc::CallbackServerContext* ctx, const Bytes* req, Bytes* resp) override;
  Reactor* Release(grpc::CallbackServerContext* ctx, const Bytes* req, Bytes* resp) override;
  Reactor* Heartbeat(grpc::CallbackServerContext* ctx, const Bytes* req, Bytes* resp) override;
  Reactor* ListPolicies(grpc::CallbackServerContext* ctx, const Bytes* req, Bytes* resp) override;

  // Admit answers on a reactor of its own (OnCancel lets a queued call go when its client does),
  // not the context's default one: a caller without a channel (the fuzzer) learns the status
  // each Admit finishes with through `hook`, called just before the reactor's Finish. Set
  // before serving.
  void on_admit_finish(std::function<void(const grpc::Status&)> hook) {
    admit_finished_ = std::move(hook);
  }

 private:
  server::Engine& engine_;
  std::function<void(const grpc::Status&)> admit_finished_;
};

}  // namespace sluice::transport
