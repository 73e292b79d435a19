// grpc_admission.cpp: the interceptors and the two admitters of grpc_admission.h.
#include "sluice/adapters/grpc_admission.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/duration.pb.h>
#include <google/protobuf/message_lite.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <span>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

#include "sluice/v1/sluice.grpc.pb.h"

namespace sluice::adapters {
namespace {

namespace pb = sluice::v1;
using grpc::StatusCode;
using grpc::experimental::InterceptionHookPoints;
using Clock = std::chrono::steady_clock;

std::chrono::nanoseconds nanos_of(const google::protobuf::Duration& d) {
  return std::chrono::seconds(d.seconds()) + std::chrono::nanoseconds(d.nanos());
}

void to_duration(std::chrono::nanoseconds n, google::protobuf::Duration* d) {
  d->set_seconds(n.count() / 1'000'000'000);
  d->set_nanos(static_cast<std::int32_t>(n.count() % 1'000'000'000));
}

// Whole seconds, rounded up, as Retry-After counts them ("0" only for nothing to wait).
std::string retry_after_text(std::chrono::nanoseconds n) {
  return std::to_string(
      static_cast<std::int64_t>(std::ceil(std::chrono::duration<double>(n).count())));
}

// What the server's Release hears for a call's status code: its richer vocabulary (a timeout
// and an overload are dropped to a limit, a failure to a cascade).
pb::Outcome wire_outcome(StatusCode code) {
  switch (code) {
    case StatusCode::OK:
      return pb::OUTCOME_SUCCESS;
    case StatusCode::DEADLINE_EXCEEDED:
      return pb::OUTCOME_TIMEOUT;
    case StatusCode::UNAVAILABLE:
    case StatusCode::RESOURCE_EXHAUSTED:
      return pb::OUTCOME_OVERLOAD;
    case StatusCode::CANCELLED:
      return pb::OUTCOME_IGNORED;
    default:
      return pb::OUTCOME_FAILED;
  }
}

// The refusal a 429 (rate) or a 503 (concurrency) is in gRPC's words.
StatusCode code_of_http(std::uint32_t status) {
  return status == 429 ? StatusCode::RESOURCE_EXHAUSTED : StatusCode::UNAVAILABLE;
}

// ---- the client interceptor ----

class ClientAdmission final : public grpc::experimental::Interceptor {
 public:
  ClientAdmission(grpc::experimental::ClientRpcInfo* info, std::shared_ptr<Admitter> admitter)
      : info_(info), admitter_(std::move(admitter)) {}
  ~ClientAdmission() override { finish(StatusCode::CANCELLED); }
  ClientAdmission(const ClientAdmission&) = delete;
  ClientAdmission& operator=(const ClientAdmission&) = delete;

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    bool hijack = false;
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::multimap<std::string, std::string>* md = m->GetSendInitialMetadata();
      const CallInfo call{info_->method(),
                          [md](std::string_view name) -> std::optional<std::string_view> {
                            const auto it = md->find(std::string(name));
                            if (it == md->end()) return std::nullopt;
                            return std::string_view(it->second);
                          }};
      ticket_ = admitter_->admit(call);
      started_ = Clock::now();
      decided_ = true;
      hijack = !ticket_.admitted;  // refused: the call is never sent
    }
    if (decided_ && !ticket_.admitted) {
      if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_RECV_MESSAGE))
        m->FailHijackedRecvMessage();
      if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_RECV_STATUS)) {
        *m->GetRecvStatus() = ticket_.refusal;
        if (ticket_.retry_after) {
          retry_after_ = retry_after_text(*ticket_.retry_after);
          m->GetRecvTrailingMetadata()->emplace(grpc::string_ref(kRetryAfter),
                                                grpc::string_ref(retry_after_));
        }
      }
    }
    if (ticket_.admitted && m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_STATUS))
      finish(m->GetRecvStatus()->error_code());
    if (hijack)
      m->Hijack();
    else
      m->Proceed();
  }

 private:
  static constexpr const char* kRetryAfter = "retry-after";

  void finish(StatusCode code) {
    if (!ticket_.admitted || !ticket_.release) return;
    std::exchange(ticket_.release, nullptr)(code, Clock::now() - started_);
  }

  grpc::experimental::ClientRpcInfo* info_;
  std::shared_ptr<Admitter> admitter_;
  Ticket ticket_;
  bool decided_ = false;
  Clock::time_point started_;
  std::string retry_after_;  // the trailing metadata's value lives as long as the call
};

class ClientFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit ClientFactory(std::shared_ptr<Admitter> admitter) : admitter_(std::move(admitter)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new ClientAdmission(info, admitter_);
  }

 private:
  std::shared_ptr<Admitter> admitter_;
};

// ---- the server interceptor ----

// The refusals of calls in progress, for refusal(ctx): by server context.
class Refusals {
 public:
  void put(const grpc::ServerContextBase* ctx, grpc::Status s) {
    std::lock_guard lock(mu_);
    by_call_[ctx] = std::move(s);
  }
  void erase(const grpc::ServerContextBase* ctx) {
    std::lock_guard lock(mu_);
    by_call_.erase(ctx);
  }
  std::optional<grpc::Status> find(const grpc::ServerContextBase* ctx) {
    std::lock_guard lock(mu_);
    const auto it = by_call_.find(ctx);
    if (it == by_call_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<const grpc::ServerContextBase*, grpc::Status> by_call_;
};

Refusals& refusals() {
  static Refusals r;  // one per process: a context is one call's, whichever server it is on
  return r;
}

class ServerAdmission final : public grpc::experimental::Interceptor {
 public:
  ServerAdmission(grpc::experimental::ServerRpcInfo* info, std::shared_ptr<Admitter> admitter)
      : info_(info), admitter_(std::move(admitter)) {}
  ~ServerAdmission() override {
    finish(StatusCode::CANCELLED);
    if (refused_) refusals().erase(info_->server_context());
  }
  ServerAdmission(const ServerAdmission&) = delete;
  ServerAdmission& operator=(const ServerAdmission&) = delete;

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      std::multimap<grpc::string_ref, grpc::string_ref>* md = m->GetRecvInitialMetadata();
      const CallInfo call{info_->method(),
                          [md](std::string_view name) -> std::optional<std::string_view> {
                            const auto it = md->find(grpc::string_ref(name.data(), name.size()));
                            if (it == md->end()) return std::nullopt;
                            return std::string_view(it->second.data(), it->second.size());
                          }};
      ticket_ = admitter_->admit(call);
      started_ = Clock::now();
      if (!ticket_.admitted) {
        refused_ = true;
        refusals().put(info_->server_context(), ticket_.refusal);
      }
    }
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      if (refused_) {
        // Whatever the handler returned: the call was not admitted.
        m->ModifySendStatus(ticket_.refusal);
        if (ticket_.retry_after) {
          retry_after_ = retry_after_text(*ticket_.retry_after);
          m->GetSendTrailingMetadata()->emplace("retry-after", retry_after_);
        }
      } else {
        finish(m->GetSendStatus().error_code());
      }
    }
    m->Proceed();
  }

 private:
  void finish(StatusCode code) {
    if (!ticket_.admitted || !ticket_.release) return;
    std::exchange(ticket_.release, nullptr)(code, Clock::now() - started_);
  }

  grpc::experimental::ServerRpcInfo* info_;
  std::shared_ptr<Admitter> admitter_;
  Ticket ticket_;
  bool refused_ = false;
  Clock::time_point started_;
  std::string retry_after_;
};

class ServerFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit ServerFactory(std::shared_ptr<Admitter> admitter) : admitter_(std::move(admitter)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ServerAdmission(info, admitter_);
  }

 private:
  std::shared_ptr<Admitter> admitter_;
};

// ---- the gate: a refused call's handler never runs ----

using grpc::internal::MethodHandler;

// grpc::Service's protected GetHandler, reached for a service of any class (the member is
// named through this class, as access to a protected member requires).
struct HandlerOf : grpc::Service {
  static MethodHandler* get(grpc::Service& service, int index) {
    return (service.*&HandlerOf::GetHandler)(index);
  }
};

// Sends `status` as the call's own handler would have: initial metadata if none went, then
// the status (gRPC's own error handler, one per code; the interceptor then puts the refusal's
// retry-after beside it).
template <int... Code>
void send_status(const MethodHandler::HandlerParameter& p, const grpc::Status& status,
                 std::integer_sequence<int, Code...> /*codes*/) {
  const auto code = static_cast<int>(status.error_code());
  const bool sent =
      ((code == Code ? (grpc::internal::ErrorMethodHandler<static_cast<StatusCode>(Code)>(
                            status.error_message())
                            .RunHandler(p),
                        true)
                     : false) ||
       ...);
  if (!sent)
    grpc::internal::ErrorMethodHandler<StatusCode::UNKNOWN>(status.error_message()).RunHandler(p);
}

class Gate final : public MethodHandler {
 public:
  explicit Gate(MethodHandler* own) : own_(own) {}

  void RunHandler(const HandlerParameter& p) override {
    std::optional<grpc::Status> refused = refusal(p.server_context);
    if (!refused) {
      own_->RunHandler(p);
      return;
    }
    // The request the handler would have read and destroyed (a unary or server-streaming
    // call's; a protobuf message, as the service is protoc's).
    if (p.request != nullptr)
      static_cast<google::protobuf::MessageLite*>(p.request)->~MessageLite();
    send_status(p, *refused, std::make_integer_sequence<int, 17>{});
  }

  void* Deserialize(grpc_call* call, grpc_byte_buffer* req, grpc::Status* status,
                    void** handler_data) override {
    return own_->Deserialize(call, req, status, handler_data);
  }

 private:
  MethodHandler* own_;  // the service's, which keeps it
};

grpc::internal::RpcMethod::RpcType type_of(const google::protobuf::MethodDescriptor& m) {
  using T = grpc::internal::RpcMethod;
  if (m.client_streaming()) return m.server_streaming() ? T::BIDI_STREAMING : T::CLIENT_STREAMING;
  return m.server_streaming() ? T::SERVER_STREAMING : T::NORMAL_RPC;
}

class GatedService final : public grpc::Service {
 public:
  GatedService(grpc::Service& own, const google::protobuf::ServiceDescriptor& d) {
    // Methods in the order protoc's plugin added them: the descriptor's.
    names_.reserve(static_cast<std::size_t>(d.method_count()));
    for (int i = 0; i < d.method_count(); ++i)
      names_.push_back("/" + d.full_name() + "/" + d.method(i)->name());
    for (int i = 0; i < d.method_count(); ++i)
      AddMethod(new grpc::internal::RpcServiceMethod(names_[static_cast<std::size_t>(i)].c_str(),
                                                     type_of(*d.method(i)),
                                                     new Gate(HandlerOf::get(own, i))));
  }

 private:
  std::vector<std::string> names_;  // the methods keep pointers to these
};

}  // namespace

std::unique_ptr<grpc::Service> gated_service(grpc::Service& service, std::string_view full_name) {
  const std::string name(full_name);
  const char* api = service.has_async_methods()      ? "async"
                    : service.has_callback_methods() ? "callback"
                    : service.has_generic_methods()  ? "generic"
                                                     : nullptr;
  if (api != nullptr)
    throw std::invalid_argument("gated_service: " + name + " has " + api +
                                " methods; only a synchronous service is gated (for another, "
                                "return refusal(ctx) in each handler)");
  const google::protobuf::ServiceDescriptor* d =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
  if (d == nullptr)
    throw std::invalid_argument("gated_service: no service named '" + name +
                                "' among the generated protobuf descriptors");
  return std::make_unique<GatedService>(service, *d);
}

std::function<std::string(const CallInfo&)> key_from_metadata(std::string name) {
  return [name = std::move(name)](const CallInfo& call) {
    if (call.metadata)
      if (const auto v = call.metadata(name)) return std::string(*v);
    return std::string(call.method);
  };
}

Outcome outcome_of(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::OK:
      return Outcome::kSuccess;
    case StatusCode::DEADLINE_EXCEEDED:
    case StatusCode::UNAVAILABLE:
    case StatusCode::RESOURCE_EXHAUSTED:
      return Outcome::kDropped;
    default:
      return Outcome::kIgnored;
  }
}

// ---- LocalAdmitter ----

Ticket LocalAdmitter::admit(const CallInfo& /*call*/) {
  Ticket t;
  std::optional<GuardPermit> permit = guard_.acquire();
  if (!permit) {
    t.refusal = grpc::Status(StatusCode::UNAVAILABLE,
                             "concurrency limit reached: " + std::to_string(guard_.limit()) +
                                 " calls in flight; retry later");
    return t;
  }
  t.admitted = true;
  // A std::function must be copyable: the move-only permit lives behind a shared pointer.
  auto held = std::make_shared<GuardPermit>(std::move(*permit));
  t.release = [held](StatusCode code, std::chrono::nanoseconds latency) {
    held->release(outcome_of(code), latency);
  };
  return t;
}

// ---- the remote admitters' shared parts ----

namespace {

// When sluice last failed to answer: until then plus unreachable_retry, it is not asked.
class Unreachable {
 public:
  explicit Unreachable(std::chrono::milliseconds retry) : retry_(retry) {
    if (retry < std::chrono::milliseconds{0})
      throw std::invalid_argument("unreachable_retry: must be >= 0");
  }
  // Whether a failure to answer came less than unreachable_retry ago.
  [[nodiscard]] bool down() const noexcept {
    return Clock::now().time_since_epoch().count() < until_.load(std::memory_order_relaxed);
  }
  // Notes `s`, a failed call: UNAVAILABLE or DEADLINE_EXCEEDED keeps sluice unasked a while.
  void note(const grpc::Status& s) noexcept {
    if (s.error_code() == StatusCode::UNAVAILABLE ||
        s.error_code() == StatusCode::DEADLINE_EXCEEDED)
      until_.store((Clock::now() + retry_).time_since_epoch().count(), std::memory_order_relaxed);
  }

 private:
  std::chrono::milliseconds retry_;
  std::atomic<Clock::rep> until_{std::numeric_limits<Clock::rep>::min()};
};

// The ticket of a call whose admission could not be asked (`s` not OK): admitted unchecked
// (fail open, the server unreachable) or refused; unreachable and refused, with retry-after
// the time sluice goes unasked.
Ticket unasked(const grpc::Status& s, const std::string& what, const std::string& policy,
               bool fail_open, std::chrono::milliseconds unreachable_retry) {
  Ticket t;
  const bool unreachable =
      s.error_code() == StatusCode::UNAVAILABLE || s.error_code() == StatusCode::DEADLINE_EXCEEDED;
  if (unreachable && fail_open) {
    t.admitted = true;  // nothing to release
    t.release = [](StatusCode, std::chrono::nanoseconds) {};
    return t;
  }
  // A refusal of the request itself (an unknown policy, a bad key) is the caller's to see.
  t.refusal = grpc::Status(unreachable ? StatusCode::UNAVAILABLE : s.error_code(),
                           "sluice " + what + " on " + policy + ": " + s.error_message());
  if (unreachable) t.retry_after = unreachable_retry;
  return t;
}

// The status of a call sluice was not asked for, as it failed to answer just before.
grpc::Status not_asked(std::chrono::milliseconds retry) {
  return {StatusCode::UNAVAILABLE, "not asked: it failed to answer less than " +
                                       std::to_string(retry.count()) +
                                       " ms ago (unreachable_retry)"};
}

}  // namespace

// ---- RemoteAdmitter ----

struct RemoteAdmitter::Impl {
  std::unique_ptr<pb::Sluice::Stub> stub;
  RemoteOptions options;
  std::mutex mu;
  std::condition_variable idle;
  std::size_t releasing = 0;  // Release calls not answered yet
  std::optional<Unreachable> unreachable;

  // Lease reuse (options.lease_reuse > 0): a reusable lease whose call ended waits here, under
  // its key, for the next call of that key. The calls a lease carries are reported to sluice by
  // the sweeper thread, at most once per hold and while the lease carries a call, in a Release
  // with keep (the calls not reported yet in its `earlier`), and the rest when it is released:
  // nothing is sent on a call's path. A waiting lease always has its last call unreported. One
  // call at a time on a lease.
  struct Call {
    StatusCode code;
    std::chrono::nanoseconds latency;
  };
  struct Kept {
    std::string id;
    std::string key;
    bool retired = false;        // sluice said it is over its limit, or a keep failed
    bool waiting = false;        // in `kept` below
    std::vector<Call> ended;     // calls it carried not reported yet, oldest first
    Clock::time_point since;     // waiting since
    Clock::time_point reported;  // its last Release with keep (or its Admit)
  };
  std::unordered_map<std::string, std::vector<std::shared_ptr<Kept>>> kept;  // guarded by mu
  std::unordered_map<const Kept*, std::shared_ptr<Kept>> live;  // every kept lease; by mu
  bool stopping = false;                                        // guarded by mu
  std::condition_variable sweep;
  std::thread sweeper;
  std::atomic<std::uint64_t> reused{0}, keeps{0};
  // Calls a kept lease carries before they are reported, whatever the time (then the call that
  // ends the last of them sends the keep itself; the server takes at most 1024).
  static constexpr std::size_t kMaxUnreported = 256;

  // A Release without waiting for its answer (the call's caller has its status already); with
  // `keep`, `then` hears whether the lease may carry more calls. `calls`: the lease's calls not
  // reported yet, the last one the Release's own.
  void release(const std::string& lease, std::span<const Call> calls, bool keep = false,
               std::function<void(bool)> then = {}) {
    struct Pending {
      grpc::ClientContext ctx;
      pb::ReleaseRequest req;
      pb::ReleaseResponse resp;
      std::function<void(bool)> then;
    };
    auto* p = new Pending;
    p->req.set_lease_id(lease);
    for (std::size_t i = 0; i + 1 < calls.size(); ++i) {
      pb::CallOutcome* e = p->req.add_earlier();
      e->set_outcome(wire_outcome(calls[i].code));
      to_duration(calls[i].latency, e->mutable_rtt());
    }
    p->req.set_outcome(wire_outcome(calls.back().code));
    to_duration(calls.back().latency, p->req.mutable_rtt());
    if (keep) p->req.set_keep(true);
    p->then = std::move(then);
    p->ctx.set_deadline(std::chrono::system_clock::now() + 4 * options.timeout);
    {
      std::lock_guard lock(mu);
      ++releasing;
    }
    stub->async()->Release(&p->ctx, &p->req, &p->resp, [this, p](grpc::Status s) {
      // A release the server did not hear ends at the lease's TTL there.
      if (p->then) p->then(s.ok() && p->resp.kept());
      delete p;
      std::lock_guard lock(mu);
      if (--releasing == 0) idle.notify_all();
    });
  }
  void release(const std::string& lease, StatusCode code, std::chrono::nanoseconds latency) {
    const Call call{code, latency};
    release(lease, std::span<const Call>(&call, 1));
  }

  // Takes waiting lease `k` out of `kept` (under mu).
  void unpool(const std::shared_ptr<Kept>& k) {
    auto it = kept.find(k->key);
    std::erase(it->second, k);
    if (it->second.empty()) kept.erase(it);
    k->waiting = false;
  }

  // The ticket of a call on kept lease `k`: its end puts the lease back (ended()).
  static Ticket kept_ticket(std::weak_ptr<Impl> impl, std::shared_ptr<Kept> k) {
    Ticket t;
    t.admitted = true;
    t.release = [impl = std::move(impl), k = std::move(k)](StatusCode code,
                                                           std::chrono::nanoseconds latency) {
      if (const auto i = impl.lock()) i->ended(k, code, latency);
    };
    return t;
  }

  // The freshest lease waiting under `key` (nullptr: none), taken for a call; a lease that
  // waited past the hold is released instead.
  std::shared_ptr<Kept> take(const std::string& key) {
    std::unique_lock lock(mu);
    auto it = kept.find(key);
    if (it == kept.end()) return nullptr;
    std::shared_ptr<Kept> k = it->second.back();
    unpool(k);
    if (Clock::now() - k->since < options.lease_reuse) {
      reused.fetch_add(1, std::memory_order_relaxed);
      return k;
    }
    live.erase(k.get());
    std::vector<Call> calls = std::move(k->ended);
    lock.unlock();
    release(k->id, calls);  // waited too long to carry a call: released now
    return nullptr;
  }

  // A new kept lease, carrying its first call.
  std::shared_ptr<Kept> keep_new(std::string id, std::string key) {
    auto k = std::make_shared<Kept>();
    k->id = std::move(id);
    k->key = std::move(key);
    k->reported = Clock::now();
    std::lock_guard lock(mu);
    live.emplace(k.get(), k);
    return k;
  }

  // Reports `calls` of `k` with keep; sluice's answer may retire it.
  void report(const std::shared_ptr<Kept>& k, std::span<const Call> calls) {
    keeps.fetch_add(1, std::memory_order_relaxed);
    std::weak_ptr<Impl> weak = self;
    release(k->id, calls, true, [weak, k](bool still) {
      if (!still)
        if (const auto i = weak.lock()) i->retire(k);
    });
  }

  // No more calls on `k`: released now if it waits, else when its call ends.
  void retire(const std::shared_ptr<Kept>& k) {
    std::unique_lock lock(mu);
    k->retired = true;
    if (!k->waiting) return;
    unpool(k);
    live.erase(k.get());
    std::vector<Call> calls = std::move(k->ended);
    lock.unlock();
    release(k->id, calls);
  }

  // `k`'s call ended: it waits for the next call of its key, or is released.
  void ended(const std::shared_ptr<Kept>& k, StatusCode code, std::chrono::nanoseconds latency) {
    std::unique_lock lock(mu);
    k->ended.push_back({code, latency});
    if (k->retired || stopping) {
      live.erase(k.get());
      std::vector<Call> calls = std::move(k->ended);
      lock.unlock();
      release(k->id, calls);
      return;
    }
    k->since = Clock::now();
    k->waiting = true;
    kept[k->key].push_back(k);
    if (k->ended.size() < kMaxUnreported) return;
    // All but this one: each was followed by another call on the lease (a keep says so of its
    // last); this one waits for the next call, or goes with the release.
    std::vector<Call> calls(k->ended.begin(), k->ended.end() - 1);
    k->ended.erase(k->ended.begin(), k->ended.end() - 1);
    k->reported = k->since;
    lock.unlock();
    report(k, calls);
  }

  // Each hold: reports the calls of every kept lease not reported for a hold (with keep), and
  // releases the leases that waited a hold without a call; on stop, releases them all.
  void sweep_loop() {
    std::unique_lock lock(mu);
    for (bool last = false; !last;) {
      if (!stopping) sweep.wait_for(lock, options.lease_reuse);
      last = stopping;  // then this pass releases every waiting lease, and is the last
      const auto now = Clock::now();
      std::vector<std::pair<std::shared_ptr<Kept>, std::vector<Call>>> done, due;
      for (auto it = live.begin(); it != live.end();) {
        const std::shared_ptr<Kept>& k = it->second;
        if (k->waiting && (last || now - k->since >= options.lease_reuse)) {
          unpool(k);
          done.emplace_back(k, std::move(k->ended));
          it = live.erase(it);
          continue;
        }
        // Only a lease carrying a call: its keep says so of the last call reported.
        if (!last && !k->waiting && !k->retired && !k->ended.empty() &&
            now - k->reported >= options.lease_reuse) {
          k->reported = now;
          due.emplace_back(k, std::move(k->ended));
        }
        ++it;
      }
      lock.unlock();
      for (auto& [k, calls] : done) release(k->id, calls);
      for (auto& [k, calls] : due) report(k, calls);
      lock.lock();
    }
  }

  std::weak_ptr<Impl> self;  // set by the constructor
};

RemoteAdmitter::RemoteAdmitter(const std::shared_ptr<grpc::Channel>& sluice, RemoteOptions options)
    : impl_(std::make_shared<Impl>()) {
  impl_->unreachable.emplace(options.unreachable_retry);
  if (options.lease_reuse < std::chrono::milliseconds{0})
    throw std::invalid_argument("lease_reuse: must be >= 0");
  impl_->stub = pb::Sluice::NewStub(sluice);
  impl_->options = std::move(options);
  impl_->self = impl_;
  if (impl_->options.lease_reuse > std::chrono::milliseconds{0})
    impl_->sweeper = std::thread([i = impl_.get()] { i->sweep_loop(); });
}

RemoteAdmitter::~RemoteAdmitter() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->sweep.notify_all();
  if (impl_->sweeper.joinable()) impl_->sweeper.join();
  std::unique_lock lock(impl_->mu);
  impl_->idle.wait(lock, [&] { return impl_->releasing == 0; });
}

std::size_t RemoteAdmitter::releases_in_flight() const noexcept {
  std::lock_guard lock(impl_->mu);
  return impl_->releasing;
}

std::size_t RemoteAdmitter::leases_waiting() const noexcept {
  std::lock_guard lock(impl_->mu);
  std::size_t n = 0;
  for (const auto& [key, waiting] : impl_->kept) n += waiting.size();
  return n;
}

std::uint64_t RemoteAdmitter::calls_on_kept_leases() const noexcept {
  return impl_->reused.load(std::memory_order_relaxed);
}

std::uint64_t RemoteAdmitter::keeps_sent() const noexcept {
  return impl_->keeps.load(std::memory_order_relaxed);
}

Ticket RemoteAdmitter::admit(const CallInfo& call) {
  const RemoteOptions& o = impl_->options;
  std::string key = o.key ? o.key(call) : std::string(call.method);
  const bool reuse = o.lease_reuse > std::chrono::milliseconds{0};
  std::weak_ptr<Impl> impl = impl_;
  if (reuse)
    if (std::shared_ptr<Impl::Kept> k = impl_->take(key)) return Impl::kept_ticket(impl, k);
  Unreachable& down = *impl_->unreachable;
  if (down.down())
    return unasked(not_asked(o.unreachable_retry), "admit", o.policy, o.fail_open,
                   o.unreachable_retry);
  pb::AdmitRequest req;
  req.set_policy(o.policy);
  req.set_key(key);
  pb::AdmitResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + o.timeout);
  const grpc::Status s = impl_->stub->Admit(&ctx, req, &resp);
  if (!s.ok()) {
    down.note(s);
    return unasked(s, "admit", o.policy, o.fail_open, o.unreachable_retry);
  }
  Ticket t;
  if (!resp.admitted()) {
    const pb::Rejection& r = resp.rejection();
    t.refusal = grpc::Status(code_of_http(r.status()), r.detail().empty() ? r.title() : r.detail());
    if (r.has_retry_after()) t.retry_after = nanos_of(r.retry_after());
    return t;
  }
  if (reuse && resp.reusable())
    return Impl::kept_ticket(impl, impl_->keep_new(resp.lease_id(), std::move(key)));
  t.admitted = true;
  t.release = [impl, lease = resp.lease_id()](StatusCode code, std::chrono::nanoseconds latency) {
    if (const auto i = impl.lock()) i->release(lease, code, latency);
  };
  return t;
}

// ---- RemoteRateAdmitter ----

struct RemoteRateAdmitter::Impl {
  std::unique_ptr<pb::Sluice::Stub> stub;
  RemoteRateOptions options;
  std::optional<RateAllowances> allowances;
  std::optional<Unreachable> unreachable;
  std::mutex mu;
  std::condition_variable idle;
  std::size_t refilling = 0;  // refills not answered yet (guarded by mu)

  // Asks for `hits` more on `key` without waiting (the allowance's refill): its answer, or
  // none, goes to the allowance.
  void refill(const std::string& key, std::uint64_t hits);
};

RemoteRateAdmitter::RemoteRateAdmitter(const std::shared_ptr<grpc::Channel>& sluice,
                                       RemoteRateOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (options.hits < 1) throw std::invalid_argument("hits: must be >= 1");
  impl_->unreachable.emplace(options.unreachable_retry);
  impl_->stub = pb::Sluice::NewStub(sluice);
  if (options.allowance > 0)
    impl_->allowances.emplace(options.allowance, options.allowance_hold,
                              options.allowance_max_keys);
  impl_->options = std::move(options);
}

RemoteRateAdmitter::~RemoteRateAdmitter() {
  std::unique_lock lock(impl_->mu);
  impl_->idle.wait(lock, [&] { return impl_->refilling == 0; });  // each within its timeout
}

AllowanceStats RemoteRateAdmitter::allowance_stats() const {
  return impl_->allowances ? impl_->allowances->stats() : AllowanceStats{};
}

std::size_t RemoteRateAdmitter::refills_in_flight() const {
  std::lock_guard lock(impl_->mu);
  return impl_->refilling;
}

namespace {

constexpr std::int64_t kNeverSeconds = 315'576'000'000;  // the largest Duration: never passes

RateAnswer answer_of(const pb::Decision& d) {
  RateAnswer a;
  a.allowed = d.allowed();
  a.would_deny = d.would_deny();
  a.has_reason = !d.reason().empty();
  a.limit = d.limit();
  a.remaining = d.remaining();
  if (d.has_retry_after() && d.retry_after().seconds() < kNeverSeconds)
    a.retry_after = nanos_of(d.retry_after());
  return a;
}

// An admitted call with nothing to release (a rate policy's hits are spent).
Ticket admitted_unreleased() {
  Ticket t;
  t.admitted = true;
  return t;
}

// A refused check's ticket: RESOURCE_EXHAUSTED, the policy and its limit (the key is not
// repeated: it may be a credential), retry-after when it can pass.
Ticket rate_refusal(const std::string& policy, std::uint64_t limit, const std::string& reason,
                    std::optional<std::chrono::nanoseconds> retry_after) {
  Ticket t;
  std::string detail = reason.empty()
                           ? "rate policy " + policy + ": no allowance left for this key (limit " +
                                 std::to_string(limit) + ")"
                           : "rate policy " + policy + " refused this key: " + reason;
  if (!retry_after) detail += "; the call's hits can never pass";
  t.refusal = grpc::Status(StatusCode::RESOURCE_EXHAUSTED, detail);
  t.retry_after = retry_after;
  return t;
}

}  // namespace

void RemoteRateAdmitter::Impl::refill(const std::string& key, std::uint64_t hits) {
  if (unreachable->down()) {
    allowances->refilled(key, hits, std::nullopt, Clock::now());
    return;
  }
  struct Pending {
    grpc::ClientContext ctx;
    pb::CheckRequest req;
    pb::CheckResponse resp;
  };
  auto* p = new Pending;
  p->req.set_policy(options.policy);
  p->req.set_key(key);
  p->req.set_hits(static_cast<std::int64_t>(hits));
  p->ctx.set_deadline(std::chrono::system_clock::now() + options.timeout);
  {
    std::lock_guard lock(mu);
    ++refilling;
  }
  stub->async()->Check(&p->ctx, &p->req, &p->resp, [this, p](grpc::Status s) {
    if (!s.ok()) unreachable->note(s);
    allowances->refilled(p->req.key(), static_cast<std::uint64_t>(p->req.hits()),
                         s.ok() ? std::optional(answer_of(p->resp.decision())) : std::nullopt,
                         Clock::now());
    delete p;
    std::lock_guard lock(mu);
    if (--refilling == 0) idle.notify_all();
  });
}

Ticket RemoteRateAdmitter::admit(const CallInfo& call) {
  const RemoteRateOptions& o = impl_->options;
  const std::string key = o.key ? o.key(call) : std::string(call.method);
  RateAllowances* a = impl_->allowances ? &*impl_->allowances : nullptr;
  if (a != nullptr) {
    if (const auto local = a->local(key, o.hits, Clock::now())) {
      if (local->refill > 0) impl_->refill(key, local->refill);
      if (local->allowed) return admitted_unreleased();
      return rate_refusal(o.policy, local->limit, {}, local->retry_after);
    }
  }
  Unreachable& down = *impl_->unreachable;
  if (down.down())
    return unasked(not_asked(o.unreachable_retry), "check", o.policy, o.fail_open,
                   o.unreachable_retry);
  std::uint64_t asked = a != nullptr ? a->ask(key, o.hits) : o.hits;
  for (;;) {  // each ask smaller than the last, down to the call's own hits
    pb::CheckRequest req;
    req.set_policy(o.policy);
    req.set_key(key);
    req.set_hits(static_cast<std::int64_t>(asked));
    pb::CheckResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + o.timeout);
    const grpc::Status s = impl_->stub->Check(&ctx, req, &resp);
    if (!s.ok()) {
      down.note(s);
      return unasked(s, "check", o.policy, o.fail_open, o.unreachable_retry);
    }
    const pb::Decision& d = resp.decision();
    const RateAnswer answer = answer_of(d);
    if (a != nullptr) {
      if (const auto next = a->answered(key, asked, o.hits, answer, Clock::now())) {
        asked = *next;
        continue;
      }
    }
    if (d.allowed()) return admitted_unreleased();
    return rate_refusal(o.policy, d.limit(), d.reason(), answer.retry_after);
  }
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
client_interceptors(std::shared_ptr<Admitter> admitter) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> out;
  out.push_back(std::make_unique<ClientFactory>(std::move(admitter)));
  return out;
}

std::shared_ptr<grpc::Channel> admitted_channel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    std::shared_ptr<Admitter> admitter, const grpc::ChannelArguments& args) {
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, credentials, args, client_interceptors(std::move(admitter)));
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
server_interceptors(std::shared_ptr<Admitter> admitter) {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
  out.push_back(std::make_unique<ServerFactory>(std::move(admitter)));
  return out;
}

std::optional<grpc::Status> refusal(const grpc::ServerContextBase* ctx) {
  return refusals().find(ctx);
}

}  // namespace sluice::adapters
