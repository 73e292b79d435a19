// client.h: `sluice check|peek|admit|release|heartbeat|policies`: talk to a running server
// over gRPC.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice::cli {

struct ClientOptions {
  std::string server = "127.0.0.1:7070";  // host:port of `sluice serve`'s gRPC listener
  double timeout_seconds = 5;
  bool json = false;  // print the reply as one JSON object
};

struct CheckArgs {
  std::string policy, key;
  std::int64_t hits = 1;
  bool peek = false;
};
struct AdmitArgs {
  std::string policy, key, tenant, upstream, route, ttl;
  std::vector<std::string> exclude;     // a cascade: nodes not to choose
  std::string max_wait;                 // a queue: the most to wait in it (e.g. 500ms)
  std::vector<std::string> attributes;  // "name=value": what the policy's kind reads
};
struct ReleaseArgs {
  std::string lease_id, outcome = "success", rtt;
  std::optional<std::int64_t> cost;  // the chained rate policy's hits the call cost
};
struct ChargeArgs {
  std::string policy, key;
  std::int64_t hits = 0;  // > 0 charges, < 0 gives back
};

// Exit codes: 0 allowed / admitted / done, 1 denied / refused, 2 error (printed).
int run_check(const ClientOptions& o, const CheckArgs& a);
int run_admit(const ClientOptions& o, const AdmitArgs& a);
int run_release(const ClientOptions& o, const ReleaseArgs& a);
int run_charge(const ClientOptions& o, const ChargeArgs& a);
int run_heartbeat(const ClientOptions& o, const std::string& lease_id, const std::string& ttl);
int run_policies(const ClientOptions& o);

}  // namespace sluice::cli
