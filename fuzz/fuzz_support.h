// fuzz_support.h: what the libFuzzer targets share: the fixed config they build an Engine from,
// the lease bookkeeping behind their invariants, and a check that aborts with a message.
//
// Each input gets an Engine of its own (on a ManualClock), so that a crash reproduces from its
// input alone.
#pragma once

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
// nodes with breakers and a throttler over the adaptive policy's utilisation (shard "main"),
// small enough that inputs reach every refusal; admin endpoints need the token "secret".
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
  db:
    kind: throttler
    shard: main
    metrics:
      busy:
        probe: policy
        policy: search
        threshold: 0.9
)";

// Aborts (a crash to libFuzzer) with `what` when `ok` is false.
inline void require(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what.c_str());
  std::abort();
}

inline const SluiceConfig& engine_config() {
  static const SluiceConfig config = [] {
    ConfigLoad l = load_config(kEngineConfig, server::PolicyRegistry::builtin());
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
