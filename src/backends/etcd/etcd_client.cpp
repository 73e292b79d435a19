// etcd_client.cpp: the members in turn, each attempt bounded; errors named by member.
#include "backends/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "sluice/core/text.h"

namespace sluice::etcd_detail {
namespace {

using std::chrono::milliseconds;

// What etcd answers for an expired, revoked or unknown token.
bool token_refused(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         s.error_message().find("invalid auth token") != std::string::npos;
}

// Whether another member may answer what this one could not: it is away or has no leader.
bool try_another(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         s.error_code() == grpc::StatusCode::CANCELLED;
}

// etcd's refusals that are not the cluster being away keep their meaning; a full database
// (etcd's NOSPACE alarm: "database space exceeded") takes no writes, which to a coordinator is an
// outage.
StatusCode code_of(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return StatusCode::kPermissionDenied;
    case grpc::StatusCode::NOT_FOUND:  // "etcdserver: requested lease not found"
      return StatusCode::kNotFound;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StatusCode::kDeadlineExceeded;
    default:
      return StatusCode::kUnavailable;
  }
}

// gRPC takes deadlines on the system clock only: the same time from now.
void set_deadline(grpc::ClientContext& ctx, SteadyTime deadline) {
  const Nanos left = deadline - steady_now();
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
}

std::string said(const grpc::Status& s) {
  return s.error_message().empty() ? "gRPC code " + std::to_string(s.error_code())
                                   : s.error_message();
}

}  // namespace

struct EtcdClient::Member {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;

  Member(std::string e, const std::shared_ptr<grpc::ChannelCredentials>& credentials)
      : endpoint(std::move(e)) {
    grpc::ChannelArguments args;
    // A member that comes back is reached again within a second (gRPC's default backoff grows to
    // two minutes).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A connection that stopped answering is found while calls are on it (etcd's server refuses
    // pings more often than every 5 s, and pings without a call).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
    channel = grpc::CreateCustomChannel(endpoint, credentials, args);
    kv = etcdserverpb::KV::NewStub(channel);
    lease = etcdserverpb::Lease::NewStub(channel);
    auth = etcdserverpb::Auth::NewStub(channel);
  }
};

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // etcd: every key
}

// A whole file's bytes; false when it cannot be read.
static bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  out = text.str();
  return static_cast<bool>(in) || in.eof();
}

EtcdClient::EtcdClient(EtcdOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials)
    : options_(std::move(options)) {
  for (const std::string& e : options_.endpoints)
    members_.push_back(std::make_unique<Member>(e, credentials));
}

EtcdClient::~EtcdClient() = default;

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::open(EtcdOptions options) {
  if (options.endpoints.empty())
    return Status(StatusCode::kInvalidArgument, "endpoints: must name at least one member");
  for (const std::string& e : options.endpoints) {
    HostPort hp;
    if (!parse_host_port(e, hp).empty())
      return Status(StatusCode::kInvalidArgument,
                    "endpoints: each must be host:port with a port in 1..65535, not '" + e + "'");
  }
  if (options.connect_timeout <= Nanos{0})
    return Status(StatusCode::kInvalidArgument, "connect_timeout: must be > 0");
  if (options.username.empty() != options.password.empty())
    return Status(StatusCode::kInvalidArgument,
                  "username and password: give both or neither (etcd authentication)");
  if (options.cert_file.empty() != options.key_file.empty())
    return Status(StatusCode::kInvalidArgument,
                  "cert_file and key_file: give both or neither (a client certificate)");
  if (!options.cert_file.empty() && options.ca_file.empty())
    return Status(StatusCode::kInvalidArgument,
                  "ca_file: needed with cert_file (the CA that signed the members' certificates)");
  try {
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
    if (!options.ca_file.empty()) {
      grpc::SslCredentialsOptions tls;
      const auto read = [](const std::string& field, const std::string& path, std::string& out) {
        return read_file(path, out)
                   ? Status()
                   : Status(StatusCode::kInvalidArgument, field + ": cannot read '" + path + "'");
      };
      if (Status s = read("ca_file", options.ca_file, tls.pem_root_certs); !s.ok()) return s;
      if (!options.cert_file.empty()) {
        if (Status s = read("cert_file", options.cert_file, tls.pem_cert_chain); !s.ok()) return s;
        if (Status s = read("key_file", options.key_file, tls.pem_private_key); !s.ok()) return s;
      }
      credentials = grpc::SslCredentials(tls);
    }
    return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(credentials)));
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal,
                  std::string("etcd: cannot make its channels: ") + e.what());
  }
}

std::string EtcdClient::token() const {
  std::lock_guard lock(token_mu_);
  return token_;
}

Status EtcdClient::authenticate(Member& m, SteadyTime deadline) {
  grpc::ClientContext ctx;
  set_deadline(ctx, deadline);
  etcdserverpb::AuthenticateRequest req;
  req.set_name(options_.username);
  req.set_password(options_.password);
  etcdserverpb::AuthenticateResponse resp;
  const grpc::Status s = m.auth->Authenticate(&ctx, req, &resp);
  if (!s.ok()) {
    const StatusCode code = try_another(s) ? code_of(s) : StatusCode::kPermissionDenied;
    return Status(
        code, "etcd " + m.endpoint + ": authenticating as '" + options_.username + "': " + said(s));
  }
  std::lock_guard lock(token_mu_);
  token_ = resp.token();
  return {};
}

template <typename Rpc>
Status EtcdClient::call(const char* what, SteadyTime deadline, const Rpc& rpc) {
  const std::size_t n = members_.size();
  const std::size_t first = current_.load(std::memory_order_relaxed) % n;
  std::string tried;  // what each member said
  bool reauthenticated = false;
  grpc::Status last;
  for (std::size_t i = 0; i < 2 * n; ++i) {
    const SteadyTime now = steady_now();
    if (now >= deadline) break;
    Member& m = *members_[(first + i) % n];
    // Half of what is left, unless no other member is left to try; a connection not up yet at
    // most connect_timeout.
    SteadyTime until = i + 1 < 2 * n && n > 1 ? now + (deadline - now) / 2 : deadline;
    if (m.channel->GetState(true) != GRPC_CHANNEL_READY)
      until = std::min(until, now + options_.connect_timeout);
    if (!options_.username.empty() && token().empty()) {
      if (Status a = authenticate(m, until); !a.ok()) {
        if (a.code() == StatusCode::kPermissionDenied) return a;
        tried += (tried.empty() ? "" : "; ") + a.message();
        continue;
      }
    }
    grpc::ClientContext ctx;
    set_deadline(ctx, until);
    if (const std::string t = options_.username.empty() ? std::string() : token(); !t.empty())
      ctx.AddMetadata("token", t);
    last = rpc(m, ctx);
    if (last.ok()) {
      current_.store((first + i) % n, std::memory_order_relaxed);
      return {};
    }
    if (!options_.username.empty() && token_refused(last) && !reauthenticated) {
      reauthenticated = true;
      {
        std::lock_guard lock(token_mu_);
        token_.clear();
      }
      --i;  // the same member, once more, with a new token
      continue;
    }
    tried += (tried.empty() ? "" : "; ") + m.endpoint + ": " + said(last);
    if (!try_another(last))
      return Status(code_of(last),
                    std::string("etcd ") + what + ": " + m.endpoint + ": " + said(last));
  }
  if (steady_now() >= deadline)
    return Status(StatusCode::kDeadlineExceeded,
                  std::string("etcd ") + what + " did not finish within the timeout" +
                      (tried.empty() ? std::string() : " (" + tried + ")"));
  return Status(StatusCode::kUnavailable,
                std::string("etcd ") + what + ": no member answered (" + tried + ")");
}

Status EtcdClient::connect(SteadyTime deadline) {
  // An empty Txn is a linearizable read: only a member in touch with a quorum answers it (Status
  // would be answered by an isolated member too).
  etcdserverpb::TxnResponse resp;
  return txn(etcdserverpb::TxnRequest(), resp, deadline);
}

Status EtcdClient::txn(const etcdserverpb::TxnRequest& request, etcdserverpb::TxnResponse& response,
                       SteadyTime deadline) {
  return call("Txn", deadline, [&](Member& m, grpc::ClientContext& ctx) {
    response.Clear();
    return m.kv->Txn(&ctx, request, &response);
  });
}

Status EtcdClient::lease_grant(std::int64_t ttl_seconds, etcdserverpb::LeaseGrantResponse& response,
                               SteadyTime deadline) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_seconds);
  return call("LeaseGrant", deadline, [&](Member& m, grpc::ClientContext& ctx) {
    response.Clear();
    return m.lease->LeaseGrant(&ctx, req, &response);
  });
}

Status EtcdClient::lease_time_to_live(std::int64_t id,
                                      etcdserverpb::LeaseTimeToLiveResponse& response,
                                      SteadyTime deadline) {
  etcdserverpb::LeaseTimeToLiveRequest req;
  req.set_id(id);
  return call("LeaseTimeToLive", deadline, [&](Member& m, grpc::ClientContext& ctx) {
    response.Clear();
    return m.lease->LeaseTimeToLive(&ctx, req, &response);
  });
}

}  // namespace sluice::etcd_detail
