#!/usr/bin/python3
"""check_layers.py ROOT: every include in the tree points down the layers, never up.

The layers, lowest first (DESIGN.md): core -> local -> fleet -> backends -> config -> server ->
transport -> apps; sim sits beside server (over the layers below it); testing is test support
(anything but apps may use it, nothing in src/ does). A file may include its own layer and the
layers below it. A public header (include/sluice/X.h) belongs to the layer named for it in
PUBLIC_HEADERS below: a new public header must be added there, or the check fails.

Reads the files git tracks under ROOT (src/, include/, sim/, apps/, testing/), so a build
directory inside the tree is never read. Prints every upward include, file:line, and exits 1
if there is one; exits 0 otherwise.
"""
import os
import re
import subprocess
import sys

ORDER = ["core", "local", "fleet", "backends", "config", "server", "transport", "apps"]

# Which layers each layer may include (itself and below; sim and testing as described above).
ALLOWED = {layer: set(ORDER[: i + 1]) for i, layer in enumerate(ORDER)}
ALLOWED["sim"] = set(ORDER[: ORDER.index("backends") + 1]) | {"sim"}
ALLOWED["apps"] |= {"sim"}
ALLOWED["testing"] = set(ORDER[: ORDER.index("transport") + 1]) | {"testing", "sim"}

# include/sluice/<name>: the layer of each public header.
PUBLIC_HEADERS = {
    "aimd_limit.h": "core",
    "algorithm_spec.h": "core",
    "clock.h": "core",
    "coordinator.h": "core",
    "escrow.h": "core",
    "fixed_limit.h": "core",
    "fleet.h": "core",
    "gradient2_limit.h": "core",
    "limit_algorithm.h": "core",
    "rate_coordinator.h": "core",
    "regional_escrow.h": "core",
    "rate_strategy.h": "core",
    "status.h": "core",
    "text.h": "core",
    "throttler.h": "core",
    "cascade.h": "core",
    "timed_coordinator.h": "backends",
    "throttler_client.h": "backends",
    "vegas_limit.h": "core",
    "adaptive_guard.h": "local",
    "gateway.h": "local",
    "gateway_admission.h": "local",
    "gateway_config.h": "local",
    "gateway_metrics.h": "local",
    "gateway_permit.h": "local",
    "rejection.h": "local",
    "gateway_validation.h": "local",
    "rate_limiter.h": "local",
    "semaphore.h": "local",
    "cascade_stats.h": "local",
    "circuit_breaker.h": "local",
    "retry_budget.h": "local",
    "fallback_cascade.h": "local",
    "federation.h": "fleet",
    "fleet_guard.h": "fleet",
    "memory_coordinator.h": "backends",
    "memory_rate_coordinator.h": "backends",
    "memory_regional_escrow.h": "backends",
    "postgres_coordinator.h": "backends",
    "postgres_options.h": "core",
    "postgres_rate_coordinator.h": "backends",
    "redis_coordinator.h": "backends",
    "redis_options.h": "core",
    "redis_rate_coordinator.h": "backends",
    "redis_regional_escrow.h": "backends",
    "shared_rules.h": "backends",
    "config.h": "config",
    "config_section.h": "config",
}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def layer_of_file(path):
    """The layer a tracked file belongs to, or None when it is not in a layer."""
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1] if parts[1] in ALLOWED else None
    if parts[0] == "include" and parts[1:2] == ["sluice"] and len(parts) == 3:
        return PUBLIC_HEADERS.get(parts[2], "unlisted")
    if parts[0] in ("sim", "apps", "testing"):
        return parts[0]
    return None


def layer_of_include(name, including_dir, files):
    """The layer of what `#include name` names, or None when it is not sluice's own."""
    if name.startswith("sluice/v1/"):
        return "transport"  # the generated gRPC API
    if name.startswith("sluice/sim/"):
        return "sim"
    if name.startswith("sluice/testing/"):
        return "testing"
    if name.startswith("sluice/") and name.count("/") == 1:
        return PUBLIC_HEADERS.get(name[len("sluice/"):], "unlisted")
    if "src/" + name in files:
        return layer_of_file("src/" + name)
    local = os.path.normpath(os.path.join(including_dir, name))
    if local in files:
        return layer_of_file(local)
    return None


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "--", "src", "include", "sim", "apps",
                          "testing"], check=True, capture_output=True, text=True).stdout
    return [f for f in out.splitlines() if f.endswith((".h", ".cpp", ".in"))]


def main(root):
    files = set(tracked(root))
    problems = []
    for f in sorted(files):
        layer = layer_of_file(f)
        if layer == "unlisted":
            problems.append(f"{f}: a public header with no layer: add it to PUBLIC_HEADERS in "
                            f"{os.path.relpath(__file__, root)}")
            continue
        if layer is None or not os.path.exists(os.path.join(root, f)):
            continue
        with open(os.path.join(root, f), encoding="utf-8") as text:
            for n, line in enumerate(text, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = layer_of_include(m.group(1), os.path.dirname(f), files)
                if target == "unlisted":
                    problems.append(f"{f}:{n}: includes {m.group(1)}, a public header with no "
                                    "layer")
                elif target is not None and target not in ALLOWED[layer]:
                    problems.append(f"{f}:{n}: {layer} includes {m.group(1)} ({target}): an "
                                    f"include must point down the layers "
                                    f"({' -> '.join(ORDER)}; sim beside server)")
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} problem(s)")
        return 1
    print(f"layering: {len(files)} files, every include points down the layers")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: check_layers.py ROOT")
    sys.exit(main(os.path.abspath(sys.argv[1])))
