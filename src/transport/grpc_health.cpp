#include "transport/grpc_health.h"

#include <optional>
#include <string>
#include <utility>

namespace sluice::transport {
namespace {

using Response = HealthService::Response;
using ServingStatus = HealthService::ServingStatus;

// `name` as a message quotes it (a name too long to quote by its size).
std::string quoted(const std::string& name) {
  if (name.size() > HealthService::kMaxServiceName)
    return "of " + std::to_string(name.size()) + " bytes";
  return "'" + name + "'";
}

// A Watch answered at once and ended: with `status` alone, or after one last message. It is
// gRPC's until OnDone, which frees it.
class Answered final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit Answered(grpc::Status status) { Finish(std::move(status)); }
  Answered(ServingStatus last, grpc::Status status) {
    last_.set_status(last);
    StartWriteAndFinish(&last_, grpc::WriteOptions(), std::move(status));
  }
  void OnDone() override { delete this; }

 private:
  Response last_;
};

}  // namespace

// One open Watch stream: at most one message on its way (out_, untouched until OnWriteDone),
// the latest status due after it (next_), and the end it is due (end_), which comes once the
// messages due are written. Its state (all but service_ and name_) is guarded by mu_. It is in
// the service's watchers_ from its creation to OnDone, which removes it and frees it.
class HealthService::Watcher final : public grpc::ServerWriteReactor<Response> {
 public:
  // Sends `now` at once. Needs the service's mu_.
  Watcher(HealthService& service, std::string name, ServingStatus now)
      : service_(service), name_(std::move(name)) {
    send_locked(now);
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  // Sends `status` now, or once the message on its way is written (the latest status wins;
  // none when it is the one on its way). Nothing once the stream is ending. Needs mu_.
  void send_locked(ServingStatus status) {
    if (end_ || finished_) return;
    if (writing_) {
      next_ = status == out_.status() ? std::nullopt : std::optional<ServingStatus>(status);
      return;
    }
    next_ = status;
    flush_locked();
  }
  // Ends the stream with `status` once the messages due are written; the first end asked for
  // is the one given. Needs mu_.
  void finish_locked(grpc::Status status) {
    if (end_ || finished_) return;
    end_ = std::move(status);
    flush_locked();
  }

  void OnWriteDone(bool ok) override {
    const std::lock_guard lock(service_.mu_);
    writing_ = false;
    if (!ok) drop_locked();  // the stream is gone: nothing more can be written
    flush_locked();
  }
  void OnCancel() override {
    const std::lock_guard lock(service_.mu_);
    drop_locked();
    flush_locked();
  }
  void OnDone() override {
    {
      const std::lock_guard lock(service_.mu_);
      service_.watchers_.erase(this);
      ++service_.ended_;
    }
    delete this;
  }

 private:
  // The client is gone: no more messages; the end is CANCELLED unless one was already asked.
  void drop_locked() {
    next_.reset();
    if (!end_) end_ = grpc::Status::CANCELLED;
  }
  // Starts what is due: the next message, or the end once nothing is on its way.
  void flush_locked() {
    if (writing_ || finished_) return;
    if (next_) {
      out_.set_status(*next_);
      next_.reset();
      writing_ = true;
      StartWrite(&out_);
    } else if (end_) {
      finished_ = true;
      Finish(*end_);
    }
  }

  HealthService& service_;
  const std::string name_;
  Response out_;                       // the message on its way (while writing_)
  bool writing_ = false;               // a StartWrite awaits its OnWriteDone
  std::optional<ServingStatus> next_;  // the status to send next
  std::optional<grpc::Status> end_;    // the end due once next_ and out_ are written
  bool finished_ = false;              // Finish was called: gRPC is ending the call
};

void HealthService::set_status(const std::string& service, bool serving) {
  const std::lock_guard lock(mu_);
  if (shut_down_) return;
  change_locked(service, serving ? Response::SERVING : Response::NOT_SERVING);
}

void HealthService::shutdown() {
  const std::lock_guard lock(mu_);
  if (shut_down_) return;
  for (const auto& entry : statuses_) change_locked(entry.first, Response::NOT_SERVING);
  shut_down_ = true;
  for (Watcher* w : watchers_) w->finish_locked(grpc::Status::OK);
}

std::size_t HealthService::watches() const {
  const std::lock_guard lock(mu_);
  return watchers_.size();
}

std::uint64_t HealthService::watches_ended() const {
  const std::lock_guard lock(mu_);
  return ended_;
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const Request* request, Response* response) {
  std::optional<ServingStatus> status;
  {
    const std::lock_guard lock(mu_);
    if (auto it = statuses_.find(request->service()); it != statuses_.end()) status = it->second;
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (!status) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "service: unknown service " + quoted(request->service())));
    return reactor;
  }
  response->set_status(*status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<Response>* HealthService::Watch(grpc::CallbackServerContext* /*ctx*/,
                                                         const Request* request) {
  const std::string& name = request->service();
  if (name.size() > kMaxServiceName)
    return new Answered(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "service: longer than " + std::to_string(kMaxServiceName) + " bytes"));
  const std::lock_guard lock(mu_);
  if (shut_down_) return new Answered(status_locked(name), grpc::Status::OK);
  if (watchers_.size() >= max_watches_)
    return new Answered(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        "health: " + std::to_string(watchers_.size()) +
            " Watch streams are open (server.max_watch_streams); try again later or use Check"));
  auto* watcher = new Watcher(*this, name, status_locked(name));
  watchers_.insert(watcher);
  return watcher;
}

ServingStatus HealthService::status_locked(const std::string& service) const {
  const auto it = statuses_.find(service);
  return it == statuses_.end() ? Response::SERVICE_UNKNOWN : it->second;
}

void HealthService::change_locked(const std::string& service, ServingStatus status) {
  auto [it, added] = statuses_.try_emplace(service, status);
  if (!added) {
    if (it->second == status) return;
    it->second = status;
  }
  for (Watcher* w : watchers_)
    if (w->name() == service) w->send_locked(status);
}

}  // namespace sluice::transport
