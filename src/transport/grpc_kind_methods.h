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
#pragma once

#include <grpcpp/generic/async_generic_service.h>

#include "server/engine.h"

namespace sluice::transport {

class GrpcKindMethods final : public grpc::CallbackGenericService {
 public:
  explicit GrpcKindMethods(server::Engine& engine) noexcept : engine_(engine) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  server::Engine& engine_;
};

}  // namespace sluice::transport
