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

#include "server/engine.h"
#include "sluice/v1/sluice.grpc.pb.h"
#include "transport/wire.h"

namespace sluice::transport {

class GrpcService final : public sluice::v1::Sluice::CallbackService {
 public:
  explicit GrpcService(server::Engine& engine) noexcept : engine_(engine) {}

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const sluice::v1::CheckRequest* req,
                                  sluice::v1::CheckResponse* resp) override;
  grpc::ServerUnaryReactor* CheckMany(grpc::CallbackServerContext* ctx,
                                      const sluice::v1::CheckManyRequest* req,
                                      sluice::v1::CheckManyResponse* resp) override;
  grpc::ServerUnaryReactor* Peek(grpc::CallbackServerContext* ctx,
                                 const sluice::v1::CheckRequest* req,
                                 sluice::v1::CheckResponse* resp) override;
  grpc::ServerUnaryReactor* Admit(grpc::CallbackServerContext* ctx,
                                  const sluice::v1::AdmitRequest* req,
                                  sluice::v1::AdmitResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const sluice::v1::ReleaseRequest* req,
                                    sluice::v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const sluice::v1::HeartbeatRequest* req,
                                      sluice::v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ListPolicies(grpc::CallbackServerContext* ctx,
                                         const sluice::v1::ListPoliciesRequest* req,
                                         sluice::v1::ListPoliciesResponse* resp) override;

 private:
  server::Engine& engine_;
};

}  // namespace sluice::transport
