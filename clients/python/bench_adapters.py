#!/usr/bin/env python3
"""What the adapters add to a request's latency: a trivial handler served bare and behind each
adapter, the same load on each, in the same run.

  * WSGI: a Flask app ("/" answers "ok") on waitress (python3-waitress: werkzeug's server
    closes every connection, waitress keeps them alive);
  * ASGI: a Starlette app ("/" answers "ok") on uvicorn (h11);
  * gRPC: a grpc.server with one unary bytes-echo method;

each bare, behind the adapter on a rate policy (one Check per request; with an allowance, one
per 128 requests, the rest admitted in the adapter), and behind it on a concurrency policy
(Admit, then Release; the release waited for, the default, and in the background; and with
lease reuse, a request taking the lease the one before it freed). Every server is its own
process; this one sends the requests, sequentially, each variant over one keep-alive connection
(gRPC: one channel), in rounds, each running every variant once in an order shuffled per round
(a fixed seed), so that the variants share the machine's noise. It prints the median and the
99th percentile of each, their ratios to the bare server's over all rounds, and the paired
ratios: the median over rounds of each round's ratio to the bare server's in the same round
(drift between rounds cancels). A second bare server ("bare, again") is the control: its ratio
is what the harness alone shows; "pass-through" is a middleware (gRPC: an interceptor) that only
calls what it wraps: what any adapter of that framework pays before doing anything. A direct
client's calls (Check; Admit + Release) are timed too, the floor of what an adapter can add, and
the adapters' own code without any RPC (a stub that answers at once): the rest.

Run it from a build (the CMake stubs on PYTHONPATH) or with the package installed:

  cd build/test-default/clients/python && PYTHONPATH=$PWD/gen:$OLDPWD/clients/python \\
    /usr/bin/python3 $OLDPWD/clients/python/bench_adapters.py

Options: --requests N (measured per variant, default 5000), --rounds R (10), --warmup N (300),
--sluice PATH (default $SLUICE_BIN, else build/test-default/apps/sluice/sluice), --only
wsgi,asgi,grpc, --json FILE (the figures as JSON too), --pin (the servers on CPU 1, the load and
`sluice serve` on CPU 0: the runs' controls then agree within a few percent).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # sluice_client of this checkout, unless installed

CONFIG = """\
policies:
  bench-rate: {kind: rate, limit: 1000000000, period: 1s}
  bench-conc: {kind: adaptive, algorithm: fixed, limit: 1000}
"""

# The allowance variant takes 128 hits at a time, each spent within 0.1 s (what one connection's
# sequential requests spend in far less): one Check per 128 requests.
ALLOWANCE, ALLOWANCE_HOLD = 128, 0.1

# The lease reuse variant keeps a finished request's lease 20 ms for the next one (what one
# connection's sequential requests take in far less) and reports its requests once per 20 ms.
LEASE_REUSE = 0.02

# The pass-through variant: a middleware (gRPC: an interceptor wrapping the handler) that does
# nothing but call what it wraps: what any adapter of the framework pays before its own work.
PASS = "-"

VARIANTS = [  # (name, policy, background_release, allowance, lease_reuse)
    ("bare", None, False, 0, 0.0),
    ("bare, again", None, False, 0, 0.0),
    ("pass-through", PASS, False, 0, 0.0),
    ("rate", "bench-rate", False, 0, 0.0),
    (f"rate, allowance {ALLOWANCE}", "bench-rate", False, ALLOWANCE, 0.0),
    ("concurrency", "bench-conc", False, 0, 0.0),
    ("concurrency, background release", "bench-conc", True, 0, 0.0),
    ("concurrency, lease reuse", "bench-conc", False, 0, LEASE_REUSE),
]


# ---- the servers (child processes: --serve KIND) ----

def serve(kind: str, policy: Optional[str], target: str, background: bool,
          allowance: int, lease_reuse: float) -> None:
    options = dict(target=target, background_release=background)
    if allowance:
        options.update(allowance=allowance, allowance_hold=ALLOWANCE_HOLD)
    if lease_reuse:
        options.update(lease_reuse=lease_reuse)
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    if kind == "wsgi":
        import flask
        import waitress

        from sluice_client.wsgi import SluiceWSGIMiddleware

        app = flask.Flask("bench")
        app.add_url_rule("/", "ok", lambda: "ok")
        if policy == PASS:
            inner = app.wsgi_app
            app.wsgi_app = lambda environ, start_response: inner(environ, start_response)
        elif policy:
            app.wsgi_app = SluiceWSGIMiddleware(app.wsgi_app, policy, **options)
        # waitress: HTTP/1.1 keep-alive (werkzeug's server closes every connection).
        server = waitress.create_server(app, sockets=[sock], threads=4, channel_timeout=600)
        print(port, flush=True)
        server.run()
    elif kind == "asgi":
        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import PlainTextResponse
        from starlette.routing import Route

        from sluice_client.asgi import SluiceASGIMiddleware

        async def ok(request):
            return PlainTextResponse("ok")

        class PassThrough:
            def __init__(self, app):
                self.app = app

            async def __call__(self, scope, receive, send):
                await self.app(scope, receive, send)

        app = Starlette(routes=[Route("/", ok)])
        if policy == PASS:
            app.add_middleware(PassThrough)
        elif policy:
            app.add_middleware(SluiceASGIMiddleware, policy=policy, **options)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http="h11",
                                               lifespan="on", access_log=False,
                                               timeout_keep_alive=600))
        print(port, flush=True)
        server.run(sockets=[sock])
    elif kind == "grpc":
        from concurrent import futures

        import grpc

        from sluice_client.grpc_interceptor import SluiceServerInterceptor

        class PassThrough(grpc.ServerInterceptor):
            def intercept_service(self, continuation, details):
                handler = continuation(details)
                inner = handler.unary_unary
                return grpc.unary_unary_rpc_method_handler(
                    lambda request, context: inner(request, context),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

        sock.close()
        interceptors = ([PassThrough()] if policy == PASS else
                        [SluiceServerInterceptor(policy, **options)] if policy else [])
        server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=interceptors)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "bench.Echo", {"Say": grpc.unary_unary_rpc_method_handler(lambda r, c: r)})])
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        print(port, flush=True)
        server.wait_for_termination()
    else:
        raise SystemExit(f"unknown server kind {kind!r}")


# ---- the load ----

class Child:
    def __init__(self, kind: str, policy: Optional[str], target: str, background: bool,
                 allowance: int, lease_reuse: float, cpus: Optional[set] = None):
        args = [sys.executable, __file__, "--serve", kind, "--target", target]
        if policy:
            args.append(f"--policy={policy}")
        if background:
            args.append("--background-release")
        if allowance:
            args += ["--allowance", str(allowance)]
        if lease_reuse:
            args += ["--lease-reuse", str(lease_reuse)]
        self.proc = subprocess.Popen(  # on `cpus` (--pin), else wherever the kernel puts it
            args, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{kind} server ({policy}) did not start")
        self.port = int(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def http_caller(port: int) -> Callable[[], None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call() -> None:
        conn.request("GET", "/")
        r = conn.getresponse()
        body = r.read()
        if r.status != 200 or body != b"ok":
            raise RuntimeError(f"answered {r.status} {body[:200]!r}")

    return call


def grpc_caller(port: int) -> Callable[[], None]:
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    say = channel.unary_unary("/bench.Echo/Say")

    def call() -> None:
        if say(b"x", timeout=10) != b"x":
            raise RuntimeError("wrong answer")

    return call


def connect(make: Callable[[int], Callable[[], None]], port: int,
            timeout: float = 15.0) -> Callable[[], None]:
    """A caller for `port` that has answered once (the server may still be starting)."""
    deadline = time.monotonic() + timeout
    while True:
        call = make(port)
        try:
            call()
            return call
        except Exception:  # noqa: BLE001 - starting up
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def percentile(sorted_values: List[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


def measure(callers: Dict[str, Callable[[], None]], requests: int, rounds: int,
            warmup: int) -> Dict[str, List[List[float]]]:
    """Each caller `requests` times in total, in `rounds` rounds (the callers' order shuffled
    in each); latencies (s), per caller and round."""
    for call in callers.values():
        for _ in range(warmup):
            call()
    samples: Dict[str, List[List[float]]] = {name: [] for name in callers}
    per_round = max(1, requests // rounds)
    clock = time.perf_counter
    order = random.Random(20261203)
    for _ in range(rounds):
        names = list(callers)
        order.shuffle(names)
        for name in names:
            call = callers[name]
            out: List[float] = []
            for _ in range(per_round):
                t0 = clock()
                call()
                out.append(clock() - t0)
            samples[name].append(out)
    return samples


def summarize(samples: Dict[str, List[List[float]]]) -> Dict[str, Dict[str, float]]:
    out = {}
    bare = samples.get("bare")
    for name, per_round in samples.items():
        v = sorted(x for r in per_round for x in r)
        row = {"n": len(v), "median_us": statistics.median(v) * 1e6,
               "p99_us": percentile(v, 0.99) * 1e6}
        if bare is not None:
            rs = [(sorted(mine), sorted(floor)) for mine, floor in zip(per_round, bare)]
            row["paired_median_x"] = statistics.median(
                statistics.median(m) / statistics.median(f) for m, f in rs)
            row["paired_p99_x"] = statistics.median(
                percentile(m, 0.99) / percentile(f, 0.99) for m, f in rs)
        out[name] = row
    return out


def gate_without_rpc() -> Dict[str, Callable[[], None]]:
    """The adapters' own work per request (Gate.enter + Gate.exit, a WSGI request's view),
    on a stub that answers at once: what is left when the RPCs are taken away."""
    from sluice.v1 import sluice_pb2

    from sluice_client.adapters import Gate
    from sluice_client.wsgi import WSGIRequest

    check = sluice_pb2.CheckResponse(decision=sluice_pb2.Decision(allowed=True, limit=1000,
                                                                   remaining=999))
    admit = sluice_pb2.AdmitResponse(admitted=True, lease_id="0" * 32, reusable=True)
    admit.ttl.seconds = 30
    release = sluice_pb2.ReleaseResponse()

    class Answered:  # a future already answered (kept leases' releases, refills)
        def __init__(self, resp):
            self.resp = resp

        def add_done_callback(self, fn):
            fn(self)

        def exception(self, timeout=None):
            return None

        def result(self, timeout=None):
            return self.resp

        def done(self):
            return True

    class Method:
        def __init__(self, resp):
            self.resp = resp

        def __call__(self, msg, timeout=None):
            return self.resp

        def future(self, msg, timeout=None):
            return Answered(self.resp)

    class Stub:
        Check = Method(check)
        Admit = Method(admit)
        Release = Method(release)

    class FakeClient:
        target, timeout, _stub = "in-memory", 1.0, Stub()

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "HTTP_X_API_KEY": "k"}
    gates = {"rate": Gate("r", client=FakeClient(), kind="rate"),
             f"rate, allowance {ALLOWANCE}": Gate("r", client=FakeClient(), kind="rate",
                                                  allowance=ALLOWANCE, allowance_hold=60),
             "concurrency": Gate("c", client=FakeClient(), kind="concurrency"),
             "concurrency, lease reuse": Gate("c", client=FakeClient(), kind="concurrency",
                                              lease_reuse=60)}

    def one(gate):
        def call():
            adm = gate.enter(WSGIRequest("GET", "/", environ))
            gate.exit(adm, "success")
        return call

    return {name: one(g) for name, g in gates.items()}


def start_sluice(binary: str, workdir: Path):
    cfg = workdir / "bench.yaml"
    cfg.write_text(CONFIG)
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    log = open(workdir / "sluice.log", "wb")
    proc = subprocess.Popen([binary, "serve", "--config", str(cfg), "--grpc",
                             f"127.0.0.1:{ports[0]}", "--http", f"127.0.0.1:{ports[1]}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 15
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", ports[1], timeout=1)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"sluice serve did not start: {(workdir / 'sluice.log').read_text()}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{ports[0]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", choices=("wsgi", "asgi", "grpc"), help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    ap.add_argument("--target", default="127.0.0.1:7070", help=argparse.SUPPRESS)
    ap.add_argument("--background-release", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--allowance", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--lease-reuse", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN") or
                    str(REPO / "build" / "test-default" / "apps" / "sluice" / "sluice"))
    ap.add_argument("--only", default="wsgi,asgi,grpc")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--pin", action="store_true",
                    help="the servers on CPU 1, the load and sluice serve on CPU 0")
    a = ap.parse_args()
    if a.serve:
        return serve(a.serve, a.policy, a.target, a.background_release, a.allowance,
                     a.lease_reuse)

    from sluice_client import Client  # fails early without the stubs

    servers_cpus: Optional[set] = None
    if a.pin:  # before sluice serve starts: it shares the load's CPU
        if len(os.sched_getaffinity(0)) < 2:
            raise SystemExit("--pin: needs two CPUs")
        servers_cpus = {1}
        os.sched_setaffinity(0, {0})

    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        sluice, target = start_sluice(a.sluice, Path(tmp))
        children: List[Child] = []
        try:
            with Client(target, timeout=5) as client:
                def admit_release():
                    client.release(client.admit("bench-conc", key="k"))

                direct = {"Check": lambda: client.check("bench-rate", "k"),
                          "Admit + Release": admit_release}
                results["direct client"] = summarize(measure(direct, a.requests, a.rounds,
                                                             a.warmup))
            results["adapter code alone"] = summarize(measure(gate_without_rpc(), a.requests,
                                                              a.rounds, a.warmup))
            for kind in a.only.split(","):
                callers = {}
                for name, policy, background, allowance, lease_reuse in VARIANTS:
                    child = Child(kind, policy, target, background, allowance, lease_reuse,
                                  servers_cpus)
                    children.append(child)
                    callers[name] = connect(grpc_caller if kind == "grpc" else http_caller,
                                            child.port)
                results[kind] = summarize(measure(callers, a.requests, a.rounds, a.warmup))
                for c in children:
                    c.stop()
                children.clear()
        finally:
            for c in children:
                c.stop()
            sluice.send_signal(signal.SIGTERM)
            sluice.wait(10)

    load = os.getloadavg()
    print(f"# {a.requests} sequential requests per variant over one keep-alive connection, "
          f"{a.rounds} interleaved rounds, after {a.warmup} warm-up; {os.cpu_count()} CPUs, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; Python "
          f"{sys.version.split()[0]}")
    print(f"{'server':<19} {'variant':<32} {'median us':>10} {'p99 us':>10} "
          f"{'median x':>9} {'p99 x':>7} {'paired median x':>16} {'paired p99 x':>13}")
    for kind, rows in results.items():
        bare = rows.get("bare")
        for name, r in rows.items():
            ratio_m = f"{r['median_us'] / bare['median_us']:.2f}" if bare else "-"
            ratio_p = f"{r['p99_us'] / bare['p99_us']:.2f}" if bare else "-"
            paired_m = f"{r['paired_median_x']:.2f}" if bare else "-"
            paired_p = f"{r['paired_p99_x']:.2f}" if bare else "-"
            print(f"{kind:<19} {name:<32} {r['median_us']:>10.0f} {r['p99_us']:>10.0f} "
                  f"{ratio_m:>9} {ratio_p:>7} {paired_m:>16} {paired_p:>13}")
    if a.json:
        a.json.write_text(json.dumps({"load_average": load, "requests": a.requests,
                                      "rounds": a.rounds, "results": results}, indent=2))


if __name__ == "__main__":
    main()
