// The policy probe: one of the server's own policies' utilisation (in flight / limit), read
// through the server it runs in (ProbeEnv), its host the policy's name.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/probes/probe.h"
#include "backends/probes/registry.h"

namespace sluice::probes {
namespace {

class PolicyProbe final : public Probe {
 public:
  using Utilisation = decltype(ProbeEnv::policy_utilisation);
  PolicyProbe(Utilisation utilisation, std::string policy)
      : utilisation_(std::move(utilisation)), policy_(std::move(policy)) {}

  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = policy_;
    if (!utilisation_) {
      s.error = "no policy named '" + policy_ + "' is serving";
      return;
    }
    std::string error;
    const std::optional<double> v = utilisation_(policy_, error);
    if (!v) {
      s.error = std::move(error);
      return;
    }
    s.value = *v;
    s.error.clear();
  }

 private:
  const Utilisation utilisation_;
  const std::string policy_;
};

}  // namespace

void add_policy_probe(ProbeRegistry& r) {
  r.add({"policy", {"policy"}, [](ProbeSettings& s, const ProbeContext& c) -> MakeProbe {
           std::string target = s.str("policy", true).value_or("");
           if (s.has("policy") && (target.empty() || target == c.policy))
             s.error("policy", target.empty() ? "must name a policy" : "must name another policy");
           return [target](const ProbeEnv& env) {
             return std::make_unique<PolicyProbe>(env.policy_utilisation, target);
           };
         }});
}

}  // namespace sluice::probes
