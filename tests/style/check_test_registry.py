#!/usr/bin/python3
"""check_test_registry.py CTEST BUILD_DIR TESTS_DIR: every test is registered under TESTS_DIR
and has a label.

Reads ctest's own list of the build's tests (ctest --show-only=json-v1): each test registered by
add_test must come from a CMake file under TESTS_DIR (tests/CMakeLists.txt and what it includes:
tests/cli/, tests/python.cmake, tests/bench.cmake), so one folder says what the suite runs; each
test must carry a LABELS property, so `ctest -L LABEL` selects it. Tests that gtest discovers when
ctest runs (DISCOVERY_MODE PRE_TEST) have no CMake file of their own: their binaries are defined
in tests/CMakeLists.txt, which labels them. Prints each problem and exits 1 if there is one.
"""
import json
import os
import subprocess
import sys


def main(ctest, build, tests_dir):
    out = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, check=True,
                         capture_output=True, text=True).stdout
    listing = json.loads(out)
    graph = listing.get("backtraceGraph", {"files": [], "nodes": []})
    tests_dir = os.path.realpath(tests_dir)
    problems = []
    for test in listing["tests"]:
        name = test["name"]
        if "backtrace" in test:
            where = os.path.realpath(graph["files"][graph["nodes"][test["backtrace"]]["file"]])
            if os.path.commonpath([where, tests_dir]) != tests_dir:
                problems.append(f"{name}: registered in {where}, not under {tests_dir}")
        labels = [p for p in test.get("properties", []) if p["name"] == "LABELS"]
        if not labels or not labels[0]["value"]:
            problems.append(f"{name}: no label (set_tests_properties(... LABELS ...))")
    for p in problems:
        print(p)
    if problems:
        print(f"test registry: {len(problems)} problem(s)")
        return 1
    print(f"test registry: {len(listing['tests'])} tests, each registered under {tests_dir} "
          "with a label")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: check_test_registry.py CTEST BUILD_DIR TESTS_DIR")
    sys.exit(main(*sys.argv[1:]))
