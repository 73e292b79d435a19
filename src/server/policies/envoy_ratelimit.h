// envoy_ratelimit.h: the envoy_ratelimit kind: Envoy's rate limit service (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit on the gRPC port, and on
// server.envoy_grpc when set; envoyproxy/ratelimit's `POST /json` on the HTTP port) over rules
// written in envoyproxy/ratelimit's config format, unchanged.
//
//   kind: envoy_ratelimit
//   config: /etc/ratelimit/config   # required: envoyproxy/ratelimit's YAML, a file or a
//                                   #   directory: its *.yaml and *.yml files, below it too,
//                                   #   in name order, skipping names that start with '.' (a
//                                   #   Kubernetes ConfigMap's ..data). Relative: to the
//                                   #   server's working directory.
//   merge_domains: false            # a domain in several files joins them (its
//                                   #   MERGE_DOMAIN_CONFIG); default: an error
//   shadow_mode: false              # every limit in shadow (its SHADOW_MODE): the overall
//                                   #   answer is OK; the statuses still say OVER_LIMIT. The
//                                   #   common `shadow: true` and server.shadow_mode do the same
//   max_keys: 1000000               # counters held per limit (the rate kind's max_keys)
//   coordinator: global             # a coordinator of the config (redis, postgres, memory):
//                                   #   every limit is then one budget for every sluice server
//                                   #   that names it, a fixed window on the coordinator's
//                                   #   clock decided here from escrow (the federated kind:
//                                   #   Δ = 0, no coordinator call per request); a rule's
//                                   #   `sluice_shared: false` keeps its limit on this server.
//                                   #   Default none: every limit is this server's own
//   region: us-east                 # this server at the coordinator; default its node id
//   batch: 16                       # units a lease takes; default 16
//   lease_timeout: 15ms             # the longest a request waits for a lease, so that the
//                                   #   answer comes within Envoy's default 20 ms; default 15ms
//   retry_backoff: 1s               # after a failed lease, no call for this long
//   outage: error                   # a shared limit with no escrow left here while the
//                                   #   coordinator cannot be reached: error answers the
//                                   #   request UNAVAILABLE (Envoy's filter then applies its
//                                   #   failure_mode_deny: open by default, as when
//                                   #   envoyproxy/ratelimit's Redis is down), over-limit
//                                   #   answers OVER_LIMIT (fail closed). Default error
//   io_threads: 4                   # coordinator calls in flight at once
//   response_headers: none          # headers for Envoy to add to the client's response
//                                   #   (response_headers_to_add): ietf (RateLimit-Policy and
//                                   #   RateLimit, one item per limit applied, named by its
//                                   #   `name` or its path), x-ratelimit (X-RateLimit-Limit,
//                                   #   -Remaining, -Reset of the limit with the least left),
//                                   #   both, or none (as envoyproxy/ratelimit by default);
//                                   #   with any but none, Retry-After when over the limit
//
// The rules (sluice/core/rls_rules.h says how a descriptor finds its limit): `domain`, nested
// `descriptors` with `key`, `value` (with '*' wildcards), `rate_limit` (`unit`: second, minute,
// hour, day, week, month (30 days) or year (365 days); `requests_per_unit`, 0 refusing every
// request; `unlimited`; `name`; `replaces`), `shadow_mode`, `quota_mode`, `detailed_metric`,
// `value_to_metric`, `share_threshold`. Unknown keys are errors, as there, and so is
// `metadata`, which sluice does not serve. sluice's own fields, which envoyproxy/ratelimit
// would refuse: `sluice_strategy` (fixed-window, the default; sliding-window or gcra count this
// rule's limit as the rate kind does, on this server only) and `sluice_shared` (true or false:
// whether this rule's limit is shared through the policy's coordinator; default: shared when
// the policy names one). A shared limit is a fixed window: a shared sliding-window or gcra
// rule is an error. `sluice validate` and every load report each error with the rule file's
// line and column.
//
// A request: an empty domain, no descriptors or a descriptor without entries is
// INVALID_ARGUMENT. An unknown domain applies no limit (every status OK). Each descriptor adds
// its own `hits_addend` if it has one (0: checks without adding), else the request's (0 or
// unset: 1). A descriptor's `limit` override counts it against that limit instead (its entries
// as given are the key). A limit on this server is a fixed window of its unit on the server's
// clock (a window starts at a multiple of the unit since the clock's start, not at the wall
// clock's minute), or its sluice_strategy; a shared one is a fixed window on the coordinator's
// clock. Unlike envoyproxy/ratelimit, a request over any limit adds
// nothing to any (its hits are given back where they were added), and a refused request does
// not count: a client refused for a minute is served again in the next window, not only once
// its refusals age out.
//
// A shared limit's budget at the coordinator is named by the policy, the rule's path and its
// limit ("<policy>/<path>/<requests_per_unit>_per_<unit>"): servers with the same rules share
// it, and a request's `limit` override is shared the same way. A lease is the federated
// kind's (sluice/federation/federation.h): a request whose shared limits have escrow here is
// answered without a coordinator call; one that needs a lease waits for it, at most
// lease_timeout. A request over any limit gives back what it took from every other, shared or
// not. A coordinator that lost its state (Redis empty, restarted or failed over:
// sluice/backends/redis_rate_coordinator.h) counts the window it finds that in as spent, so
// a shared limit refuses the rest of that window (reason coordinator_restarted): a fresh
// deployment's first window included.
//
// Charging after the response: a descriptor with an entry keyed `sluice_charge` (its value is
// not read; the entry is not part of the key) is a charge, not a check: its hits are counted
// whatever the limit has left (sluice/core/rate_strategy.h: charge; a shared limit's as the
// federated kind charges), never refused and never given back when another descriptor is over.
// An overdraft makes the limit's later checks wait until its window ends. This is what Envoy's
// `apply_on_stream_done` rate limits are for (Envoy ignores their answer): the stream-end
// request carries the cost as `hits_addend`, and a generic_key action with descriptor_key
// sluice_charge marks it, since the request itself cannot say it comes at stream end.
//
// Reload (SIGHUP, POST /admin/reload): the rule files are read again; each limit whose path
// (`domain.key_value.key`), unit, strategy and sharing stay keeps its counters, with its new
// requests_per_unit; a shared limit whose requests_per_unit changes starts a new budget (its
// name has the limit), so in the window of a change both may be spent: at most the old limit
// plus the new. A change of coordinator, region, batch, lease_timeout, retry_backoff, outage
// or io_threads builds the policy anew: per-server counters start again and shared escrow goes
// back to the coordinator.
//
// Metrics: sluice_rls_requests_total{code} (ok, over_limit, unavailable),
// sluice_rls_charged_hits_total, sluice_rls_hits_total{rule, result} (within_limit, over_limit,
// shadow_mode; `rule` the limit's path, or the name detailed_metric or value_to_metric makes from a
// request's values: at most 10,000 of those per policy, then
// "(other)"), sluice_shadow_denied_total, sluice_rls_unknown_domain_total, sluice_rls_limits,
// sluice_rls_keys; with a coordinator, sluice_rls_shared_limits, sluice_rls_leases_total,
// sluice_rls_lease_failures_total, sluice_rls_shared_refusals_total{reason} (the federated
// kind's reasons: budget_spent, coordinator_unreachable, coordinator_restarted, ...).
//
// Several envoy_ratelimit policies: a request goes to the first (by name) that has its domain.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/rate_headers.h"
#include "server/registry.h"
#include "sluice/core/rls_rules.h"
#include "sluice/federation/federation.h"
#include "sluice/local/rate_limiter.h"

namespace sluice::server {

// What a shared limit answers when it cannot be decided (the coordinator unreachable and no
// escrow here).
enum class RlsOutage : std::uint8_t { kError, kOverLimit };

// Sharing the limits through a coordinator.
struct RlsSharing {
  std::string coordinator;    // empty: every limit is this server's own
  FederationOptions options;  // region (empty: the node id), batch, lease_timeout, ...
  std::size_t io_threads = 4;
  RlsOutage outage = RlsOutage::kError;
  // Whether `o` can take over this one's shared limits in place.
  [[nodiscard]] bool same(const RlsSharing& o) const;
};

struct EnvoyRateLimitSpec final : PolicyBody {
  std::string config;              // the file or directory, as configured
  std::vector<std::string> files;  // the rule files read, in order
  std::shared_ptr<const rls::RuleTree> rules;
  bool merge_domains = false;
  bool shadow_mode = false;
  std::size_t max_keys = kDefaultMaxKeys;
  RateLimitHeaders response_headers = RateLimitHeaders::kNone;
  RlsSharing sharing;
};

[[nodiscard]] PolicyKind envoy_ratelimit_kind();

// envoy_ratelimit_config.cpp: reads the kind's section and its rule files.
std::shared_ptr<const PolicyBody> parse_envoy_ratelimit(const std::string& name,
                                                        ConfigSection& section, PolicySpec& spec);

// A request, apart from its wire form.
struct RlsDescriptor {
  std::vector<rls::Entry> entries;  // views into the request
  struct Override {
    std::uint32_t requests_per_unit = 0;
    std::uint32_t unit = 0;  // the protocol's number
  };
  std::optional<Override> limit;
  std::optional<std::uint64_t> hits_addend;
};
struct RlsRequest {
  std::string_view domain;
  std::vector<RlsDescriptor> descriptors;
  std::uint32_t hits_addend = 0;
};

struct RlsStatus {
  bool over = false;  // the status's code: OVER_LIMIT (else OK)
  struct Current {
    std::uint32_t requests_per_unit = 0;
    rls::Unit unit = rls::Unit::kUnknown;
    std::string name;
  };
  std::optional<Current> limit;  // the limit that decided it
  std::uint32_t remaining = 0;
  std::optional<Nanos> until_reset;
};
struct RlsAnswer {
  bool over = false;  // overall_code: OVER_LIMIT (else OK)
  std::vector<RlsStatus> statuses;
  NameValues headers;  // response_headers_to_add
};

}  // namespace sluice::server
