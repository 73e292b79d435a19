#!/usr/bin/python3
"""check_layers.py ROOT: every include follows an edge of the layer graph.

A file's path names its layer: src/<layer>/..., include/sluice/<layer>/..., sim/ (sim),
apps/ (apps), testing/ (testing); the generated messages (sluice/v1/, grpc/health/v1/, envoy/
*.pb.h) belong to the layer `api`, with src/api/, and their gRPC stubs (*.grpc.pb.h) to the
layer `stubs` (generated code on the messages, for the transport and the call-site adapters).
The graph (docs/design.md, "Layers") lists the layers each layer is built on; a file may
include its own layer and any layer reachable from it along the graph, nothing else.
So backends reach core only, core nothing, and a new folder under src/ or include/sluice/ is a
layer the check refuses until it has a line in GRAPH.

Reads the files git tracks under ROOT (src/, include/, sim/, apps/, testing/), so a build
directory inside the tree is never read. Prints every include off the graph, file:line, and
exits 1 if there is one; exits 0 otherwise.
"""
import os
import re
import subprocess
import sys

# Each layer and the layers it is built on (direct edges; includes may follow them transitively).
GRAPH = {
    "core": [],                                   # pure rules: the standard library only
    "local": ["core"],                            # in-process state: semaphores, guards, limiters
    "fleet": ["local"],                           # the fleet guard (one concurrency ceiling)
    "federation": ["core"],                       # a global rate budget's regional engine
    "backends": ["core"],                         # I/O behind core's interfaces: coordinators, probes
    "config": ["core"],                           # the YAML reader and ConfigSection
    "api": ["core"],                              # the generated messages; src/api: decode errors
    "server": ["fleet", "federation", "backends", "config", "api"],  # the engine, the kinds
    "stubs": ["api"],                             # the generated gRPC stubs (*.grpc.pb.h)
    "transport": ["server", "stubs"],             # gRPC and HTTP
    "adapters": ["local", "stubs"],               # call-site interceptors: library or remote
    "sim": ["fleet", "federation", "backends"],   # deterministic simulations
    "apps": ["transport", "sim"],                 # the executable
    "testing": ["transport", "sim"],              # test support (nothing in src/ uses it)
}


def reachable(layer):
    """The layers a file of `layer` may include: itself and everything below it on the graph."""
    seen, todo = {layer}, list(GRAPH[layer])
    while todo:
        below = todo.pop()
        if below not in seen:
            seen.add(below)
            todo.extend(GRAPH[below])
    return seen


ALLOWED = {layer: reachable(layer) for layer in GRAPH}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
GENERATED = ("sluice/v1/", "grpc/health/v1/", "envoy/")


def layer_of_file(path):
    """The layer a tracked file belongs to, "unknown:<folder>" for a folder the graph does not
    name, or None when the file is not in a layer."""
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 2:
        folder = parts[1]
    elif parts[0] == "include" and parts[1:2] == ["sluice"]:
        if len(parts) == 3:
            return "unknown:"
        folder = parts[2]
    elif parts[0] in ("sim", "apps", "testing"):
        folder = parts[0]
    else:
        return None
    return folder if folder in GRAPH else f"unknown:{'/'.join(parts[:-1])}"


def layer_of_include(name, including_dir, files):
    """The layer of what `#include name` names, or None when it is not sluice's own."""
    if name.startswith(GENERATED):
        return "stubs" if name.endswith(".grpc.pb.h") else "api"
    if name.startswith("sluice/sim/"):
        return "sim"
    if name.startswith("sluice/testing/"):
        return "testing"
    if name.startswith("sluice/"):
        return layer_of_file("include/" + name)
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
        if layer == "unknown:":
            problems.append(f"{f}: a public header outside its layer's folder: move it to "
                            "include/sluice/<layer>/")
            continue
        if layer is not None and layer.startswith("unknown:"):
            problems.append(f"{f}: in no layer ({layer[len('unknown:'):]}): add the folder to "
                            f"GRAPH in {os.path.relpath(__file__, root)} and to docs/design.md")
            continue
        if layer is None or not os.path.exists(os.path.join(root, f)):
            continue
        with open(os.path.join(root, f), encoding="utf-8") as text:
            for n, line in enumerate(text, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = layer_of_include(m.group(1), os.path.dirname(f), files)
                if target is None or target in ALLOWED[layer]:
                    continue
                if target.startswith("unknown:"):
                    problems.append(f"{f}:{n}: includes {m.group(1)}, which is in no layer")
                else:
                    problems.append(f"{f}:{n}: {layer} includes {m.group(1)} ({target}); "
                                    f"{layer} may include only "
                                    f"{', '.join(sorted(ALLOWED[layer]))}")
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} problem(s)")
        return 1
    print(f"layering: {len(files)} files, every include follows the layer graph")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: check_layers.py ROOT")
    sys.exit(main(os.path.abspath(sys.argv[1])))
