#include "server/policies/admit_policy.h"

namespace sluice::server {

using prometheus::MetricFamily;
using prometheus::MetricType;

void AdmitPolicy::describe_admissions(nlohmann::json& j) const {
  j["admitted"] = admitted_.load(std::memory_order_relaxed);
  j["refused_by_limit"] = limit_refused_.load(std::memory_order_relaxed);
  j["refused_by_rate"] = gate_refused_.load(std::memory_order_relaxed);
  j["released"] = released_.load(std::memory_order_relaxed);
  j["renewed"] = renewed_.load(std::memory_order_relaxed);
  j["leases"] = leases_->load(std::memory_order_relaxed);
}

void AdmitPolicy::admission_metrics(std::vector<MetricFamily>& out) const {
  out.push_back(by_label("sluice_admissions_total", "Admit calls by decision", "decision",
                         {{"admitted", admitted_.load()},
                          {"refused_by_rate", gate_refused_.load()},
                          {"refused_by_limit", limit_refused_.load()}}));
  out.push_back(one("sluice_releases_total", "Leases released by their client", MetricType::Counter,
                    static_cast<double>(released_.load())));
  out.push_back(one("sluice_lease_renewals_total",
                    "Calls carried by a lease its client kept (Release with keep)",
                    MetricType::Counter, static_cast<double>(renewed_.load())));
  out.push_back(one("sluice_policy_leases", "Leases held on the policy", MetricType::Gauge,
                    static_cast<double>(leases_->load())));
}

void describe_guard(const AdaptiveGuardStats& s, nlohmann::json& j, PolicyInfo& info) {
  info.in_flight = s.in_flight;
  info.limit = s.limit;
  j["in_flight"] = s.in_flight;
  j["limit"] = s.limit;
  j["algorithm_limit"] = s.algorithm_limit;
  j["accepted"] = s.accepted;
  j["rejected"] = s.rejected;
  j["dropped"] = s.dropped;
  j["ignored"] = s.ignored;
}

void guard_metrics(const AdaptiveGuardStats& s, std::vector<MetricFamily>& out) {
  out.push_back(
      one("sluice_policy_in_flight", "Calls holding a permit", MetricType::Gauge, s.in_flight));
  out.push_back(
      one("sluice_policy_limit", "Concurrency ceiling in force", MetricType::Gauge, s.limit));
  out.push_back(one("sluice_policy_algorithm_limit", "The limit algorithm's own limit (L_local)",
                    MetricType::Gauge, s.algorithm_limit));
}

Rejection guard_refusal(const std::string& policy, const AdaptiveGuardStats& s,
                        const std::string& more) {
  Rejection r;
  r.source = "concurrency";
  r.limit_type = "limit";
  r.status = 503;
  r.type = "urn:sluice:problem:concurrency-limit-exceeded";
  r.title = "Concurrency Limit Exceeded";
  r.policy = policy;
  r.current_in_flight = s.in_flight;
  r.max_concurrent = s.limit;
  r.retry_after = std::chrono::seconds(1);
  r.detail_text = "Policy " + policy + " has reached its concurrency limit (" +
                  std::to_string(s.in_flight) + "/" + std::to_string(s.limit) + ")" + more;
  return r;
}

}  // namespace sluice::server
