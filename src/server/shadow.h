// shadow.h (private to the engine): shadow mode (PolicySpec::shadow, server.shadow_mode), how a
// team runs a limit beside the one it replaces before letting it refuse anything.
//
// A policy in shadow decides and counts exactly as configured; what changes is the answer: a
// call it refuses is allowed instead, with would_deny and what it would have said (reason,
// retry_after, the rejection), and Policy::count_shadow_denied() counts it. Nothing is debited
// for such a call: a rate check it would have refused spent nothing (a refused check never
// does), and an admit it would have refused gets a lease on a ShadowPermit, which holds no
// permit of the policy and gives nothing back when it ends. So the policy's own state is the
// state it would have with enforcement on, and its limits see only the calls it admitted.
//
//   ShadowRate    the rate family of a policy in shadow: check, check_or_defer (a deferred
//                 answer converted when it comes), peek (converted, not counted); refund,
//                 charge and refusal as the policy's own. A CheckMany never refunds a would_deny
//                 check.
//   ShadowPermit  the permit of an admit its policy would have refused.
//
// Thread-safety: as the policy it wraps.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "server/permit.h"
#include "server/policy.h"

namespace sluice::server {

// A refusal as shadow mode answers it: allowed, saying it would have been denied.
inline void allow_in_shadow(RateDecision& d) noexcept {
  d.allowed = true;
  d.would_deny = true;
}

class ShadowRate final : public RateFamily {
 public:
  // `policy` serves the rate family; it outlives this.
  explicit ShadowRate(Policy& policy) : policy_(policy), inner_(*policy.rate_family()) {}

  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    RateDecision d = inner_.check(key, hits, now);
    shadowed(d, policy_);
    return d;
  }
  Decided<RateDecision> check_or_defer(std::string_view key, std::uint64_t hits, Nanos now,
                                       Deferral<RateDecision>& later) override {
    Later wrapped(later, policy_);
    Decided<RateDecision> d = inner_.check_or_defer(key, hits, now, wrapped);
    if (d && d->ok()) shadowed(d->value(), policy_);
    return d;
  }
  RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const override {
    RateDecision d = inner_.peek(key, hits, now);
    if (!d.allowed) allow_in_shadow(d);
    return d;
  }
  void refund(std::string_view key, std::uint64_t hits, Nanos now) override {
    inner_.refund(key, hits, now);
  }
  // A charge is recorded as without shadow: it is never refused.
  StatusOr<RateCharge> charge(std::string_view key, std::uint64_t hits, Nanos now) override {
    return inner_.charge(key, hits, now);
  }
  Rejection refusal(std::string_view key, const RateDecision& d) const override {
    return inner_.refusal(key, d);
  }

 private:
  static void shadowed(RateDecision& d, Policy& p) noexcept {
    if (d.allowed) return;
    allow_in_shadow(d);
    p.count_shadow_denied();
  }

  // The caller's Deferral, its answer converted when it comes (the policy answers a deferred
  // check before it is destroyed: completion.h).
  class Later final : public Deferral<RateDecision> {
   public:
    Later(Deferral<RateDecision>& outer, Policy& policy) : outer_(outer), policy_(policy) {}
    Completion<RateDecision> defer() override {
      return [done = outer_.defer(), p = &policy_](StatusOr<RateDecision> d) mutable {
        if (d.ok()) shadowed(d.value(), *p);
        done(std::move(d));
      };
    }
    void on_cancel(Once<void()> hook) override { outer_.on_cancel(std::move(hook)); }

   private:
    Deferral<RateDecision>& outer_;
    Policy& policy_;
  };

  Policy& policy_;
  RateFamily& inner_;
};

// The permit of an admit its policy would have refused: it holds nothing of the policy.
struct ShadowPermit {
  void finish(const CallEnd& /*end*/) noexcept {}
};

}  // namespace sluice::server
