// config_of.h: a config from YAML for tests that build an Engine, failing the test (and naming
// every error) when it does not load; and a load's result for tests of the loader's checks.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "server/registry.h"
#include "sluice/config/config.h"

namespace sluice::server {

// Loads `yaml` with sluice's own policy kinds.
inline ConfigLoad load_yaml(std::string_view yaml) {
  return load_config(yaml, PolicyRegistry::builtin());
}

// Every error of a load, one a line, as "t.yaml:<line>:<column>: <path>: <message>".
inline std::string errors_of(const ConfigLoad& load) {
  std::string all;
  for (const ConfigError& e : load.errors) all += e.to_string("t.yaml") + "\n";
  return all;
}

inline SluiceConfig config_of(const std::string& yaml) {
  ConfigLoad l = load_config(yaml, PolicyRegistry::builtin());
  std::string why;
  for (const auto& e : l.errors) why += e.to_string("test") + "\n";
  EXPECT_TRUE(l.config.has_value()) << why;
  return l.config.value_or(SluiceConfig{});
}

}  // namespace sluice::server
