// The config loader (load_config with the built-in policy kinds) on arbitrary text.
//
// Invariants beyond "no crash, no exception": a config is returned iff there are no errors;
// every error and warning has a message and a non-negative line and column; a config that
// loads round-trips: the document rebuilt from its coordinators' and policies' fingerprints
// (their sections as parsed) loads without errors into the same policies, kinds, rate chains
// and fingerprints; and when it uses only kinds that build without a coordinator round trip
// (rate, adaptive, concurrency; memory coordinators only), an Engine builds from it (what
// validation passes, the engine accepts).
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.h"

namespace {

using sluice::ConfigError;
using sluice::ConfigLoad;
using sluice::SluiceConfig;
using sluice::fuzz::require;

void check_messages(const std::vector<ConfigError>& v, const char* what) {
  for (const ConfigError& e : v) {
    require(!e.message.empty(), std::string(what) + " without a message at " + e.path);
    require(e.line >= 0 && e.column >= 0, std::string(what) + " with a negative position");
    require(!e.to_string("fuzz").empty(), std::string(what) + " renders empty");
  }
}

// The config as a document again, from what the loader kept of each section.
std::string rebuilt(const SluiceConfig& c) {
  YAML::Node root;
  for (const auto& [name, spec] : c.coordinators)
    if (!spec.fingerprint.empty()) root["coordinators"][name] = YAML::Load(spec.fingerprint);
  for (const auto& [name, spec] : c.policies) root["policies"][name] = YAML::Load(spec.fingerprint);
  return YAML::Dump(root);
}

void round_trip(const SluiceConfig& c) {
  const std::string text = rebuilt(c);
  const ConfigLoad again = sluice::load_config(text, sluice::server::PolicyRegistry::builtin());
  require(again.config.has_value(),
          "a loaded config's sections must load again; first error: " +
              (again.errors.empty() ? std::string("none") : again.errors[0].to_string("rebuilt")) +
              "\n--- rebuilt:\n" + text);
  const SluiceConfig& d = *again.config;
  require(d.policies.size() == c.policies.size(), "the round trip changed the policy count");
  for (const auto& [name, spec] : c.policies) {
    auto it = d.policies.find(name);
    require(it != d.policies.end(), "the round trip lost policy " + name);
    require(it->second.kind == spec.kind, "the round trip changed policy " + name + "'s kind");
    require(it->second.rate == spec.rate, "the round trip changed policy " + name + "'s rate");
    require(it->second.coordinators == spec.coordinators,
            "the round trip changed policy " + name + "'s coordinators");
    require(it->second.fingerprint == spec.fingerprint,
            "the round trip changed policy " + name + "'s fingerprint");
  }
}

void build(const SluiceConfig& loaded) {
  for (const auto& [name, spec] : loaded.policies)
    if (spec.kind != "rate" && spec.kind != "adaptive" && spec.kind != "concurrency") return;
  for (const auto& [name, spec] : loaded.coordinators)
    if (spec.kind != "memory") return;  // no network
  SluiceConfig c = loaded;
  c.server.state_file.clear();  // never a file the input names
  sluice::ManualClock clock{std::chrono::seconds(1)};
  auto e = sluice::server::Engine::create(c, clock);
  require(e.ok(), "a config that loads without errors must build an engine: " +
                      (e.ok() ? std::string() : e.status().to_string()));
  e.value()->close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const ConfigLoad l = sluice::load_config(text, sluice::server::PolicyRegistry::builtin());
  require(l.config.has_value() == l.errors.empty(), "a config is returned iff there are no errors");
  check_messages(l.errors, "an error");
  check_messages(l.warnings, "a warning");
  if (!l.config) return 0;
  require(!l.config->policies.empty(), "a loaded config has a policy");
  require(l.config->coordinators.count("memory") == 1, "the memory coordinator always exists");
  round_trip(*l.config);
  build(*l.config);
  return 0;
}
