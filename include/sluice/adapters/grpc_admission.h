// grpc_admission.h: admission control for gRPC calls at the call site, as interceptors.
//
// A client interceptor admits each outgoing call on a policy before it is sent and releases it
// when its status arrives (the status code is the outcome, the time between the two its
// latency); a refused call is never sent: it ends at once with RESOURCE_EXHAUSTED (a rate
// limit: retry later) or UNAVAILABLE (a concurrency limit: the backend is saturated), the
// refusal's detail as its message and `retry-after` (seconds) in its trailing metadata. One
// line where the channel is made:
//
//   auto channel = sluice::adapters::admitted_channel(
//       "backend:50051", grpc::InsecureChannelCredentials(), admitter);
//
// The server side does the same for incoming calls, and releases with the status the handler
// returned. One line registers a synchronous service (one protoc's gRPC plugin generated;
// `Search` is the class it is named after) in place of `builder.RegisterService(&service)`:
//
//   auto admitted = sluice::adapters::register_admitted<Search>(builder, service, admitter);
//
// A refused call answers the refusal and its handler never runs. The returned service must
// live as long as the server (as `service` itself). Underneath are two parts, for a server with
// interceptors of its own or an async or callback service: the server interceptors (which admit
// and release; gRPC C++ lets one watch a call but not end it before its handler) and, in each
// handler, one line that returns the refusal:
//
//   builder.experimental().SetInterceptorCreators(sluice::adapters::server_interceptors(admitter));
//   grpc::Status Search(grpc::ServerContext* ctx, ...) override {
//     if (auto refused = sluice::adapters::refusal(ctx)) return *refused;
//
// (a handler that does not ask still answers with the refusal: the interceptor replaces its
// status). What admits is an Admitter: the in-process library (LocalAdmitter over an
// AdaptiveGuard) or a remote `sluice serve` (RemoteAdmitter: its Admit and Release over gRPC;
// RemoteRateAdmitter: its Check, optionally with an allowance spent at the call site).
//
// Outcomes: OK is a success (its latency is evidence for an adaptive limit); DEADLINE_EXCEEDED,
// UNAVAILABLE and RESOURCE_EXHAUSTED say the backend is overloaded (dropped: the limit comes
// down); any other code says nothing of the backend's capacity (ignored).
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/server_interceptor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/adapters/rate_allowance.h"
#include "sluice/local/adaptive_guard.h"

namespace sluice::adapters {

// The call being admitted: its full method name ("/pkg.Service/Method") and its metadata.
struct CallInfo {
  std::string_view method;
  // The first value of a metadata entry (lower-case key), or nullopt.
  std::function<std::optional<std::string_view>(std::string_view)> metadata;
};

// The key a call is admitted under: a metadata entry's value when the call has it, else the
// method. For a chained rate policy (remote), this is the key its budget is counted per.
std::function<std::string(const CallInfo&)> key_from_metadata(std::string name);

// An admitted call's release, or why it was refused.
struct Ticket {
  bool admitted = false;
  // Refused: RESOURCE_EXHAUSTED or UNAVAILABLE with the refusal's detail.
  grpc::Status refusal;
  std::optional<std::chrono::nanoseconds> retry_after;
  // Admitted: called once, when the call ends, with its status code and latency.
  std::function<void(grpc::StatusCode, std::chrono::nanoseconds latency)> release;
};

class Admitter {
 public:
  virtual ~Admitter() = default;
  [[nodiscard]] virtual Ticket admit(const CallInfo& call) = 0;
};

// The in-process library: an AdaptiveGuard (which the caller owns and keeps alive). A refusal
// is UNAVAILABLE: the guard's limit is on concurrency.
class LocalAdmitter final : public Admitter {
 public:
  explicit LocalAdmitter(AdaptiveGuard& guard) : guard_(guard) {}
  [[nodiscard]] Ticket admit(const CallInfo& call) override;

 private:
  AdaptiveGuard& guard_;
};

// A remote `sluice serve`: Admit on `policy` (an adaptive, fleet, concurrency or cascade
// policy), Release with the outcome and latency (sent without waiting for its answer; in the
// server's fuller vocabulary: DEADLINE_EXCEEDED a timeout, UNAVAILABLE and RESOURCE_EXHAUSTED
// an overload, CANCELLED ignored, another error a failure). A refusal is RESOURCE_EXHAUSTED
// for the server's 429 (a chained rate policy) and UNAVAILABLE for its 503. The Admit is a
// blocking call on the caller's thread, bounded by the timeout; with lease_reuse, a call of a
// key whose lease has just been freed by another call takes that lease without an Admit.
struct RemoteOptions {
  std::string policy;
  std::function<std::string(const CallInfo&)> key = key_from_metadata("x-sluice-key");
  std::chrono::milliseconds timeout{250};  // the most an Admit may add to a call
  // When the sluice server does not answer within the timeout: admit the call (true: the
  // default, as a limiter that is down should not take the service down with it) or refuse it
  // UNAVAILABLE (false: for a backend that must never see more than the limit).
  bool fail_open = true;
  // After sluice failed to answer (UNAVAILABLE, or no answer within the timeout), it is not
  // asked again for this long: the failure mode applies at once, instead of every call waiting
  // for its own timeout. Failing closed, also the refusal's retry-after. 0: always ask.
  std::chrono::milliseconds unreachable_retry{1000};
  // Lease reuse: a finished call's lease (of an adaptive policy: AdmitResponse.reusable) waits
  // this long for the next call of the same key, which then starts at once, without an Admit.
  // Exact all the same: a lease carries one call at a time and holds its permit until released,
  // so the calls at the backend never outnumber sluice's permits. Nothing is sent on a call's
  // path: the admitter's thread, once per this time, reports each kept lease's calls (outcome
  // and latency, for sluice's adaptive limit) in a Release with keep (the earlier ones in
  // `earlier`) while the lease carries a call and none was sent for this long, and releases the
  // leases that waited this long without a call (with their last calls). What it costs: a
  // waiting lease counts as in flight at sluice for up to twice this long (a permit another
  // caller cannot have meanwhile); sluice's limit hears of the calls late (typically within
  // twice this long; at the latest every 256 calls, or at the release); a limit lowered below
  // the calls in flight reaches a kept lease when sluice answers its next keep (`kept` false:
  // released after its call), not at its call's end, as do a reload that removes or replaces
  // the policy and a server that drains. 0: off, every call its own Admit.
  std::chrono::milliseconds lease_reuse{0};
};

class RemoteAdmitter final : public Admitter {
 public:
  // Throws std::invalid_argument naming the field for a negative unreachable_retry or
  // lease_reuse.
  RemoteAdmitter(const std::shared_ptr<grpc::Channel>& sluice, RemoteOptions options);
  ~RemoteAdmitter() override;
  RemoteAdmitter(const RemoteAdmitter&) = delete;
  RemoteAdmitter& operator=(const RemoteAdmitter&) = delete;
  [[nodiscard]] Ticket admit(const CallInfo& call) override;

  // Releases sent whose answer has not come yet (they finish before the destructor returns).
  [[nodiscard]] std::size_t releases_in_flight() const noexcept;
  // With lease_reuse: leases waiting for a call now (the destructor releases them), and calls
  // admitted on a kept lease so far.
  [[nodiscard]] std::size_t leases_waiting() const noexcept;
  [[nodiscard]] std::uint64_t calls_on_kept_leases() const noexcept;
  // With lease_reuse: Releases with keep sent so far (each reports the calls since the last).
  [[nodiscard]] std::uint64_t keeps_sent() const noexcept;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// A remote `sluice serve`'s rate policy (kind rate or federated): a Check of `hits` on the
// call's key before the call; denied, the call is refused RESOURCE_EXHAUSTED with the
// server's retry_after (nothing to release after it). With an `allowance`, hits are taken from
// the server in blocks and spent here, each within `allowance_hold` of its grant, the next
// block asked for in the background (a callback Check) when one is half spent, so that a key's
// steady calls wait for no Check after the first; what that can cost (r x hold more hits in
// any interval for a rate of r, unspent hits lost) is bounded in sluice/adapters/rate_allowance.h.
struct RemoteRateOptions {
  std::string policy;
  std::function<std::string(const CallInfo&)> key = key_from_metadata("x-sluice-key");
  std::uint64_t hits = 1;                             // per call (>= 1)
  std::chrono::milliseconds timeout{250};             // the most a Check may add to a call
  bool fail_open = true;                              // as RemoteOptions::fail_open
  std::chrono::milliseconds unreachable_retry{1000};  // as RemoteOptions::unreachable_retry
  std::uint64_t allowance = 0;                        // hits taken at once; 0: every call is asked
  std::chrono::milliseconds allowance_hold{50};
  std::size_t allowance_max_keys = 10000;
};

class RemoteRateAdmitter final : public Admitter {
 public:
  // Throws std::invalid_argument naming the field for hits 0, an allowance's bad hold or a
  // negative unreachable_retry.
  RemoteRateAdmitter(const std::shared_ptr<grpc::Channel>& sluice, RemoteRateOptions options);
  ~RemoteRateAdmitter() override;
  RemoteRateAdmitter(const RemoteRateAdmitter&) = delete;
  RemoteRateAdmitter& operator=(const RemoteRateAdmitter&) = delete;
  [[nodiscard]] Ticket admit(const CallInfo& call) override;

  // The allowance's counters (all zero without one).
  [[nodiscard]] AllowanceStats allowance_stats() const;
  // The allowance's refills asked and not answered yet (the destructor waits for them, each
  // at most `timeout`).
  [[nodiscard]] std::size_t refills_in_flight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The outcome a call's status code stands for (above).
[[nodiscard]] Outcome outcome_of(grpc::StatusCode code) noexcept;

// The client side: interceptors for grpc::experimental::CreateCustomChannelWithInterceptors,
// or a channel that has them.
[[nodiscard]] std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
client_interceptors(std::shared_ptr<Admitter> admitter);
[[nodiscard]] std::shared_ptr<grpc::Channel> admitted_channel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    std::shared_ptr<Admitter> admitter, const grpc::ChannelArguments& args = {});

// The server side: for ServerBuilder::experimental().SetInterceptorCreators.
[[nodiscard]] std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
server_interceptors(std::shared_ptr<Admitter> admitter);

// In a handler: the status to return when the server interceptor refused this call.
[[nodiscard]] std::optional<grpc::Status> refusal(const grpc::ServerContextBase* ctx);

// A service to register in place of `service`, whose handlers answer refusal(ctx) without
// running: each method's own handler behind a gate, under the same names. `full_name` is the
// service's protobuf name ("pkg.Search"). `service` must be synchronous (no async, callback or
// generic method), generated by protoc's gRPC plugin with protobuf messages (a refused
// request is destroyed as one), not a streamed-unary or split-streaming variant, and outlive
// the returned service. Throws std::invalid_argument naming what is wrong (a service of another
// API, a name the generated descriptors do not have).
[[nodiscard]] std::unique_ptr<grpc::Service> gated_service(grpc::Service& service,
                                                           std::string_view full_name);
template <class Generated>
[[nodiscard]] std::unique_ptr<grpc::Service> gated_service(typename Generated::Service& service) {
  return gated_service(service, Generated::service_full_name());
}

// The one line: the server interceptors set on `builder` (replacing any set before: one
// admitter per server) and the gated service registered. Keep the result as long as the server.
template <class Generated>
[[nodiscard]] std::unique_ptr<grpc::Service> register_admitted(grpc::ServerBuilder& builder,
                                                               typename Generated::Service& service,
                                                               std::shared_ptr<Admitter> admitter) {
  std::unique_ptr<grpc::Service> gated = gated_service<Generated>(service);
  builder.experimental().SetInterceptorCreators(server_interceptors(std::move(admitter)));
  builder.RegisterService(gated.get());
  return gated;
}

}  // namespace sluice::adapters
