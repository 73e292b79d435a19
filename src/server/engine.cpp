#include "server/engine.h"

#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "server/coordinators.h"
#include "server/json_text.h"
#include "server/policy.h"
#include "server/policy_set.h"
#include "server/shadow.h"

namespace sluice::server {

using nlohmann::json;

namespace {

// An attribute's name: 1 to 64 letters, digits, '_', '-' or '.' (what a config or a flag can
// name without quoting).
bool attribute_name(std::string_view n) {
  if (n.empty() || n.size() > 64) return false;
  for (const char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-' || c == '.'))
      return false;
  return true;
}

// What every admit's attributes must be, whatever the kind: a bounded number of named values,
// each at most kMaxNameBytes. What a value means is the kind's to check.
Status check_attributes(std::span<const CallAttribute> attributes) {
  if (attributes.size() > kMaxAttributes)
    return invalid("attributes", "at most " + std::to_string(kMaxAttributes) + " values, not " +
                                     std::to_string(attributes.size()));
  for (const CallAttribute& a : attributes) {
    if (!attribute_name(a.name))
      return invalid("attributes",
                     "'" + std::string(a.name.substr(0, 64)) +
                         "' is not an attribute name (1 to 64 letters, digits, '_', '-' or '.')");
    if (Status s = check_field(a.name, a.value, kMaxNameBytes, false); !s.ok()) return s;
  }
  return {};
}

// A lease TTL a call asks for.
Status check_ttl(Nanos ttl, Nanos max) {
  if (ttl <= Nanos{0}) return invalid("ttl", "must be > 0");
  if (ttl > max)
    return invalid("ttl",
                   "must be at most the server's max_lease_ttl (" + format_duration(max) + ")");
  return {};
}

Status check_lease_id(std::string_view id) {
  if (id.empty()) return invalid("lease_id", "must not be empty");
  if (!well_formed_lease_id(id)) return invalid("lease_id", "must be 32 hex digits");
  return {};
}

Status no_such_lease() {
  return Status(StatusCode::kNotFound,
                "lease_id: no such lease (never issued, already released, or expired)");
}

Status check_name(std::string_view field, std::string_view v) {
  return check_field(field, v, kMaxNameBytes, true);
}

std::string node_id_default() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host[0] != '\0' ? host : "sluice") + "-" + std::to_string(getpid()) + "-" +
         new_lease_id().substr(0, 8);
}

}  // namespace

// ---- the engine ----

StatusOr<std::unique_ptr<Engine>> Engine::create(const SluiceConfig& config, const Clock& clock,
                                                 const PolicyRegistry& kinds) {
  const std::string node_id =
      config.server.node_id.empty() ? node_id_default() : config.server.node_id;
  auto state = RuntimeStateStore::open(config.server.state_file);
  if (!state.ok())
    return Status(state.status().code(), "server.state_file: " + state.status().message());
  std::shared_ptr<RuntimeStateStore> store = std::move(state.value());
  auto directory = std::make_shared<PolicyDirectory>();
  auto notices = std::make_shared<Notices>();
  auto set = build_policy_set(config, clock, kinds, nullptr, nullptr, node_id, 1, store, directory,
                              notices);
  if (!set.ok()) return set.status();
  publish(*directory, *set.value());
  return std::unique_ptr<Engine>(new Engine(clock, kinds, std::move(store), std::move(directory),
                                            std::move(notices), std::move(set.value())));
}

Engine::Engine(const Clock& clock, const PolicyRegistry& kinds,
               std::shared_ptr<RuntimeStateStore> state, std::shared_ptr<PolicyDirectory> directory,
               std::shared_ptr<Notices> notices, std::shared_ptr<const PolicySet> set)
    : clock_(clock),
      kinds_(kinds),
      state_(std::move(state)),
      directory_(std::move(directory)),
      notices_(std::move(notices)),
      set_(std::move(set)) {}

Engine::~Engine() { close(); }

std::shared_ptr<const PolicySet> Engine::current() const {
  const std::lock_guard lock(set_mu_);
  return set_;
}

Status Engine::usable() const {
  if (draining()) return Status(StatusCode::kUnavailable, "the server is shutting down");
  return {};
}

namespace {

// "an adaptive policy": a policy's kind as a message names it.
std::string a_kind(const Policy& p) { return kinds_phrase({p.kind()}); }

// The rate family of the policy a Check, Peek, CheckMany or Charge names (`takes` and
// `instead` word the error for a policy of another family).
StatusOr<RateFamily*> rate_policy(const PolicySet& set, const PolicyRegistry& kinds,
                                  std::string_view name,
                                  std::string_view takes = "Check and Peek take ",
                                  std::string_view instead = " (use Admit)") {
  if (Status s = check_name("policy", name); !s.ok()) return s;
  const PolicySet::Entry* e = set.entry(name);
  if (e == nullptr)
    return Status(StatusCode::kNotFound, "policy: no policy named '" + std::string(name) + "'");
  const std::shared_ptr<Policy>& p = e->base;
  RateFamily* rate = e->rate_family();  // in shadow, the shadow's (shadow.h)
  if (rate == nullptr)
    return Status(
        StatusCode::kFailedPrecondition,
        "policy: '" + std::string(name) + "' is " + a_kind(*p) + "; " + std::string(takes) +
            kinds_phrase(kinds.kinds_of(&PolicyKindParser::rate_family)) + std::string(instead));
  return rate;  // `set` keeps it alive
}

// `hits` (> 0) charged to `key`, or -hits (< 0) given back first, and the key's allowance
// after either.
StatusOr<RateCharge> charge_or_give_back(RateFamily& rate, std::string_view key, std::int64_t hits,
                                         Nanos now) {
  if (hits > 0) return rate.charge(key, static_cast<std::uint64_t>(hits), now);
  if (hits < 0) rate.refund(key, static_cast<std::uint64_t>(-hits), now);
  return rate.charge(key, 0, now);
}

Status check_call(const CheckCall& c) {
  if (Status s = check_field("key", c.key, kMaxKeyBytes, true); !s.ok()) return s;
  if (c.hits < 1) return invalid("hits", "must be >= 1, not " + std::to_string(c.hits));
  if (c.hits > kMaxHits)
    return invalid("hits",
                   "must be <= " + std::to_string(kMaxHits) + ", not " + std::to_string(c.hits));
  return {};
}

}  // namespace

namespace {

// A Deferral whose caller waits on its own thread for the Completion.
template <class T>
class Waiting final : public Deferral<T> {
 public:
  Completion<T> defer() override { return answer_.setter(); }
  StatusOr<T> wait(Decided<T> now) { return now ? std::move(*now) : answer_.get(); }

 private:
  OneShot<StatusOr<T>> answer_;
};

// Whether a check's answer took its hits (a would_deny one, allowed in shadow, took none).
bool debited(const StatusOr<RateDecision>& d) {
  return d.ok() && d.value().allowed && !d.value().would_deny;
}

// A CheckMany once one of its checks was deferred: the checks' answers as they come, and the
// call's Completion, called when the last one is in.
class ManyChecks : public std::enable_shared_from_this<ManyChecks> {
 public:
  ManyChecks(std::shared_ptr<const PolicySet> set, std::span<const CheckCall> calls,
             std::span<RateFamily* const> ps, Nanos now, Completion<CheckManyResult> done)
      : set_(std::move(set)), ps_(ps.begin(), ps.end()), now_(now), done_(std::move(done)) {
    for (const CheckCall& c : calls) {
      keys_.emplace_back(c.key);
      hits_.push_back(static_cast<std::uint64_t>(c.hits));
    }
    got_.resize(calls.size());
  }

  // Check i was decided now.
  void decided(std::size_t i, StatusOr<RateDecision> d) {
    const std::lock_guard lock(mu_);
    got_[i].emplace(std::move(d));
  }
  // Check i was deferred: its Completion.
  Completion<RateDecision> deferred(std::size_t i) {
    {
      const std::lock_guard lock(mu_);
      ++outstanding_;
    }
    return
        [self = shared_from_this(), i](StatusOr<RateDecision> d) { self->arrive(i, std::move(d)); };
  }
  // Every check that will be was issued: `n` of them.
  void issued(std::size_t n) {
    bool last = false;
    {
      const std::lock_guard lock(mu_);
      issued_ = n;
      issuing_ = false;
      last = outstanding_ == 0;
    }
    if (last) finish();
  }

 private:
  void arrive(std::size_t i, StatusOr<RateDecision> d) {
    bool last = false;
    {
      const std::lock_guard lock(mu_);
      got_[i].emplace(std::move(d));
      last = --outstanding_ == 0 && !issuing_;
    }
    if (last) finish();
  }
  // Every answer is in (no other thread touches got_ now).
  void finish() {
    CheckManyResult out;
    std::optional<Status> error;
    std::size_t first = issued_;  // the first denial or error
    for (std::size_t i = 0; i < issued_; ++i) {
      const StatusOr<RateDecision>& d = *got_[i];
      if (!d.ok() || !d.value().allowed) {
        first = i;
        if (!d.ok())
          error = Status(d.status().code(),
                         "checks[" + std::to_string(i) + "]." + d.status().message());
        break;
      }
    }
    if (first < issued_)  // all or nothing: give back every hit allowed, wherever it is
      for (std::size_t i = 0; i < issued_; ++i)
        if (debited(*got_[i])) ps_[i]->refund(keys_[i], hits_[i], now_);
    if (error) return done_(*error);
    for (std::size_t i = 0; i < issued_ && i <= first; ++i)
      out.decisions.push_back(got_[i]->value());
    out.allowed = first == issued_;
    out.denied_index = out.allowed ? -1 : static_cast<int>(first);
    done_(std::move(out));
  }

  const std::shared_ptr<const PolicySet> set_;  // keeps ps_ alive
  const std::vector<RateFamily*> ps_;
  std::vector<std::string> keys_;
  std::vector<std::uint64_t> hits_;
  const Nanos now_;
  Completion<CheckManyResult> done_;
  std::mutex mu_;
  std::vector<std::optional<StatusOr<RateDecision>>> got_;
  std::size_t outstanding_ = 0;
  std::size_t issued_ = 0;
  bool issuing_ = true;
};

// Check i of a CheckMany: deferring it makes the ManyChecks (and takes the call's Deferral).
class ManyCheck final : public Deferral<RateDecision> {
 public:
  using Make = std::function<std::shared_ptr<ManyChecks>()>;
  ManyCheck(std::shared_ptr<ManyChecks>& many, const Make& make, std::size_t i)
      : many_(many), make_(make), i_(i) {}
  Completion<RateDecision> defer() override {
    if (many_ == nullptr) many_ = make_();
    return many_->deferred(i_);
  }

 private:
  std::shared_ptr<ManyChecks>& many_;
  const Make& make_;
  std::size_t i_;
};

}  // namespace

Decided<RateDecision> Engine::check(const CheckCall& call, Deferral<RateDecision>& later) {
  if (Status s = usable(); !s.ok()) return s;
  const auto set = current();
  auto p = rate_policy(*set, kinds_, call.policy);
  if (!p.ok()) return p.status();
  if (Status s = check_call(call); !s.ok()) return s;
  // A deferred check keeps its policy alive through the Completion it holds (`set` may be
  // replaced meanwhile): the policy's contract is to finish it, retired or not.
  return p.value()->check_or_defer(call.key, static_cast<std::uint64_t>(call.hits), clock_.now(),
                                   later);
}

StatusOr<RateDecision> Engine::check(const CheckCall& call) {
  Waiting<RateDecision> w;
  return w.wait(check(call, w));
}

std::string Engine::refusal_detail(const CheckCall& call, const RateDecision& d) const {
  if (d.allowed || d.reason.empty()) return {};
  const auto set = current();
  auto p = rate_policy(*set, kinds_, call.policy);
  if (!p.ok()) return {};
  return p.value()->refusal(call.key, d).detail();
}

StatusOr<RateDecision> Engine::peek(const CheckCall& call) const {
  if (Status s = usable(); !s.ok()) return s;
  const auto set = current();
  auto p = rate_policy(*set, kinds_, call.policy);
  if (!p.ok()) return p.status();
  if (Status s = check_call(call); !s.ok()) return s;
  return p.value()->peek(call.key, static_cast<std::uint64_t>(call.hits), clock_.now());
}

Decided<CheckManyResult> Engine::check_many(std::span<const CheckCall> calls,
                                            Deferral<CheckManyResult>& later) {
  if (Status s = usable(); !s.ok()) return s;
  if (calls.empty()) return invalid("checks", "must not be empty");
  if (calls.size() > kMaxBatch)
    return invalid("checks", "has " + std::to_string(calls.size()) + " entries; at most " +
                                 std::to_string(kMaxBatch));
  const auto set = current();
  // Validate everything before debiting anything.
  std::vector<RateFamily*> ps;
  ps.reserve(calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    auto p = rate_policy(*set, kinds_, calls[i].policy);
    Status s = p.ok() ? check_call(calls[i]) : p.status();
    if (!s.ok()) return Status(s.code(), "checks[" + std::to_string(i) + "]." + s.message());
    ps.push_back(p.value());
  }
  const Nanos now = clock_.now();
  CheckManyResult out;
  out.decisions.reserve(calls.size());
  std::shared_ptr<ManyChecks> many;  // made when the first check is deferred
  const ManyCheck::Make make = [&] {
    return std::make_shared<ManyChecks>(set, calls, ps, now, later.defer());
  };
  std::size_t i = 0;
  for (; i < calls.size(); ++i) {
    const auto hits = static_cast<std::uint64_t>(calls[i].hits);
    ManyCheck one(many, make, i);
    Decided<RateDecision> d = ps[i]->check_or_defer(calls[i].key, hits, now, one);
    if (!d) continue;  // deferred: `many` holds its place
    const bool stop = !d->ok() || !d->value().allowed;
    if (many != nullptr) {
      many->decided(i, std::move(*d));
    } else if (stop) {
      // Nothing deferred so far: answer now, as an all-inline CheckMany always has.
      for (std::size_t j = 0; j < i; ++j)
        if (debited(out.decisions[j]))
          ps[j]->refund(calls[j].key, static_cast<std::uint64_t>(calls[j].hits), now);
      if (!d->ok())
        return Status(d->status().code(),
                      "checks[" + std::to_string(i) + "]." + d->status().message());
      out.decisions.push_back(d->value());
      out.denied_index = static_cast<int>(i);
      return out;
    } else {
      out.decisions.push_back(d->value());
    }
    if (stop) {
      ++i;
      break;
    }
  }
  if (many == nullptr) {
    out.allowed = true;
    return out;
  }
  // The checks answered inline before the first deferral are in `out`: hand them over.
  for (std::size_t j = 0; j < out.decisions.size(); ++j) many->decided(j, out.decisions[j]);
  many->issued(i);
  return std::nullopt;
}

StatusOr<CheckManyResult> Engine::check_many(std::span<const CheckCall> calls) {
  Waiting<CheckManyResult> w;
  return w.wait(check_many(calls, w));
}

namespace {

// What one admit carries from its chained rate check to its answer. How shadow mode bears on
// it (shadow.h): the policy whose refusal becomes a would_deny admission (null: its policy is
// not in shadow), and what its chained rate policy would have answered when it passed the call
// only in shadow. And what a Release's cost is charged to: the chained rate policy the call
// passed, the key and the hits that check took.
struct AdmitContext {
  Policy* policy = nullptr;
  std::optional<AdmitDecision> rate_would_deny;
  // The admitting policy's shadow passed its rate policy's refusal: counted on it once the
  // call is answered (a call its limit refuses as well is one call it would have refused).
  bool rate_uncounted = false;
  std::shared_ptr<Policy> rate;  // null: no chained rate policy
  std::string rate_key;
  std::uint64_t rate_took = 0;
};

// What the transports answer for a kind's decision: the lease made for its permit (at `now`,
// held for `ttl`), or its refusal; in shadow, a refusal is a lease on a ShadowPermit.
AdmitResult admit_result(AdmitDecision d, LeaseTable& leases, Nanos now, Nanos ttl,
                         AdmitContext shadow = {}) {
  AdmitResult out;
  out.waited = d.waited;
  if ((!d.permit || shadow.rate_uncounted) && shadow.policy != nullptr)
    shadow.policy->count_shadow_denied();
  if (!d.permit && shadow.policy != nullptr) {
    d.permit.emplace(ShadowPermit{});
    out.would_deny = true;
  } else if (d.permit && shadow.rate_would_deny) {
    d.refusal = std::move(shadow.rate_would_deny->refusal);
    d.refusal_owner = std::move(shadow.rate_would_deny->refusal_owner);
    out.would_deny = true;
  }
  if (!d.permit || out.would_deny) {
    // A chained rate hit stays spent when the limit refuses: the call was attempted (as in the
    // gateway's order, where the rate limiter counts every request it lets through).
    out.refusal = std::move(d.refusal);
    out.refusal_owner = std::move(d.refusal_owner);
    if (!d.permit) return out;
  }
  const bool reusable = d.permit->renewable() && shadow.rate == nullptr && shadow.policy == nullptr;
  Lease lease{std::move(*d.permit),
              now,
              ttl,
              now + ttl,
              std::move(shadow.rate),
              std::move(shadow.rate_key),
              shadow.rate_took,
              reusable};
  out.lease_id = leases.insert(std::move(lease));  // if this throws, the permit goes back
  out.admitted = true;
  out.reusable = reusable;
  out.ttl = ttl;
  out.chosen = std::move(d.chosen);
  out.attributes = std::move(d.attributes);
  out.call_deadline = d.call_deadline;
  if (out.call_deadline) out.call_timeout = std::max(Nanos{0}, *out.call_deadline - now);
  return out;
}

// A kind's deferred admit, answered to the transport's Deferral as an AdmitResult: the lease is
// made when the permit comes, its TTL counted from then.
class AdmitLater final : public Deferral<AdmitDecision> {
 public:
  AdmitLater(Deferral<AdmitResult>& outer, LeaseTable& leases, const Clock& clock, Nanos ttl,
             AdmitContext& shadow)
      : outer_(outer), leases_(leases), clock_(clock), ttl_(ttl), shadow_(shadow) {}
  Completion<AdmitDecision> defer() override {
    return [done = outer_.defer(), leases = &leases_, clock = &clock_, ttl = ttl_,
            shadow = std::move(shadow_)](StatusOr<AdmitDecision> d) mutable {
      if (!d.ok()) return done(d.status());
      try {
        done(admit_result(std::move(d.value()), *leases, clock->now(), ttl, std::move(shadow)));
      } catch (const std::exception& e) {
        done(Status(StatusCode::kInternal, std::string("admit: ") + e.what()));
      }
    };
  }
  void on_cancel(Once<void()> hook) override { outer_.on_cancel(std::move(hook)); }

 private:
  Deferral<AdmitResult>& outer_;
  LeaseTable& leases_;
  const Clock& clock_;
  const Nanos ttl_;
  AdmitContext& shadow_;
};

}  // namespace

namespace {

// The rate policy `e` chains, passed between the phases of an admit: keyed by the call's key,
// or what the kind keys it by when it gives none. nullopt: go on; a refusal (its 429: no permit
// is taken); an error when there is no key.
StatusOr<std::optional<AdmitDecision>> pass_rate(const PolicySet& set, const PolicySet::Entry& e,
                                                 const AdmitCall& call,
                                                 const ResolvedAdmit& resolved, AdmitFamily& admit,
                                                 Nanos now, AdmitContext& shadow) {
  const std::string_view key = call.key.empty() ? resolved.rate_key() : call.key;
  if (key.empty())
    return invalid("key", "must not be empty: policy '" + e.base->name() +
                              "' chains rate policy '" + e.rate->name() + "', keyed by it");
  // The rate policy's own shadow answers through its ShadowRate; the admitting policy's shadow
  // covers the rate policy it chains as well.
  const PolicySet::Entry* re = set.entry(e.base->rate_name());
  RateFamily& rate = re != nullptr ? *re->rate_family() : *e.rate->rate_family();
  RateDecision d = rate.check(key, 1, now);
  if (!d.allowed && e.shadow) {
    allow_in_shadow(d);
    shadow.rate_uncounted = true;
  }
  if (d.allowed) {  // a Release's cost goes to the same key
    shadow.rate = e.rate;
    shadow.rate_key = std::string(key);
    shadow.rate_took = d.would_deny ? 0 : 1;
  }
  if (d.allowed && !d.would_deny) return std::optional<AdmitDecision>();
  AdmitDecision refused;
  refused.refusal = rate.refusal(key, d);
  refused.refusal_owner = e.rate;  // what the refusal's views point into
  if (d.would_deny) {
    shadow.rate_would_deny = std::move(refused);
    return std::optional<AdmitDecision>();
  }
  admit.refused_by_rate();
  return std::optional<AdmitDecision>(std::move(refused));
}

}  // namespace

Decided<AdmitResult> Engine::admit(const AdmitCall& call, Deferral<AdmitResult>& later) {
  if (Status s = usable(); !s.ok()) return s;
  const auto set = current();
  if (Status s = check_name("policy", call.policy); !s.ok()) return s;
  const PolicySet::Entry* entry = set->entry(call.policy);
  if (entry == nullptr)
    return Status(StatusCode::kNotFound,
                  "policy: no policy named '" + std::string(call.policy) + "'");
  Policy& p = *entry->base;
  AdmitFamily* admit = p.admit_family();
  if (admit == nullptr)
    return Status(StatusCode::kFailedPrecondition,
                  "policy: '" + std::string(call.policy) + "' is " + a_kind(p) + "; Admit takes " +
                      kinds_phrase(kinds_.kinds_of(&PolicyKindParser::admit_family)) +
                      " (use Check)");
  if (Status s = check_field("key", call.key, kMaxKeyBytes, false); !s.ok()) return s;
  if (Status s = check_attributes(call.attributes); !s.ok()) return s;
  if (call.max_wait && *call.max_wait < Nanos{0})
    return invalid("max_wait", "must not be negative");
  const Nanos ttl = call.ttl.value_or(set->settings.lease_ttl);
  if (Status s = check_ttl(ttl, set->settings.max_lease_ttl); !s.ok()) return s;

  const Nanos now = clock_.now();
  // Phase one: the kind checks what the call names and resolves it (an error costs nothing).
  StatusOr<std::unique_ptr<ResolvedAdmit>> resolved = admit->resolve(call, now);
  if (!resolved.ok()) return resolved.status();
  // Between the phases, the chained rate policy (the gateway document's order).
  AdmitContext shadow;
  if (entry->shadow) shadow.policy = &p;
  std::optional<AdmitDecision> refused;
  if (entry->rate != nullptr) {
    StatusOr<std::optional<AdmitDecision>> r =
        pass_rate(*set, *entry, call, *resolved.value(), *admit, now, shadow);
    if (!r.ok()) return r.status();
    refused = std::move(r.value());
  }
  if (refused) return admit_result(std::move(*refused), leases_, now, ttl);
  // Phase two: the permit. A deferred take keeps its policy alive through the Completion it
  // holds (the kind's contract: it answers, retired or not).
  AdmitLater deferred(later, leases_, clock_, ttl, shadow);
  Decided<AdmitDecision> d = resolved.value()->take(now, deferred);
  if (!d) return std::nullopt;
  if (!d->ok()) return d->status();
  return admit_result(std::move(d->value()), leases_, now, ttl, std::move(shadow));
}

StatusOr<AdmitResult> Engine::admit(const AdmitCall& call) {
  Waiting<AdmitResult> w;
  return w.wait(admit(call, w));
}

StatusOr<Nanos> Engine::release(std::string_view lease_id, CallResult result,
                                std::optional<Nanos> rtt) {
  StatusOr<Released> r = release(lease_id, result, rtt, std::nullopt);
  if (!r.ok()) return r.status();
  return r.value().held;
}

StatusOr<Released> Engine::release(std::string_view lease_id, CallResult result,
                                   std::optional<Nanos> rtt, std::optional<std::int64_t> cost,
                                   bool keep, std::span<const CallEnd> earlier) {
  if (Status s = check_lease_id(lease_id); !s.ok()) return s;
  if (rtt && *rtt < Nanos{0}) return invalid("rtt", "must not be negative");
  if (cost && (*cost < 0 || *cost > kMaxHits))
    return invalid("cost", "must be between 0 and " + std::to_string(kMaxHits) + ", not " +
                               std::to_string(*cost));
  if ((keep || !earlier.empty()) && cost)
    return invalid(keep ? "keep" : "earlier",
                   "not with a cost (a lease whose policy chains a rate policy is not kept: each "
                   "call passes the rate policy)");
  if (earlier.size() > kMaxEarlier)
    return invalid("earlier", "at most " + std::to_string(kMaxEarlier) + " calls, not " +
                                  std::to_string(earlier.size()));
  for (std::size_t i = 0; i < earlier.size(); ++i)
    if (earlier[i].rtt < Nanos{0})
      return invalid("earlier[" + std::to_string(i) + "].rtt", "must not be negative");
  const Nanos now = clock_.now();
  bool reusable = true;
  if (keep || !earlier.empty()) {
    const std::optional<Renewal> r = leases_.renew(lease_id, earlier, keep, result, rtt, now);
    if (!r) return no_such_lease();
    reusable = r->reusable;
    if (keep && reusable)  // draining: no more calls on it (the server is going away)
      return Released{.held = r->held,
                      .charged = std::nullopt,
                      .kept = r->kept && !draining_.load(std::memory_order_relaxed)};
    // Not reusable: released as without keep, and said so. Or no keep: released now.
  }
  std::optional<Lease> lease = leases_.take(lease_id, now);
  if (!lease) return no_such_lease();
  Released out;
  out.held = now - lease->admitted_at;
  lease->permit.finish(CallEnd{result, rtt.value_or(out.held), CallEnd::By::kClient});
  if (!reusable)
    return Status(StatusCode::kFailedPrecondition,
                  std::string(keep ? "keep" : "earlier") +
                      ": the lease is not reusable (only an adaptive policy's, chaining no rate "
                      "policy and not in shadow, is: AdmitResponse.reusable); it was released");
  if (!cost) return out;
  if (lease->rate == nullptr)
    return Status(StatusCode::kFailedPrecondition,
                  "cost: the lease's policy chains no rate policy (rate:) to charge it to; the "
                  "lease was released, nothing was charged");
  // The chained policy as it serves now (in shadow, through its ShadowRate); the one the admit
  // passed when a reload has replaced it since.
  const auto set = current();
  const PolicySet::Entry* e = set->entry(lease->rate->name());
  RateFamily& rate =
      e != nullptr && e->base == lease->rate ? *e->rate_family() : *lease->rate->rate_family();
  StatusOr<RateCharge> c = charge_or_give_back(
      rate, lease->rate_key, *cost - static_cast<std::int64_t>(lease->rate_took), now);
  if (!c.ok()) return Status(c.status().code(), c.status().message() + " (the lease was released)");
  out.charged = c.value();
  return out;
}

StatusOr<RateCharge> Engine::charge(const CheckCall& call) {
  const auto set = current();
  auto p = rate_policy(*set, kinds_, call.policy, "Charge takes ", " (use Release with a cost)");
  if (!p.ok()) return p.status();
  if (Status s = check_field("key", call.key, kMaxKeyBytes, true); !s.ok()) return s;
  if (call.hits == 0) return invalid("hits", "must not be 0 (> 0 charges, < 0 gives back)");
  if (call.hits < -kMaxHits || call.hits > kMaxHits)
    return invalid("hits", "must be between -" + std::to_string(kMaxHits) + " and " +
                               std::to_string(kMaxHits) + ", not " + std::to_string(call.hits));
  StatusOr<RateCharge> c = charge_or_give_back(*p.value(), call.key, call.hits, clock_.now());
  if (!c.ok() && c.status().code() == StatusCode::kFailedPrecondition)
    return Status(c.status().code(), "policy: '" + std::string(call.policy) + "' is " +
                                         a_kind(*set->entry(call.policy)->base) + ": " +
                                         c.status().message());
  return c;
}

StatusOr<Nanos> Engine::heartbeat(std::string_view lease_id, std::optional<Nanos> ttl) {
  if (Status s = check_lease_id(lease_id); !s.ok()) return s;
  if (ttl)
    if (Status s = check_ttl(*ttl, current()->settings.max_lease_ttl); !s.ok()) return s;
  const Nanos now = clock_.now();
  const std::optional<Nanos> applied = leases_.extend(lease_id, ttl, now);
  if (!applied) return no_such_lease();
  return *applied;
}

std::size_t Engine::expire_leases() { return leases_.expire(clock_.now()); }

ServerSettings Engine::settings() const { return current()->settings; }

RateLimitHeaders Engine::rate_limit_headers() const {
  return rate_limit_headers_named(current()->settings.rate_limit_headers)
      .value_or(RateLimitHeaders::kIetf);
}
std::uint64_t Engine::generation() const { return current()->generation; }

std::shared_ptr<const KindPolicies> Engine::policies_of(std::string_view kind) const {
  static const KindPolicies kNone;
  std::shared_ptr<const PolicySet> set = current();
  const auto it = set->by_kind.find(kind);
  const KindPolicies* ps = it == set->by_kind.end() ? &kNone : &it->second;
  return {std::move(set), ps};  // shares the set's ownership
}

std::vector<PolicyInfo> Engine::policies() const {
  const auto set = current();
  std::vector<PolicyInfo> out;
  for (const auto& [name, p] : set->policies) out.push_back(p.base->info());
  return out;
}

std::string Engine::policies_json() const {
  const auto set = current();
  json j = json::object();
  j["generation"] = set->generation;
  j["node_id"] = set->settings.node_id;
  j["leases"] = leases_.size();
  j["draining"] = draining();
  json ps = json::array();
  for (const auto& [name, p] : set->policies) ps.push_back(p.base->state());
  j["policies"] = std::move(ps);
  return json_text(j);
}

std::vector<std::string> Engine::warnings() const { return current()->warnings; }

Readiness Engine::readiness() const {
  Readiness r;
  if (draining()) r.problems.push_back("the server is shutting down");
  const auto set = current();
  for (const auto& [name, p] : set->policies) {
    const PolicyReadiness pr = p.base->readiness();
    if (!pr.serving)
      r.problems.push_back("policy " + name + ": " + pr.why);
    else if (!pr.why.empty())
      r.degraded.push_back("policy " + name + ": " + pr.why);
  }
  for (std::string& p : liveness()) r.problems.push_back(std::move(p));
  r.ready = r.problems.empty();
  return r;
}

std::vector<std::string> Engine::liveness() const {
  std::vector<std::string> problems;
  const std::lock_guard lock(parts_mu_);
  for (const auto& [name, part] : parts_)
    if (std::string p = part->problem(); !p.empty()) problems.push_back(name + ": " + p);
  return problems;
}

void Engine::attach(std::string name, const ServerPart* part) {
  const std::lock_guard lock(parts_mu_);
  parts_.emplace_back(std::move(name), part);
}

void Engine::detach(const ServerPart* part) {
  const std::lock_guard lock(parts_mu_);
  std::erase_if(parts_, [part](const auto& p) { return p.second == part; });
}

StatusOr<ReloadSummary> Engine::reload(const SluiceConfig& config) {
  const std::lock_guard lock(reload_mu_);
  const auto old = current();
  // The node id stays: fleets know this server by it.
  // Retired policies no lease holds any more are gone: nothing follows them.
  std::erase_if(retired_, [](const auto& e) { return e.second.expired(); });
  auto next = build_policy_set(config, clock_, kinds_, old.get(), &retired_, old->settings.node_id,
                               old->generation + 1, state_, directory_, notices_);
  if (!next.ok()) {
    reload_failures_.fetch_add(1, std::memory_order_relaxed);
    return next.status();
  }
  std::shared_ptr<PolicySet> set = std::move(next.value());
  ReloadSummary summary;
  summary.generation = set->generation;
  summary.warnings = set->warnings;
  for (auto& [name, change] : set->reconfigurations) {
    change();  // in place: the policy serves its new spec from here on
    summary.reconfigured.push_back(name);
  }
  set->reconfigurations.clear();
  for (const auto& [name, p] : set->policies) {
    auto it = old->policies.find(name);
    if (it == old->policies.end())
      summary.added.push_back(name);
    else if (it->second.base != p.base)
      summary.changed.push_back(name);
    else if (it->second.identity == p.identity)
      summary.kept.push_back(name);
  }
  std::vector<Policy*> replaced;
  for (const auto& [name, p] : old->policies) {
    auto it = set->policies.find(name);
    if (it == set->policies.end()) summary.removed.push_back(name);
    if (it == set->policies.end() || it->second.base != p.base) {
      replaced.push_back(p.base.get());
      // Kept in mind while its leases keep it alive: a later reload that adds the name back
      // builds the new policy on its counts (BuildContext::predecessor).
      if (it == set->policies.end()) retired_[name] = p.base;
    }
  }
  for (const auto& [name, p] : set->policies) retired_.erase(name);
  // Serve the new set first, then retire what it replaced (a fleet policy's retire waits for
  // its runner and leaves its fleet): calls never see a gap where the policy refuses.
  publish(*directory_, *set);
  std::shared_ptr<const PolicySet> previous = std::move(set);
  {
    const std::lock_guard lock(set_mu_);
    set_.swap(previous);
  }  // `previous` (the old set, still held by `old`) is released outside the lock
  for (Policy* p : replaced) p->retire();
  reloads_.fetch_add(1, std::memory_order_relaxed);
  return summary;
}

void Engine::drain() noexcept {
  draining_.store(true, std::memory_order_relaxed);
  const auto set = current();
  for (const auto& [name, p] : set->policies) p.base->on_drain();
}

void Engine::close() {
  draining_.store(true, std::memory_order_relaxed);
  leases_.clear();
  const auto set = current();
  for (const auto& [name, p] : set->policies) p.base->retire();
}

}  // namespace sluice::server
