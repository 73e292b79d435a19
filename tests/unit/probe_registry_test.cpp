// The probe registry (backends/probes/registry.h): the built-in probes by name with their
// settings, a probe added by a test read through the same path, and the readers the network
// probes share.
#include "backends/probes/registry.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>
#include <vector>

namespace sluice::probes {
namespace {

// Settings from a map; errors recorded as "key: message".
class MapSettings final : public ProbeSettings {
 public:
  std::map<std::string, std::string> scalars;
  std::map<std::string, std::vector<std::string>> lists;
  std::vector<std::string> errors;

  bool has(std::string_view key) const override {
    return scalars.contains(std::string(key)) || lists.contains(std::string(key));
  }
  std::optional<std::string> str(std::string_view key, bool required) override {
    const auto it = scalars.find(std::string(key));
    if (it != scalars.end()) return it->second;
    if (required) error(key, "is required");
    return std::nullopt;
  }
  std::optional<std::vector<std::string>> strings(std::string_view key) override {
    const auto it = lists.find(std::string(key));
    if (it == lists.end()) return std::nullopt;
    return it->second;
  }
  std::optional<bool> boolean(std::string_view key) override {
    const auto v = str(key, false);
    if (!v) return std::nullopt;
    return *v == "true";
  }
  void error(std::string_view key, const std::string& message) override {
    errors.push_back(std::string(key) + ": " + message);
  }
};

TEST(ProbeRegistry, TheBuiltInProbesAreListedOnceInOrderWithTheirSettings) {
  const ProbeRegistry& r = builtin_probes();
  const std::vector<std::string_view> names = {"loadavg",         "command",
                                               "policy",          "mysql_lag",
                                               "mysql_heartbeat", "mysql_threads_running",
                                               "postgres_lag",    "postgres_active",
                                               "redis",           "http"};
  EXPECT_EQ(r.names(), names);
  const std::vector<std::string_view> settings = {
      "command",      "timeout",         "policy",        "hosts",    "user",  "password",
      "password_env", "heartbeat_table", "heartbeat_utc", "conninfo", "field", "username",
      "url"};
  EXPECT_EQ(r.settings(), settings);
  ASSERT_NE(r.find("mysql_heartbeat"), nullptr);
  EXPECT_TRUE(r.find("mysql_heartbeat")->takes("heartbeat_table"));
  EXPECT_FALSE(r.find("mysql_lag")->takes("heartbeat_table"));
  EXPECT_FALSE(r.find("loadavg")->takes("timeout"));
  EXPECT_TRUE(r.find("http")->takes("timeout"));
  EXPECT_EQ(r.find("nope"), nullptr);
}

TEST(ProbeRegistry, AProbeAddedByATestIsReadAndMadeThroughTheSamePath) {
  ProbeRegistry r;
  r.add({"first", {}, nullptr});
  r.add({"constant", {"value"}, [](ProbeSettings& s, const ProbeContext& c) -> MakeProbe {
           const std::string v = s.str("value", true).value_or("0");
           if (v.empty()) s.error("value", "must not be empty");
           return [v, policy = c.policy](const ProbeEnv&) -> std::unique_ptr<Probe> {
             struct Constant final : Probe {
               double v;
               std::string host;
               void sample(std::vector<ThrottleSample>& hosts) override {
                 hosts.resize(1);
                 hosts[0].host = host;
                 hosts[0].value = v;
               }
             };
             auto p = std::make_unique<Constant>();
             p->v = std::stod(v);
             p->host = policy;
             return p;
           };
         }});
  r.add({"first", {"x"}, nullptr});  // replaced, in its place
  EXPECT_EQ(r.names(), (std::vector<std::string_view>{"first", "constant"}));
  EXPECT_EQ(r.settings(), (std::vector<std::string_view>{"x", "value"}));

  MapSettings s;
  s.scalars["value"] = "2.5";
  const MakeProbe make = r.find("constant")->read(s, ProbeContext{"db", std::chrono::seconds(1)});
  EXPECT_TRUE(s.errors.empty());
  ASSERT_TRUE(make);
  std::vector<ThrottleSample> hosts;
  make(ProbeEnv{})->sample(hosts);
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_EQ(hosts[0].host, "db");
  EXPECT_DOUBLE_EQ(hosts[0].value, 2.5);

  MapSettings missing;
  (void)r.find("constant")->read(missing, ProbeContext{"db", std::chrono::seconds(1)});
  EXPECT_EQ(missing.errors, std::vector<std::string>{"value: is required"});
}

TEST(ProbeRegistry, ThePolicyProbeReadsTheServerAndMayNotReadItsOwnThrottler) {
  const ProbeType& policy = *builtin_probes().find("policy");
  MapSettings own;
  own.scalars["policy"] = "db";
  (void)policy.read(own, ProbeContext{"db", std::chrono::seconds(1)});
  EXPECT_EQ(own.errors, std::vector<std::string>{"policy: must name another policy"});

  MapSettings other;
  other.scalars["policy"] = "pool";
  const MakeProbe make = policy.read(other, ProbeContext{"db", std::chrono::seconds(1)});
  ASSERT_TRUE(make);
  std::vector<ThrottleSample> hosts;
  make(ProbeEnv{})->sample(hosts);  // a server with no policies to read
  ASSERT_EQ(hosts.size(), 1u);
  EXPECT_EQ(hosts[0].host, "pool");
  EXPECT_EQ(hosts[0].error, "no policy named 'pool' is serving");
  ProbeEnv env;
  env.policy_utilisation = [](const std::string& name,
                              std::string& error) -> std::optional<double> {
    if (name == "pool") return 0.75;
    error = "unknown";
    return std::nullopt;
  };
  make(env)->sample(hosts);
  EXPECT_DOUBLE_EQ(hosts[0].value, 0.75);
  EXPECT_EQ(hosts[0].error, "");
}

TEST(ProbeRegistry, HostsAndPasswordsAreReadAsEveryNetworkProbeReadsThem) {
  MapSettings none;
  EXPECT_TRUE(read_hosts(none, 3306).empty());
  EXPECT_EQ(none.errors,
            std::vector<std::string>{"hosts: is required: the hosts to sample, host[:port] each"});
  MapSettings empty;
  empty.lists["hosts"] = {};
  (void)read_hosts(empty, 3306);
  EXPECT_EQ(empty.errors, std::vector<std::string>{"hosts: must name at least one host"});
  MapSettings two;
  two.lists["hosts"] = {"db1", "[::1]:3307"};
  const std::vector<Endpoint> got = read_hosts(two, 3306);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].port, 3306);
  EXPECT_EQ(got[1].port, 3307);
  EXPECT_TRUE(two.errors.empty());

  MapSettings both;
  both.scalars["password"] = "a";
  both.scalars["password_env"] = "SLUICE_PROBE_REGISTRY_TEST_UNSET";
  EXPECT_EQ(read_password(both), "");
  EXPECT_EQ(both.errors,
            (std::vector<std::string>{
                "password_env: give password or password_env, not both",
                "password_env: names SLUICE_PROBE_REGISTRY_TEST_UNSET, which is not set"}));
  ::setenv("SLUICE_PROBE_REGISTRY_TEST_SET", "s3cret", 1);
  MapSettings env;
  env.scalars["password_env"] = "SLUICE_PROBE_REGISTRY_TEST_SET";
  EXPECT_EQ(read_password(env), "s3cret");
  EXPECT_TRUE(env.errors.empty());
}

}  // namespace
}  // namespace sluice::probes
