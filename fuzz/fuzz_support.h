// fuzz_support.h: what the libFuzzer targets share: the fixed config they build an Engine from,
// the lease bookkeeping behind their invariants, and a check that aborts with a message.
//
// Each input gets an Engine of its own (on a ManualClock), so that a crash reproduces from its
// input alone.
#pragma once

#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/core/clock.h"
#include "sluice/core/text.h"

namespace sluice::fuzz {

// A rate policy, an adaptive policy behind it, a gateway (concurrency) policy, a cascade of two
// nodes with breakers, a throttler over the adaptive policy's utilisation (shard "main"), a rate
// policy and an adaptive one in shadow, and Envoy's rate limit service over kRlsRules (domain
// "edge", POST /json), small enough that inputs reach every refusal; admin endpoints need the
// token "secret". "RLS_RULES" stands for the rule file's path (engine_config() writes it).
inline constexpr const char* kEngineConfig = R"(
server:
  admin_token: secret
  lease_ttl: 10s
  max_lease_ttl: 1m
policies:
  api-rate:
    kind: rate
    strategy: fixed-window
    limit: 3
    period: 1s
  burst:
    kind: rate
    strategy: gcra
    limit: 5
    period: 1s
    burst: 2
  search:
    kind: adaptive
    algorithm: fixed
    limit: 2
    rate: api-rate
  gateway:
    kind: concurrency
    rate: api-rate
    tenants:
      - id: acme
        global_concurrency_limit: 3
      - id: acme-team
        parent: acme
    upstreams:
      - id: llm
        host: llm.internal
        owner: acme
        concurrency_limit:
          sharing: inherit
          max_concurrent: 2
          per_tenant_max: 2
        routes:
          - id: chat
            max_concurrent: 1
    bindings:
      - tenant: acme-team
        upstream: llm
  replicas:
    kind: cascade
    nodes:
      db-1: {algorithm: fixed, limit: 1}
      db-2: {algorithm: fixed, limit: 2}
    breaker: {failures: 2, open_for: 1s}
  shadowed:
    kind: rate
    shadow: true
    limit: 1
    period: 1s
  shadowed-db:
    kind: adaptive
    shadow: true
    algorithm: fixed
    limit: 1
    rate: api-rate
  envoy:
    kind: envoy_ratelimit
    config: RLS_RULES
    response_headers: both
  db:
    kind: throttler
    shard: main
    metrics:
      busy:
        probe: policy
        policy: search
        threshold: 0.9
)";

// envoyproxy/ratelimit's rules for the envoy policy: nested keys, a wildcard, unlimited,
// replaces, shadow and quota modes.
inline constexpr const char* kRlsRules = R"(domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2, name: per-user}
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: per-user}]}
  - key: tenant
    rate_limit: {unlimited: true}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
)";

// Aborts (a crash to libFuzzer) with `what` when `ok` is false.
inline void require(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what.c_str());
  std::abort();
}

inline const SluiceConfig& engine_config() {
  static const SluiceConfig config = [] {
    // The rule file, once per process, read when the config loads and removed then (the rules
    // are in the parsed config from there on, reloads included).
    const std::string rules = "/tmp/sluice-fuzz-rls-" + std::to_string(::getpid()) + ".yaml";
    FILE* f = std::fopen(rules.c_str(), "w");
    require(f != nullptr && std::fputs(kRlsRules, f) >= 0 && std::fclose(f) == 0,
            "the fuzz engine's rule file must be written: " + rules);
    std::string text = kEngineConfig;
    text.replace(text.find("RLS_RULES"), 9, rules);
    ConfigLoad l = load_config(text, server::PolicyRegistry::builtin());
    std::remove(rules.c_str());
    require(l.config.has_value(), "the fuzz engine's config must load");
    return *l.config;
  }();
  return config;
}

// A fresh Engine over engine_config() and the lease count its calls must leave: every admit
// that succeeded adds a lease, every release that succeeded and every expiry takes one away.
class EngineUnderTest {
 public:
  EngineUnderTest() {
    auto e = server::Engine::create(engine_config(), clock_);
    require(e.ok(), "the fuzz engine must build: " + (e.ok() ? "" : e.status().to_string()));
    engine_ = std::move(e.value());
  }
  ~EngineUnderTest() { engine_->close(); }
  EngineUnderTest(const EngineUnderTest&) = delete;
  EngineUnderTest& operator=(const EngineUnderTest&) = delete;

  [[nodiscard]] server::Engine& engine() { return *engine_; }
  // Moves the clock (0, 10ms, 1s or 2m by `step`'s low two bits) and sweeps expired leases.
  void advance(unsigned step) {
    static constexpr Nanos kSteps[] = {Nanos{0}, std::chrono::milliseconds(10),
                                       std::chrono::seconds(1), std::chrono::minutes(2)};
    const Nanos d = kSteps[step % 4];
    if (d == Nanos{0}) return;
    clock_.advance(d);
    const std::size_t expired = engine_->expire_leases();
    require(expired <= expected_, "more leases expired than were outstanding");
    expected_ -= expired;
    check_leases("after expiry");
  }
  void admitted(const std::string& lease_id) {
    require(!lease_id.empty(), "an admitted call has a lease id");
    last_lease_ = lease_id;
    ++expected_;
  }
  void released() {
    require(expected_ > 0, "a release succeeded with no lease outstanding");
    --expected_;
  }
  void check_leases(const char* when) const {
    require(engine_->leases() == expected_, std::string("leases ") + when + ": the engine holds " +
                                                std::to_string(engine_->leases()) +
                                                ", admits minus releases and expiries is " +
                                                std::to_string(expected_));
  }
  // The last lease an admit returned ("" before any): inputs name it with a placeholder, since
  // lease ids are random.
  // The listings answer whatever the input stored (an app name, a key, a tenant): the policies'
  // JSON parses and the metrics' exposition is UTF-8.
  void check_listings() const {
    const std::string policies = engine_->policies_json();
    require(!nlohmann::json::parse(policies, nullptr, false).is_discarded(),
            "the policies' listing is not JSON: " + policies.substr(0, 400));
    const std::string metrics = engine_->metrics_text();
    require(is_utf8(metrics),
            "the metrics are not UTF-8 at byte " + std::to_string(first_non_utf8(metrics)));
  }
  [[nodiscard]] const std::string& last_lease() const { return last_lease_; }

 private:
  ManualClock clock_{std::chrono::seconds(1000)};
  std::unique_ptr<server::Engine> engine_;
  std::size_t expected_ = 0;
  std::string last_lease_;
};

}  // namespace sluice::fuzz
