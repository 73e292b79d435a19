// etcd_client.h (private to backends/etcd): one etcd v3 cluster over gRPC, for the coordinators
// built on it.
//
// What it is: a channel per member (EtcdOptions::endpoints) and the few calls the coordinators
// make: Txn (reads are Txns with no compare, so that what they read is one revision), LeaseGrant
// and LeaseTimeToLive. A call goes to the member the last call succeeded on; when that
// member cannot answer (unreachable, no leader, isolated from the quorum: gRPC UNAVAILABLE, or
// its share of the time ran out), the call moves on to the next member while time is left, each
// attempt given half of what is left but the last (which gets all of it), and a member whose
// connection is not up yet at most connect_timeout. Every error names the member and what etcd
// said. Authentication (options.username): the token from Auth.Authenticate goes with every call,
// and a call refused for an expired or unknown token authenticates again and is sent once more.
//
// A Txn sent again after a timeout may have been applied the first time: the coordinators only
// send compare-and-swap Txns (the compare fails the second time) and reads.
//
// Thread-safety: every member is safe to call from any number of threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "etcd/etcd_rpc.grpc.pb.h"
#include "sluice/core/clock.h"
#include "sluice/core/etcd_options.h"
#include "sluice/core/status.h"

namespace sluice::etcd_detail {

// A time on SteadyClock (sluice/core/clock.h): every deadline here is one.
using SteadyTime = Nanos;

// Now on SteadyClock.
[[nodiscard]] inline SteadyTime steady_now() noexcept { return SteadyClock::instance().now(); }

class EtcdClient {
 public:
  // Checks the options (endpoints host:port, non-empty; connect_timeout > 0; the TLS files
  // readable) and reads the TLS files; connects to nothing.
  [[nodiscard]] static StatusOr<std::unique_ptr<EtcdClient>> open(EtcdOptions options);
  ~EtcdClient();

  // Waits until some member in touch with a quorum answers (a linearizable read; with a user,
  // after authenticating), at most until `deadline`.
  [[nodiscard]] Status connect(SteadyTime deadline);

  [[nodiscard]] Status txn(const etcdserverpb::TxnRequest& request,
                           etcdserverpb::TxnResponse& response, SteadyTime deadline);
  [[nodiscard]] Status lease_grant(std::int64_t ttl_seconds,
                                   etcdserverpb::LeaseGrantResponse& response, SteadyTime deadline);
  [[nodiscard]] Status lease_time_to_live(std::int64_t id,
                                          etcdserverpb::LeaseTimeToLiveResponse& response,
                                          SteadyTime deadline);

  [[nodiscard]] const EtcdOptions& options() const noexcept { return options_; }

 private:
  struct Member;
  EtcdClient(EtcdOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials);

  // Runs `rpc(member, context)` on the members in turn as described above.
  template <typename Rpc>
  Status call(const char* what, SteadyTime deadline, const Rpc& rpc);
  Status authenticate(Member& m, SteadyTime deadline);
  std::string token() const;

  const EtcdOptions options_;
  std::vector<std::unique_ptr<Member>> members_;
  std::atomic<std::size_t> current_{0};
  mutable std::mutex token_mu_;
  std::string token_;  // empty: not authenticated (or no user)
};

// The key just past every key that starts with `prefix` (etcd's range_end for a prefix).
[[nodiscard]] std::string prefix_end(std::string_view prefix);

}  // namespace sluice::etcd_detail
