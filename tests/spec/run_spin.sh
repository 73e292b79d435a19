#!/usr/bin/env bash
# run_spin.sh MODEL EXPECT [spin -D flags...]: generates the verifier for MODEL, compiles it
# (safety: assertions and invalid end states), runs it in a temp dir and checks the verdict.
# EXPECT is "pass" (no error may be found) or "fail" (the model is a deliberately broken
# variant: spin must find an error). Prints spin's state count either way. $PAN_FLAGS, if set,
# go to the verifier's run (e.g. -w28: a hash table sized for 10^8 states).
set -euo pipefail
model=$(realpath "$1"); expect=$2; shift 2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
spin "$@" -a "$model" >spin.log 2>&1 || { cat spin.log; exit 1; }
gcc -O2 -DSAFETY -DVECTORSZ=4096 -o pan pan.c >gcc.log 2>&1 || { cat gcc.log; exit 1; }
# PAN_FLAGS unquoted: a list of flags.
./pan -m1000000 ${PAN_FLAGS:-} >pan.log 2>&1 || true
grep -E "errors:|states, stored|pan:[0-9]+:|invalid end state|assertion violated" pan.log | head -n 6
errors=$(sed -nE 's/.*errors: ([0-9]+).*/\1/p' pan.log | head -n 1)
[ -n "$errors" ] || { echo "run_spin.sh: no verdict from pan"; cat pan.log; exit 1; }
if [ "$expect" = pass ] && [ "$errors" = 0 ]; then exit 0; fi
if [ "$expect" = fail ] && [ "$errors" != 0 ]; then echo "broken variant caught"; exit 0; fi
echo "run_spin.sh: expected $expect, pan reported $errors error(s)"; exit 1
