# The suites written in Python (included from tests/CMakeLists.txt when the executable is built),
# each run with Debian's /usr/bin/python3 (python3-grpcio, python3-protobuf, python3-pytest)
# against the sluice binary built here, in the Python client's build directory (where its
# generated stubs are, clients/python/CMakeLists.txt):
#   python.<name>        the client's suite, one test per clients/python/tests/test_<name>.py, so
#                        that ctest schedules them beside the others (label python)
#   throttler.databases  the throttler against real replicas (label integration)
#   examples.*           the examples, run small (label integration)
#   faults.*             the fault suites (labels integration and faults)
set(python_bin ${PROJECT_BINARY_DIR}/clients/python)
set(python_gen ${python_bin}/gen)
set(SLUICE_PYTHON /usr/bin/python3 CACHE FILEPATH
    "The Python that runs the client's tests (needs grpcio, protobuf and pytest)")
file(GLOB SLUICE_PYTHON_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/clients/python/tests/test_*.py)
foreach(test_file ${SLUICE_PYTHON_TESTS})
  get_filename_component(test_name ${test_file} NAME_WE)
  string(REGEX REPLACE "^test_" "python." test_name ${test_name})
  add_test(NAME ${test_name}
           COMMAND ${SLUICE_PYTHON} -m pytest -q ${test_file}
           WORKING_DIRECTORY ${python_bin})
  set_tests_properties(${test_name} PROPERTIES
    ENVIRONMENT "PYTHONPATH=${python_gen}:${PROJECT_SOURCE_DIR}/clients/python;SLUICE_BIN=$<TARGET_FILE:sluice_cli>;PYTHONDONTWRITEBYTECODE=1"
    LABELS python TIMEOUT 600)
endforeach()

# `sluice top` in a pseudo-terminal, its screen read by a terminal emulator (python3-pyte),
# against a real server on the default config (tests/cli/test_top.py). About 5 s.
add_test(NAME cli.top
         COMMAND ${SLUICE_PYTHON} -m pytest -q -p no:cacheprovider
                 ${PROJECT_SOURCE_DIR}/tests/cli/test_top.py
         WORKING_DIRECTORY ${python_bin})
set_tests_properties(cli.top PROPERTIES
  ENVIRONMENT "SLUICE_BIN=$<TARGET_FILE:sluice_cli>;PYTHONDONTWRITEBYTECODE=1"
  LABELS integration TIMEOUT 120)

# The Grafana dashboard and the Prometheus rules (deploy/): every query's metrics and labels
# exported by a real server with a policy of every kind, the rules through promtool (check and
# unit tests; Debian's prometheus package). About 5 s.
add_test(NAME dashboards
         COMMAND ${SLUICE_PYTHON} -m pytest -q -rxs -p no:cacheprovider
                 ${PROJECT_SOURCE_DIR}/tests/dashboards
         WORKING_DIRECTORY ${python_bin})
set_tests_properties(dashboards PROPERTIES
  ENVIRONMENT "SLUICE_BIN=$<TARGET_FILE:sluice_cli>;SLUICE_REQUIRE_PROMTOOL=1;PYTHONDONTWRITEBYTECODE=1"
  LABELS integration TIMEOUT 120)

# The throttler against real replicas (tests/throttler_db): a MariaDB primary and replica, a
# PostgreSQL primary and streaming replica and a Redis pair, started and stopped by the suite;
# lag made to appear and go, replicas killed, a MariaDB SIGSTOPped; then three servers sharing
# their throttler's rules through a Redis, a PostgreSQL and an etcd (test_shared_rules.py). About
# 55 s.
add_test(NAME throttler.databases
         COMMAND ${SLUICE_PYTHON} -m pytest -q -rxs ${PROJECT_SOURCE_DIR}/tests/throttler_db
         WORKING_DIRECTORY ${python_bin})
set_tests_properties(throttler.databases PROPERTIES
  ENVIRONMENT "PYTHONPATH=${python_gen}:${PROJECT_SOURCE_DIR}/clients/python;SLUICE_BIN=$<TARGET_FILE:sluice_cli>;PYTHONDONTWRITEBYTECODE=1"
  LABELS integration TIMEOUT 300)

# The throttled purge demo (examples/throttled_purge), small: the run with the throttler must
# keep the replica's lag lower than the run without it. About 30 s.
add_test(NAME examples.throttled_purge
         COMMAND ${SLUICE_PYTHON} ${PROJECT_SOURCE_DIR}/examples/throttled_purge/run_demo.py
                 --quick --sluice $<TARGET_FILE:sluice_cli>
         WORKING_DIRECTORY ${python_bin})
set_tests_properties(examples.throttled_purge PROPERTIES
  ENVIRONMENT "PYTHONPATH=${python_gen}:${PROJECT_SOURCE_DIR}/clients/python;PYTHONDONTWRITEBYTECODE=1"
  LABELS "integration;timing" TIMEOUT 300)

# The fleet's fault suite (tests/faults): real Redis and PostgreSQL, three `sluice serve`
# nodes, coordinator and node faults under load (and a Redis Sentinel failover); the figures land in faults-results.md
# (and .json) here. It measures timing (label timing, scheduled as the end of tests/CMakeLists.txt
# says): about 2 minutes and a quarter.
add_test(NAME faults.fleet
         COMMAND ${SLUICE_PYTHON} -m pytest -q -rxs -k "not etcd"
                 ${PROJECT_SOURCE_DIR}/tests/faults/test_fleet_faults.py
         WORKING_DIRECTORY ${python_bin})
set_tests_properties(faults.fleet PROPERTIES
  ENVIRONMENT "PYTHONPATH=${python_gen}:${PROJECT_SOURCE_DIR}/clients/python;SLUICE_BIN=$<TARGET_FILE:sluice_cli>;PYTHONDONTWRITEBYTECODE=1;SLUICE_FAULTS_RESULTS=${python_bin}/faults-results.md"
  LABELS "integration;faults;timing" TIMEOUT 300)
# The same fleet on a 3-member etcd cluster of each scenario's own: its leader killed, a
# follower killed, its leader cut off from its peers (network namespace), its quorum lost in
# both outage modes; figures in faults-etcd-results.md (and .json). About a minute and a half.
add_test(NAME faults.fleet_etcd
         COMMAND ${SLUICE_PYTHON} -m pytest -q -rxs -k etcd
                 ${PROJECT_SOURCE_DIR}/tests/faults/test_fleet_faults.py
         WORKING_DIRECTORY ${python_bin})
set_tests_properties(faults.fleet_etcd PROPERTIES
  ENVIRONMENT "PYTHONPATH=${python_gen}:${PROJECT_SOURCE_DIR}/clients/python;SLUICE_BIN=$<TARGET_FILE:sluice_cli>;PYTHONDONTWRITEBYTECODE=1;SLUICE_FAULTS_RESULTS=${python_bin}/faults-etcd-results.md"
  LABELS "integration;faults;timing" TIMEOUT 300)

# Federation's fault suite (same directory): three `sluice serve` regions splitting one rate
# budget through a real Redis, then a real PostgreSQL, steady and through a coordinator
# SIGSTOP and SIGKILL + restart, admissions counted per coordinator window; partial losses
# (Redis restarted from an RDB snapshot or a truncated AOF, a ledger evicted, a failover to a
# Redis replica or a PostgreSQL standby that missed the last writes, a failover that Redis
# Sentinel makes after a SIGKILL of the primary); then a region of three
# processes sharing a regional pool on a second Redis (steady, the pool's Redis killed, the
# coordinator stopped in both outage modes); last, the regions on a 3-member etcd cluster
# whose leader is cut off from its peers (network namespace; skipped without root); figures in
# federation-results.md (and .json). It measures timing (label timing): about 210 s.
add_test(NAME faults.federation
         COMMAND ${SLUICE_PYTHON} -m pytest -q -rxs
                 ${PROJECT_SOURCE_DIR}/tests/faults/test_federation_faults.py
         WORKING_DIRECTORY ${python_bin})
set_tests_properties(faults.federation PROPERTIES
  ENVIRONMENT "PYTHONPATH=${python_gen}:${PROJECT_SOURCE_DIR}/clients/python;SLUICE_BIN=$<TARGET_FILE:sluice_cli>;PYTHONDONTWRITEBYTECODE=1;SLUICE_FEDERATION_RESULTS=${python_bin}/federation-results.md"
  LABELS "integration;faults;timing" TIMEOUT 420)
