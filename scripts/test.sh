#!/usr/bin/env bash
# test.sh: the whole test suite, from a fresh Debian 12 machine (run as root).
#
# Installs missing packages, then runs five suites:
#   release  the README's first command as a user types it (tests/readme/first_command.sh runs
#            scripts/run.sh: the Release build, then sluice serve, used over HTTP, the CLI and
#            the Python client, stopped by SIGTERM), then the Release build bench/README.md
#            tells a user to make
#   default  RelWithDebInfo: unit, property, stress, install/consumer and benchmark-smoke tests
#   asan     AddressSanitizer + UndefinedBehaviorSanitizer
#   tsan     ThreadSanitizer
#   fuzz     the libFuzzer targets (scripts/fuzz.sh: clang, ASan + UBSan, build/fuzz), each run
#            SLUICE_FUZZ_SECONDS (default 30 here) on a copy of its seed corpus, two at a time;
#            one test per target
# Every g++ build here treats warnings in sluice's own code as errors (SLUICE_WERROR=ON); a
# user's build does not, nor does the clang build of the fuzz suite (scripts/fuzz.sh says why).
# Prints one summary line per configuration and a closing "N passed, N failed" line; exits
# non-zero if anything failed to build or pass. SLUICE_SUITES="default" (space-separated)
# selects suites; extra arguments are passed to ctest (e.g. -R Semaphore).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=deps.sh
source "$root/scripts/deps.sh"
sluice_install_packages "${SLUICE_BUILD_PACKAGES[@]}" "${SLUICE_TEST_PACKAGES[@]}" || exit 1
sluice_install_npm || exit 1

export CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache} CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
suites=${SLUICE_SUITES:-release default asan tsan fuzz}
jobs=$(nproc)
total_pass=0 total_fail=0 status=0
failed_names=()  # "suite: test", printed again at the end (a long log's tail is what CI shows)
failure_tails=()  # the end of each failed test's output, printed before them
slowest_lines=()  # each suite's 15 slowest tests, printed at the end

suite_flags() {
  case $1 in
    default) echo "-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_WERROR=ON" ;;
    asan) echo "-DCMAKE_BUILD_TYPE=Debug -DSLUICE_SANITIZE=address,undefined -DSLUICE_BUILD_BENCH=OFF -DSLUICE_BUILD_APPS=OFF -DSLUICE_WERROR=ON" ;;
    tsan) echo "-DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_SANITIZE=thread -DSLUICE_BUILD_BENCH=OFF -DSLUICE_BUILD_APPS=OFF -DSLUICE_WERROR=ON" ;;
    *) echo "test.sh: unknown suite '$1'" >&2; return 1 ;;
  esac
}

# One step of the release (or fuzz) suite: counted as one test.
suite_step() {
  local suite=$1 what=$2; shift 2
  if "$@"; then
    total_pass=$((total_pass + 1)); echo "=== $suite: $what: passed"
  else
    total_fail=$((total_fail + 1)); failed_names+=("$suite: $what")
    echo "=== $suite: $what: FAILED"; return 1
  fi
}
release_step() { suite_step release "$@"; }

bench_readme_build() {
  local dir="$root/build/release" log="$root/build/release.bench.log"
  if ! { cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_BENCH=ON \
           -DSLUICE_BUILD_TESTS=OFF -DSLUICE_WERROR=ON && cmake --build "$dir" -j "$jobs"; } \
         >"$log" 2>&1; then
    tail -n 60 "$log"; return 1
  fi
}

# The README's first command and the Release builds the documents tell a user to make, with
# the project's -Werror on: a change that breaks scripts/run.sh fails here.
run_release() {
  local rc=0
  echo "=== release: the README's first command (tests/readme/first_command.sh)"
  release_step "first command" env SLUICE_WERROR=ON bash "$root/tests/readme/first_command.sh" || rc=1
  echo "=== release: bench/README.md's Release build (build/release)"
  release_step "bench build" bench_readme_build || rc=1
  return "$rc"
}

# The fuzz targets: one build, then each target is one test, two at a time (one per core;
# each replays its corpus, then explores for SLUICE_FUZZ_SECONDS, 30 s here).
run_fuzz() {
  local rc=0 t pids=() names=() i
  bash "$root/scripts/fuzz.sh" --build-only || return 1
  for t in $(bash "$root/scripts/fuzz.sh" --list); do
    SLUICE_FUZZ_SECONDS=${SLUICE_FUZZ_SECONDS:-30} bash "$root/scripts/fuzz.sh" --no-build "$t" \
      >"$root/build/fuzz-$t.log" 2>&1 &
    pids+=("$!"); names+=("$t")
    if [ "${#pids[@]}" -ge "$jobs" ]; then
      fuzz_wait "${pids[0]}" "${names[0]}" || rc=1
      pids=("${pids[@]:1}"); names=("${names[@]:1}")
    fi
  done
  for i in "${!pids[@]}"; do fuzz_wait "${pids[$i]}" "${names[$i]}" || rc=1; done
  return "$rc"
}
# Waits for the fuzz run of target $2 (pid $1), shows its output, then counts it.
fuzz_wait() {
  local rc=0
  wait "$1" || rc=$?
  cat "$root/build/fuzz-$2.log"
  suite_step fuzz "$2" test "$rc" = 0
}

# Deterministic single-threaded searches and simulations (the exhaustive protocol models, the
# seeded fleet, federation and cascade simulations) are single-threaded, so ThreadSanitizer has
# nothing to check in them, and run many times slower under a sanitizer: only the default build
# runs them.
sanitizer_skips="GatewayModel|FleetModel|FederationModel|CascadeBreakerModel|CascadeSim|FederationSim|FederationPoolSim|FleetSim|SharedRateSim"
# The etcd coordinators run on Debian's gRPC and absl, which are not built with ThreadSanitizer:
# their internal synchronisation is invisible to it, and it reports races inside them (and on
# buffers they hand over). The address suite runs those tests; the thread suite leaves them out
# (and the fleet and rate conformance tests their etcd backends).
tsan_skips="EtcdCoordinatorTest|EtcdRestore|EtcdPolicy|EtcdAuth|EtcdTls|EtcdRate|EtcdRateRestore|EtcdRateOptions"
suite_ctest_args() {
  case $1 in
    asan) echo "-E ^($sanitizer_skips)[./]" ;;
    tsan) echo "-E ^($sanitizer_skips|$tsan_skips)[./]|^integration\\.etcd_cluster$" ;;
  esac
}
# Tests at once: two per core (most wait on servers and timers; what keeps a core busy takes two
# slots: tests/CMakeLists.txt, "Scheduling"). Measured on 2 cores when it was set: the default
# suite's ctest took 10-11.5 minutes instead of 15, each sanitizer's under 2 instead of 2.5.
ctest_jobs=$((2 * jobs))

# The 15 slowest tests of a suite's ctest log, slowest first: where its time went.
slowest() {
  grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$1" |
    sed -E 's/^.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/' | sort -rn | head -n 15 |
    awk -v s="$2" '{printf "=== %s: slowest: %7.1f s  %s\n", s, $1, $2}'
}

# Where the run's time went: each suite's wall time (and a built suite's build and ctest),
# printed at the end as "=== time: ..." lines.
time_lines=()
took() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

run_suite() {
  local name=$1; shift
  [ "$name" = release ] && { run_release; return; }
  [ "$name" = fuzz ] && { run_fuzz; return; }
  local dir="$root/build/test-$name" flags log
  flags=$(suite_flags "$name") || return 1
  echo "=== $name: configure + build ($dir)"
  local started=$SECONDS
  # shellcheck disable=SC2086
  if ! cmake -S "$root" -B "$dir" -G Ninja $flags >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log"; echo "=== $name: configure FAILED"; return 1
  fi
  if ! cmake --build "$dir" -j "$jobs" >"$dir.build.log" 2>&1; then
    tail -n 60 "$dir.build.log"; echo "=== $name: build FAILED"; return 1
  fi
  time_lines+=("=== time: $name: configure + build $(took $((SECONDS - started)))")
  echo "=== $name: ctest"
  started=$SECONDS
  log="$dir.ctest.log"
  local skip
  read -ra skip <<<"$(suite_ctest_args "$name")"
  (cd "$dir" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
     ctest --output-on-failure -j "$ctest_jobs" "${skip[@]}" "$@") \
    2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]} line pass fail
  time_lines+=("=== time: $name: ctest $(took $((SECONDS - started)))")
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  if [ -n "$line" ]; then
    fail=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
    pass=$(( $(sed -E 's/.* failed out of ([0-9]+).*/\1/' <<<"$line") - fail ))
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
  fi
  # ctest's closing list: "  123 - Suite.Name (Failed)"
  local t
  while IFS= read -r t; do
    failed_names+=("$name: $t")
    failure_tails+=("=== $name: the end of ${t% (*}'s output
$(failure_tail "$log" "${t% (*}")")
  done < <(
    sed -n '/^The following tests FAILED:/,$p' "$log" | sed -nE 's/^[[:space:]]+[0-9]+ - (.*)$/\1/p')
  slowest_lines+=("$(slowest "$log" "$name")")
  return "$rc"
}

# The last lines a failed test printed: told again at the end, where a reader of only the run's
# last lines sees them. Read from the suite's ctest log (--output-on-failure prints a failed test's
# output right after its result line, up to the next test's line), not from ctest's
# Testing/Temporary/LastTest.log: a test that runs ctest itself (the registry check) rewrites that.
failure_tail() {
  local log=$1 t=$2
  awk -v t="$t" '
    /^ *Start +[0-9]+: / || /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / {
      on = 0
      split($0, f, ": ")
      name = f[2]; sub(/ .*/, "", name)
      if (name == t && $0 ~ /Test +#/ && $0 !~ / Passed /) on = 1
      next
    }
    /^[0-9]+% tests passed/ { on = 0 }
    on' "$log" 2>/dev/null | tail -n 40
}

mkdir -p "$root/build"
for s in $suites; do
  suite_started=$SECONDS
  if ! run_suite "$s" "$@"; then
    status=1; echo "=== $s: FAILED"
  fi
  time_lines+=("=== time: $s: $(took $((SECONDS - suite_started))) in all")
done
time_lines+=("=== time: the whole run: $(took "$SECONDS")")
for t in "${slowest_lines[@]}"; do echo "$t"; done
for t in "${time_lines[@]}"; do echo "$t"; done
for t in "${failure_tails[@]}"; do echo "$t"; done
echo "suites: $suites"
[ "$status" = 0 ] || echo "some suite failed to build or pass (see above)"
for t in "${failed_names[@]}"; do echo "failed: $t"; done
echo "tests: $total_pass passed, $total_fail failed"
exit "$status"
