// grpc_kind_methods.h: the gRPC methods policy kinds register (server/routes.h: GrpcMethod),
// served beside sluice.v1.Sluice without a generated service per kind.
//
// What it is: a generic callback service: gRPC hands it every call whose method no registered
// service has; it reads the one request message, looks the method up in the engine's registry
// and passes the serialized bytes to the kind's handler (the kind parses its own message), then
// writes its reply (now, or when a deferred handler completes, holding no thread meanwhile). An
// unknown method is UNIMPLEMENTED naming it; a stream of more than one request is answered
// after the first (the methods are unary).
//
// Register it with ServerBuilder::RegisterCallbackGenericService. Thread-safety: as the
// Engine's.
//
// A kind's method of a service with a protocol of its own (Envoy's RateLimitService, the
// envoy_ratelimit kind's) is also registered under its service's name (RateLimitService
// below), so that reflection lists the service and health answers for it: the call is run as
// any kind method is.
#pragma once

#include <grpcpp/generic/async_generic_service.h>

#include <string_view>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "server/engine.h"

namespace sluice::transport {

class GrpcKindMethods final : public grpc::CallbackGenericService {
 public:
  explicit GrpcKindMethods(server::Engine& engine) noexcept : engine_(engine) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  server::Engine& engine_;
};

// Runs the kind method `method` on the request `in`; the answer goes to `out` when the
// returned reactor finishes.
[[nodiscard]] grpc::ServerUnaryReactor* run_kind_method(server::Engine& engine,
                                                        std::string_view method,
                                                        grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* in,
                                                        grpc::ByteBuffer* out);

// envoy.service.ratelimit.v3.RateLimitService, answered by the envoy_ratelimit kind.
class RateLimitService final
    : public envoy::service::ratelimit::v3::RateLimitService::WithRawCallbackMethod_ShouldRateLimit<
          envoy::service::ratelimit::v3::RateLimitService::Service> {
 public:
  explicit RateLimitService(server::Engine& engine) noexcept : engine_(engine) {}
  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* in,
                                            grpc::ByteBuffer* out) override;

 private:
  server::Engine& engine_;
};

}  // namespace sluice::transport
