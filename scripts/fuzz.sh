#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets (fuzz/, docs/fuzzing.md) in build/fuzz with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for a bounded time on a copy of
# its seed corpus (fuzz/corpus/<target>/ is never modified).
#
#   bash scripts/fuzz.sh                  build, then run every target
#   bash scripts/fuzz.sh http grpc        build, then run those targets
#   bash scripts/fuzz.sh --build-only     build only
#   bash scripts/fuzz.sh --no-build http  run without building (scripts/test.sh builds first)
#   bash scripts/fuzz.sh --list           the target names
#
# SLUICE_FUZZ_SECONDS (default 60) bounds each target's run (-max_total_time); extra libFuzzer
# flags can go in SLUICE_FUZZ_FLAGS. A target that crashes, leaks, hangs past 25 s on one input
# or breaks an invariant fails; its reproducer is written to build/fuzz/artifacts/ (replay it:
# build/fuzz/fuzz/fuzz_<target> <file>). Exits non-zero if the build or any target failed.
# Warnings are not errors here: the g++ suites of scripts/test.sh hold sluice's code to -Werror,
# and clang's own extra warnings must not keep the fuzzers from running.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/build/fuzz
targets_all=(config http problem_json grpc)
seconds=${SLUICE_FUZZ_SECONDS:-60}

build=1 run=1 targets=()
for a in "$@"; do
  case $a in
    --build-only) run=0 ;;
    --no-build) build=0 ;;
    --list) echo "${targets_all[*]}"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$a'" >&2; exit 2 ;;
    *)
      if [[ " ${targets_all[*]} " != *" $a "* ]]; then
        echo "fuzz.sh: no target '$a' (targets: ${targets_all[*]})" >&2; exit 2
      fi
      targets+=("$a") ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${targets_all[@]}")

if [ "$build" = 1 ]; then
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.ccache} CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
  mkdir -p "$root/build"
  log=$root/build/fuzz.build.log
  echo "=== fuzz: configure + build ($dir)"
  if ! { CC=clang CXX=clang++ cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           -DSLUICE_FUZZ=ON -DSLUICE_SANITIZE=address,undefined -DSLUICE_BUILD_TESTS=OFF \
           -DSLUICE_BUILD_BENCH=OFF -DSLUICE_WERROR=OFF &&
         cmake --build "$dir" -j "$(nproc)" --target sluice_fuzz; } >"$log" 2>&1; then
    tail -n 60 "$log"; echo "=== fuzz: build FAILED (log: $log)"; exit 1
  fi
fi
[ "$run" = 1 ] || exit 0

status=0
mkdir -p "$dir/artifacts"
for t in "${targets[@]}"; do
  exe=$dir/fuzz/fuzz_$t
  if [ ! -x "$exe" ]; then
    echo "=== fuzz: $t: FAILED (no $exe: build first)"; status=1; continue
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-fuzz-$t.XXXXXX")
  cp -r "$root/fuzz/corpus/$t/." "$work/"
  dict=()
  [ -f "$root/fuzz/dict/$t.dict" ] && dict=(-dict="$root/fuzz/dict/$t.dict")
  log=$dir/artifacts/$t.log
  echo "=== fuzz: $t (${seconds}s, corpus of $(find "$work" -type f | wc -l))"
  # shellcheck disable=SC2086
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$exe" "$work" "${dict[@]}" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/$t-" ${SLUICE_FUZZ_FLAGS:-} \
    >"$log" 2>&1
  rc=$?
  if [ "$rc" = 0 ]; then
    echo "=== fuzz: $t: passed ($(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" |
      grep -Eo '[0-9]+$') runs, corpus now $(find "$work" -type f | wc -l))"
  else
    status=1
    tail -n 40 "$log"
    echo "=== fuzz: $t: FAILED (exit $rc; log $log; reproducer $(grep -Eo "$dir/artifacts/$t-[a-z]+-[0-9a-f]+" "$log" | tail -n 1))"
  fi
  rm -rf "$work"
done
exit "$status"
