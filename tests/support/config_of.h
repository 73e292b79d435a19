// config_of.h: a config from YAML for tests that build an Engine, failing the test (and naming
// every error) when it does not load.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "server/registry.h"
#include "sluice/config.h"

namespace sluice::server {

inline SluiceConfig config_of(const std::string& yaml) {
  ConfigLoad l = load_config(yaml, PolicyRegistry::builtin());
  std::string why;
  for (const auto& e : l.errors) why += e.to_string("test") + "\n";
  EXPECT_TRUE(l.config.has_value()) << why;
  return l.config.value_or(SluiceConfig{});
}

}  // namespace sluice::server
