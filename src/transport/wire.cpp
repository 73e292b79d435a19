#include "transport/wire.h"

#include <string>
#include <utility>

namespace sluice::transport {

void to_proto(Nanos n, google::protobuf::Duration* d) {
  if (n == Nanos::max()) {
    d->set_seconds(kNeverSeconds);
    d->set_nanos(0);
    return;
  }
  d->set_seconds(n.count() / 1'000'000'000);
  d->set_nanos(static_cast<std::int32_t>(n.count() % 1'000'000'000));
}

double seconds_of(const google::protobuf::Duration& d) noexcept {
  return static_cast<double>(d.seconds()) + d.nanos() / 1e9;
}

grpc::Status to_grpc(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return grpc::Status::OK;
    case StatusCode::kInvalidArgument:
      return {grpc::StatusCode::INVALID_ARGUMENT, s.message()};
    case StatusCode::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, s.message()};
    case StatusCode::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, s.message()};
    case StatusCode::kDeadlineExceeded:
      return {grpc::StatusCode::DEADLINE_EXCEEDED, s.message()};
    case StatusCode::kAborted:
      return {grpc::StatusCode::ABORTED, s.message()};
    case StatusCode::kPermissionDenied:
      return {grpc::StatusCode::PERMISSION_DENIED, s.message()};
    case StatusCode::kFailedPrecondition:
      return {grpc::StatusCode::FAILED_PRECONDITION, s.message()};
    case StatusCode::kResourceExhausted:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, s.message()};
    case StatusCode::kAlreadyExists:
      return {grpc::StatusCode::ALREADY_EXISTS, s.message()};
    case StatusCode::kInternal:
      break;
  }
  return {grpc::StatusCode::INTERNAL, s.message()};
}

namespace {

// The words, in the order an error lists them.
constexpr std::pair<std::string_view, server::CallResult> kOutcomeWords[] = {
    {"success", server::CallResult::kSuccess}, {"dropped", server::CallResult::kDropped},
    {"timeout", server::CallResult::kTimeout}, {"overload", server::CallResult::kOverload},
    {"ignored", server::CallResult::kIgnored}, {"failed", server::CallResult::kFailed},
};

}  // namespace

void attributes_of(const v1::AdmitRequest& req, std::vector<server::CallAttribute>& out) {
  for (auto [name, value] :
       {std::pair<std::string_view, const std::string*>{"tenant", &req.tenant()},
        {"upstream", &req.upstream()},
        {"route", &req.route()}})
    if (!value->empty()) out.push_back({name, *value});
  for (const std::string& node : req.exclude()) out.push_back({"exclude", node});
  for (const v1::Attribute& a : req.attributes()) out.push_back({a.name(), a.value()});
}

StatusOr<server::CallResult> call_result_of(std::string_view word, std::string_view field) {
  for (const auto& [w, r] : kOutcomeWords)
    if (w == word) return r;
  std::string message(field);
  message += ": must be success, dropped, timeout, overload, ignored or failed, not '";
  message += word;
  message += "'";
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

StatusOr<server::CallResult> call_result_of(v1::Outcome o) {
  switch (o) {
    case v1::OUTCOME_UNSPECIFIED:
    case v1::OUTCOME_SUCCESS:
      return server::CallResult::kSuccess;
    case v1::OUTCOME_DROPPED:
      return server::CallResult::kDropped;
    case v1::OUTCOME_TIMEOUT:
      return server::CallResult::kTimeout;
    case v1::OUTCOME_OVERLOAD:
      return server::CallResult::kOverload;
    case v1::OUTCOME_IGNORED:
      return server::CallResult::kIgnored;
    case v1::OUTCOME_FAILED:
      return server::CallResult::kFailed;
    default:
      return Status(StatusCode::kInvalidArgument,
                    "outcome: unknown value " + std::to_string(static_cast<int>(o)));
  }
}

v1::Outcome to_proto(server::CallResult r) noexcept {
  switch (r) {
    case server::CallResult::kSuccess:
      return v1::OUTCOME_SUCCESS;
    case server::CallResult::kDropped:
      return v1::OUTCOME_DROPPED;
    case server::CallResult::kTimeout:
      return v1::OUTCOME_TIMEOUT;
    case server::CallResult::kOverload:
      return v1::OUTCOME_OVERLOAD;
    case server::CallResult::kIgnored:
      return v1::OUTCOME_IGNORED;
    case server::CallResult::kFailed:
      return v1::OUTCOME_FAILED;
  }
  return v1::OUTCOME_UNSPECIFIED;
}

}  // namespace sluice::transport
