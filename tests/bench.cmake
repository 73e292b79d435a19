# The benchmarks' smoke tests (label bench), included from tests/CMakeLists.txt when the
# benchmarks are built (bench/CMakeLists.txt): each runs briefly, so a broken benchmark fails the
# suite; the figures themselves are never asserted in ctest (bench/README.md has them).
file(GLOB bench_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/bench/*.cpp)
foreach(src ${bench_sources})
  get_filename_component(name ${src} NAME_WE)
  add_test(NAME bench_smoke.${name} COMMAND bench_${name} --benchmark_min_time=0.001)
  set_tests_properties(bench_smoke.${name} PROPERTIES LABELS bench TIMEOUT 300)
endforeach()

# Shared rate limits on a redis-server of its own, briefly, under and over the limit: every
# check must be decided (no coordinator error); the figures are not asserted here.
add_test(NAME bench_smoke.shared_rate_load
  COMMAND sluice_shared_rate_load --seconds 0.2 --in-flight 4 --keys 16)
add_test(NAME bench_smoke.shared_rate_load_over
  COMMAND sluice_shared_rate_load --seconds 0.2 --in-flight 4 --keys 16 --mode over)
set_tests_properties(bench_smoke.shared_rate_load bench_smoke.shared_rate_load_over
  PROPERTIES LABELS bench TIMEOUT 120)

# Fleet heartbeats on an etcd of its own, both sides briefly: every heartbeat must succeed.
add_test(NAME bench_smoke.etcd_fleet_load
  COMMAND sluice_etcd_fleet_load --seconds 0.3 --nodes 3 --keys 1)
set_tests_properties(bench_smoke.etcd_fleet_load PROPERTIES LABELS bench TIMEOUT 120)
add_test(NAME bench_smoke.etcd_federation_load
  COMMAND sluice_etcd_fleet_load --federation --seconds 0.3 --nodes 3 --keys 1)
set_tests_properties(bench_smoke.etcd_federation_load PROPERTIES LABELS bench TIMEOUT 120)

# The server's load generators (bench/load), when the transport is built.
if(TARGET sluice_transport)
  # Runs it briefly: every call must succeed; the figures are not asserted here. With --redis:
  # a redis-server of its own, sluice's shared limits and the per-request Redis limiter too.
  add_test(NAME bench_smoke.grpc_load
    COMMAND sluice_load --seconds 0.2 --levels 1,8 --repeat 1 --redis)
  set_tests_properties(bench_smoke.grpc_load PROPERTIES LABELS bench TIMEOUT 300)
  # The gRPC call-site adapters against the bare handler, briefly: every call must succeed and
  # every admission be released (its exit code).
  add_test(NAME bench_smoke.grpc_adapter_load
    COMMAND sluice_grpc_adapter_load --calls 50 --rounds 1)
  set_tests_properties(bench_smoke.grpc_adapter_load PROPERTIES LABELS bench TIMEOUT 120)
  # The HTTP API's handlers without sockets, briefly: every request must answer 200.
  add_test(NAME bench_smoke.http_api COMMAND bench_http_api --benchmark_min_time=0.001)
  set_tests_properties(bench_smoke.http_api PROPERTIES LABELS bench TIMEOUT 120)
  # A malformed option is refused by name (it used to read as 0, "use the default").
  add_test(NAME bench_smoke.grpc_load_bad_option COMMAND sluice_load --rate 5x)
  set_tests_properties(bench_smoke.grpc_load_bad_option PROPERTIES LABELS bench TIMEOUT 30
    PASS_REGULAR_EXPRESSION "--rate: '5x' is not a number")
  find_program(SLUICE_WRK wrk)
  if(SLUICE_WRK AND TARGET sluice_cli)
    add_test(NAME bench_smoke.wrk
      COMMAND bash ${PROJECT_SOURCE_DIR}/bench/load/wrk.sh $<TARGET_FILE:sluice_cli> 1
              $<TARGET_FILE:sluice_http_load>)
    set_tests_properties(bench_smoke.wrk PROPERTIES LABELS bench TIMEOUT 120)
  endif()
endif()
