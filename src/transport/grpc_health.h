// grpc_health.h: the standard gRPC health service (grpc.health.v1.Health,
// proto/grpc/health/v1/health.proto), with a cap on the Watch streams open at once.
//
// What it is: gRPC's default health service holds any number of Watch streams (each costs the
// server memory for as long as it is open); this one serves the same protocol over the callback
// API, a Watch holding no thread, with at most `max_watches` Watch streams open at once on the
// whole server (server.max_watch_streams).
//   Check: the service's status now (SERVING or NOT_SERVING); a service never given a status is
//     NOT_FOUND; "" is the server as a whole.
//   Watch: the service's status at once (SERVICE_UNKNOWN for a service never given one; the
//     stream stays open), then each change of it (a status set again unchanged sends nothing;
//     changes while a message is on its way are coalesced to the latest). It ends when the
//     client cancels (its slot and memory are freed as soon as gRPC is done with the call) or
//     at shutdown(). A Watch over the cap is finished at once with RESOURCE_EXHAUSTED naming
//     the setting; one naming a service longer than kMaxServiceName bytes with INVALID_ARGUMENT
//     (the request is held for as long as the stream, so its size is bounded too).
//   shutdown(): every service NOT_SERVING, sent to every Watch, each then finished with OK;
//     later set_status calls change nothing, and a later Watch gets NOT_SERVING (or
//     SERVICE_UNKNOWN) and is finished at once. Call it before grpc::Server::Shutdown, so that
//     the server does not wait for open Watch streams.
// A request gRPC cannot decode is gRPC's to answer (UNIMPLEMENTED), as for any generated service.
//
// Register it with ServerBuilder::RegisterService (with no default health service); it must
// outlive the grpc::Server (gRPC ends each Watch through it until the server is shut down).
//
// Thread-safety: every method may be called from any thread. One mutex guards the statuses and
// the open Watch streams; a stream's writes and its end are started under it (gRPC runs the
// reactions of these reactors, which are not inlineable, on its own threads: never inside the
// call that starts an operation).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"

namespace sluice::transport {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using Request = grpc::health::v1::HealthCheckRequest;
  using Response = grpc::health::v1::HealthCheckResponse;
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // The longest service name a Watch may name (a service's full name is far shorter).
  static constexpr std::size_t kMaxServiceName = 1024;

  // `max_watches` >= 1: the Watch streams open at once, server-wide.
  explicit HealthService(std::size_t max_watches) noexcept : max_watches_(max_watches) {}
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;

  // Sets `service`'s status ("" the server as a whole) and tells its Watch streams if it
  // changed. Ignored after shutdown().
  void set_status(const std::string& service, bool serving);
  // Every service NOT_SERVING, every Watch told and finished (see above). Idempotent.
  void shutdown();
  // Watch streams open now (counted until gRPC is done with each).
  [[nodiscard]] std::size_t watches() const;
  // Watch streams ended since the service was made (served ones: not those refused at once).
  // Their memory goes back to the allocator, which may keep it from the system (glibc does);
  // a server can ask it to give memory back once many have ended (apps/sluice/serve.cpp).
  [[nodiscard]] std::uint64_t watches_ended() const;

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const Request* request,
                                  Response* response) override;
  grpc::ServerWriteReactor<Response>* Watch(grpc::CallbackServerContext* ctx,
                                            const Request* request) override;

 private:
  class Watcher;

  // `service`'s status for a Watch (SERVICE_UNKNOWN when it has none). Needs mu_.
  ServingStatus status_locked(const std::string& service) const;
  // Records `status` for `service` and tells its watchers if it changed. Needs mu_.
  void change_locked(const std::string& service, ServingStatus status);

  const std::size_t max_watches_;
  mutable std::mutex mu_;
  std::map<std::string, ServingStatus> statuses_;  // guarded by mu_
  std::set<Watcher*> watchers_;  // open Watch streams, until OnDone (guarded by mu_)
  std::uint64_t ended_ = 0;      // guarded by mu_
  bool shut_down_ = false;       // guarded by mu_
};

}  // namespace sluice::transport
