// Fixtures of the FederatedLimiter tests: a network the test drives, a coordinator that can be
// switched off (an outage), and the options and check helpers the tests share.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/rate_coordinator.h"
#include "sluice/core/regional_escrow.h"
#include "sluice/federation/federation.h"

namespace sluice::testing_support {

// Coordinator calls queued until the test delivers them (a network the test drives).
struct QueuedIo {
  std::deque<std::function<void()>> calls;
  IoExecutor executor() {
    return [this](std::function<void()> f) { calls.push_back(std::move(f)); };
  }
  std::size_t run_all() {
    std::size_t n = 0;
    while (!calls.empty()) {
      auto f = std::move(calls.front());
      calls.pop_front();
      f();
      ++n;
    }
    return n;
  }
};

inline IoExecutor inline_io() {
  return [](std::function<void()> f) { f(); };
}

// A coordinator that fails every call while `down` (an outage), else forwards.
class Switchable final : public RateCoordinator {
 public:
  explicit Switchable(RateCoordinator& inner) : inner_(inner) {}
  bool down = false;
  int calls = 0;
  std::vector<std::uint64_t> wants;  // each lease's ask, in order
  StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& r,
                             Nanos timeout) noexcept override {
    ++calls;
    wants.push_back(r.want);
    if (down) return Status(StatusCode::kUnavailable, "coordinator down");
    return inner_.lease(key, r, timeout);
  }
  int batches = 0;  // lease_many() calls
  // Run (once) inside the next lease_many() call: while a batch is out.
  std::function<void()> during;
  std::vector<StatusOr<LeaseReply>> lease_many(std::span<const LeaseCall> calls,
                                               Nanos timeout) noexcept override {
    ++batches;
    if (auto f = std::exchange(during, nullptr)) f();
    return RateCoordinator::lease_many(calls, timeout);  // lease() for each, counted there
  }
  StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region, Nanos w,
                                    std::uint64_t total, Nanos timeout) noexcept override {
    ++calls;
    if (down) return Status(StatusCode::kUnavailable, "coordinator down");
    return inner_.reconcile(key, region, w, total, timeout);
  }
  int health_calls = 0;
  Status health(Nanos timeout) noexcept override {
    ++health_calls;
    if (down) return Status(StatusCode::kUnavailable, "coordinator down");
    return inner_.health(timeout);
  }
  std::string_view backend() const noexcept override { return "switchable"; }

 private:
  RateCoordinator& inner_;
};

// A regional pool that fails every call while `down`, else forwards; counts the calls.
class SwitchablePool final : public RegionalEscrow {
 public:
  explicit SwitchablePool(RegionalEscrow& inner) : inner_(inner) {}
  bool down = false;
  int calls = 0;
  StatusOr<PoolReply> take(std::string_view key, std::uint64_t want, Nanos hold, bool past,
                           Nanos timeout) noexcept override {
    ++calls;
    if (down) return Status(StatusCode::kUnavailable, "pool down");
    return inner_.take(key, want, hold, past, timeout);
  }
  StatusOr<PoolReply> refill(std::string_view key, Nanos w, std::uint64_t units, Nanos expires_at,
                             Nanos timeout) noexcept override {
    ++calls;
    if (down) return Status(StatusCode::kUnavailable, "pool down");
    return inner_.refill(key, w, units, expires_at, timeout);
  }
  StatusOr<PoolReply> release(std::string_view key, Nanos w, std::uint64_t units,
                              Nanos timeout) noexcept override {
    ++calls;
    if (down) return Status(StatusCode::kUnavailable, "pool down");
    return inner_.release(key, w, units, timeout);
  }
  Status health(Nanos timeout) noexcept override {
    if (down) return Status(StatusCode::kUnavailable, "pool down");
    return inner_.health(timeout);
  }
  std::string_view backend() const noexcept override { return "switchable"; }

 private:
  RegionalEscrow& inner_;
};

inline FederationOptions opts(std::string region, std::uint64_t limit = 100) {
  FederationOptions o;
  o.region = std::move(region);
  o.budget = {limit, std::chrono::seconds(10)};
  o.batch = 16;
  o.drift_ppm = 0;
  return o;
}

inline FederatedDecision check_now(FederatedLimiter& f, std::string_view key, Nanos now,
                                   std::uint64_t hits = 1) {
  FederatedDecision out;
  bool answered = false;
  f.check(key, hits, now, [&](FederatedDecision d) {
    out = d;
    answered = true;
  });
  EXPECT_TRUE(answered) << "check was not answered";
  return out;
}

}  // namespace sluice::testing_support
