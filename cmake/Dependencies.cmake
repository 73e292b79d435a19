# Every third-party package sluice uses, from Debian 12 (see scripts/deps.sh for the apt names).
find_package(Threads REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)                      # nlohmann_json::nlohmann_json
find_package(prometheus-cpp CONFIG REQUIRED COMPONENTS core)    # prometheus-cpp::core
find_package(PkgConfig REQUIRED)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)      # PkgConfig::HIREDIS (Redis)
find_package(PostgreSQL REQUIRED)                                # PostgreSQL::PostgreSQL (libpq)
find_package(yaml-cpp CONFIG REQUIRED)                           # yaml-cpp (the config file)

if(SLUICE_BUILD_APPS)
  find_package(CLI11 CONFIG REQUIRED)                            # CLI11::CLI11
  find_package(fmt CONFIG REQUIRED)                              # fmt::fmt
endif()
if(SLUICE_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)                            # GTest::gtest_main GTest::gmock
  find_package(rapidcheck CONFIG REQUIRED)                       # rapidcheck_gtest
  include(GoogleTest)
endif()
if(SLUICE_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)                        # benchmark::benchmark
endif()
