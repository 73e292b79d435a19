#!/usr/bin/python3
"""check_clock_reads.py ROOT: the OS clocks are read only where this file says why.

Decisions take their time from an injected sluice::Clock (include/sluice/core/clock.h). A direct
read of std::chrono's steady_clock or system_clock (`..._clock::now()`) is allowed only in the
files listed in READERS, each for a reason that is not a decision; a listed file that no longer
reads a clock is an error too, so the list stays the truth. Reads the files git tracks under
src/, include/ and apps/; prints each problem, file:line, and exits 1 if there is one.
"""
import os
import re
import subprocess
import sys

READERS = {
    "src/core/clock.cpp": "SteadyClock, unix_ms_now() and unix_ns_now(): the seam itself",
    "src/backends/http/http_client.cpp": "a socket's connect/send/read deadline",
    "src/backends/etcd/etcd_client.cpp": "gRPC takes a call's deadline on the system clock",
    "src/backends/probes/host_probes.cpp": "the command probe's child-process deadline",
    "src/server/shared_rule_mirror.cpp": "the background reader's sleep between reads",
    "src/server/policies/throttler_listings.cpp": "seconds since a metric's last read, shown",
    "src/transport/grpc_listener.cpp": "idle-connection sweep of the gRPC listener",
    "src/transport/grpc_service.cpp": "what is left of a caller's gRPC deadline",
    "apps/sluice/client.cpp": "the CLI's gRPC call deadline",
    "apps/sluice/serve.cpp": "the shutdown grace period",
    "apps/sluice/top.cpp": "the terminal view's refresh cadence and its gRPC call deadline",
    "src/adapters/grpc_admission.cpp": "a gRPC call's latency at the call site and its deadlines",
}

READ = re.compile(r"\b(steady_clock|system_clock|high_resolution_clock)::now\s*\(")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "--", "src", "include", "apps"],
                         check=True, capture_output=True, text=True).stdout
    return [f for f in out.splitlines() if f.endswith((".h", ".cpp"))]


def main(root):
    problems = []
    readers = set()
    for f in sorted(tracked(root)):
        if not os.path.exists(os.path.join(root, f)):
            continue
        with open(os.path.join(root, f), encoding="utf-8") as text:
            for n, line in enumerate(text, 1):
                code = line.split("//", 1)[0]
                if not READ.search(code):
                    continue
                readers.add(f)
                if f not in READERS:
                    problems.append(f"{f}:{n}: reads the OS clock directly: take a "
                                    "sluice::Clock (or SteadyClock::instance() / unix_ms_now()), "
                                    "or list the file and its reason in READERS in "
                                    f"{os.path.relpath(__file__, root)}")
    if os.path.exists(os.path.join(root, "src/core/clock.cpp")):  # the real tree, not a fixture
        for f in sorted(set(READERS) - readers):
            problems.append(f"{f}: listed in READERS but reads no clock: take it off the list")
    for p in problems:
        print(p)
    if problems:
        print(f"clock reads: {len(problems)} outside the listed files")
        return 1
    print(f"clock reads: only in the {len(READERS)} listed files")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: check_clock_reads.py ROOT")
    sys.exit(main(os.path.abspath(sys.argv[1])))
