// admit_policy.h: what every admit-family kind shares: its counters (admitted, refused by its
// limit or by its gate, released, leases held), their state and metrics, the lease permit that
// counts a lease on it, and the adaptive guard's state, metrics and refusal (adaptive and fleet).
//
// Thread-safety: the counters are relaxed atomics (each exact on its own).
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "server/policy.h"
#include "sluice/local/adaptive_guard.h"

namespace sluice::server {

class AdmitPolicy : public Policy, public AdmitFamily {
 public:
  [[nodiscard]] AdmitFamily* admit_family() noexcept override { return this; }
  // Counted as refused by the rate (state's refused_by_rate, sluice_admissions_total).
  void refused_by_rate() noexcept override {
    gate_refused_.fetch_add(1, std::memory_order_relaxed);
  }
  // Counts `predecessor`'s leases still held as this policy's own from here on (they are calls
  // in flight against the limits it took over; BuildContext::predecessor). For the builder,
  // before the policy is served.
  void count_leases_of(const AdmitPolicy& predecessor) noexcept { leases_ = predecessor.leases_; }

 protected:
  using Policy::Policy;

  // A kind's permit P as a lease's permit: it counts one lease on this policy until finished
  // (and a release when its client finished it), and keeps this policy alive. P has
  // `void finish(const CallEnd&) noexcept`.
  template <class P>
  [[nodiscard]] LeasePermit lease(P permit) {
    admitted_.fetch_add(1, std::memory_order_relaxed);
    return LeasePermit(
        Lease<P>(std::move(permit), std::static_pointer_cast<AdmitPolicy>(shared_from_this())));
  }
  void count_limit_refusal() noexcept { limit_refused_.fetch_add(1, std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t leases() const noexcept {
    return leases_->load(std::memory_order_relaxed);
  }

  // The counters' state fields and metric families.
  void describe_admissions(nlohmann::json& j) const;
  void admission_metrics(std::vector<prometheus::MetricFamily>& out) const;

 private:
  template <class P>
  class Lease {
   public:
    Lease(P permit, std::shared_ptr<AdmitPolicy> policy) noexcept
        : permit_(std::move(permit)), policy_(std::move(policy)) {
      policy_->leases_->fetch_add(1, std::memory_order_relaxed);
    }
    Lease(Lease&&) noexcept = default;
    void finish(const CallEnd& end) noexcept {
      permit_.finish(end);
      if (end.by == CallEnd::By::kClient)
        policy_->released_.fetch_add(1, std::memory_order_relaxed);
      policy_->leases_->fetch_sub(1, std::memory_order_relaxed);
    }
    // Only where P renews (permit.h): the lease carries its client's next call. Not within the
    // policy once a reload has retired it (removed, or replaced by a new one): the client then
    // releases the lease after that call, and its next call meets the policy now served.
    bool renew(const CallEnd& end) noexcept requires requires(P& p) {
      { p.renew(end) }
      noexcept->std::same_as<bool>;
    }
    {
      policy_->renewed_.fetch_add(1, std::memory_order_relaxed);
      return permit_.renew(end) && !policy_->retired();
    }

   private:
    P permit_;
    std::shared_ptr<AdmitPolicy> policy_;
  };

  std::atomic<std::uint64_t> admitted_{0}, limit_refused_{0}, gate_refused_{0}, released_{0};
  std::atomic<std::uint64_t> renewed_{0};  // calls carried by a kept lease (Release with keep)
  // Leases held (shared with the successors that count them: count_leases_of(); set before the
  // policy serves, read-only after).
  std::shared_ptr<std::atomic<std::uint64_t>> leases_ =
      std::make_shared<std::atomic<std::uint64_t>>(0);
};

// An adaptive guard's permit, finished with the call's outcome and RTT, or renewed with them
// for its client's next call (GuardPermit::renew).
struct GuardLease {
  GuardPermit permit;
  void finish(const CallEnd& end) noexcept { permit.release(to_outcome(end.result), end.rtt); }
  bool renew(const CallEnd& end) noexcept { return permit.renew(to_outcome(end.result), end.rtt); }
};

// An adaptive guard's state fields (in_flight, limit, algorithm_limit, accepted, rejected,
// dropped, ignored); sets info's in_flight and limit.
void describe_guard(const AdaptiveGuardStats& s, nlohmann::json& j, PolicyInfo& info);
// sluice_policy_in_flight, sluice_policy_limit, sluice_policy_algorithm_limit.
void guard_metrics(const AdaptiveGuardStats& s, std::vector<prometheus::MetricFamily>& out);
// The 503 of a guard at its limit; `more`: appended to the detail.
[[nodiscard]] Rejection guard_refusal(const std::string& policy, const AdaptiveGuardStats& s,
                                      const std::string& more = {});

}  // namespace sluice::server
