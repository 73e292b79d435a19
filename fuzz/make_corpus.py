#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/, docs/fuzzing.md).

Run from anywhere: /usr/bin/python3 fuzz/make_corpus.py. It replaces every generated seed (files
named gen-*) and leaves the others (reproducers of crashes found, named crash-*) alone. The
seeds are deterministic, so running it twice changes nothing.

  config        the configs under config/ and apps/sluice/testdata/, and every YAML document the
                tests embed (raw strings naming policies: or coordinators:)
  http          a request to every endpoint, good and bad, in fuzz_http.cpp's format
  grpc          serialized sluice.v1 requests of every call, in fuzz_grpc.cpp's format (the
                protobuf wire format is written here by hand: no protobuf module needed)
  problem_json  byte strings for fuzz_problem_json.cpp's FuzzedDataProvider
"""
import hashlib
import json
import pathlib
import random
import re
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, seeds):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("gen-*"):
        old.unlink()
    for s in seeds:
        if isinstance(s, str):
            s = s.encode()
        (d / ("gen-" + hashlib.sha1(s).hexdigest()[:16])).write_bytes(s)
    print(f"{target}: {len(set(seeds))} seeds")


# ---- config ----

RAW = re.compile(r'R"(\w*)\((.*?)\)\1"', re.S)
# One or more adjacent ordinary string literals ("a\n" "b\n"), joined as C++ joins them.
LITERALS = re.compile(r'(?:"(?:[^"\\\n]|\\.)*"\s*)+')
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "0": "\0"}


def unescape(text):
    return re.sub(r"\\(.)", lambda m: ESCAPES.get(m.group(1), m.group(1)), text)


def config_seeds():
    seeds = []
    for p in sorted((ROOT / "config").glob("*.yaml")) + sorted(
            (ROOT / "apps/sluice/testdata").glob("*.yaml")):
        seeds.append(p.read_text())
    for p in sorted((ROOT / "tests").rglob("*.cpp")):
        for m in RAW.finditer(p.read_text()):
            text = m.group(2)
            if "policies:" in text or "coordinators:" in text:
                seeds.append(text)
        for m in LITERALS.finditer(RAW.sub("", p.read_text())):
            text = "".join(unescape(x) for x in LITERAL.findall(m.group(0)))
            if "policies:" in text or "coordinators:" in text:
                seeds.append(text)
    return sorted(set(seeds))


# ---- http ----

ENDPOINTS = ["/metrics", "/healthz", "/readyz", "/v1/policies", "/v1/check", "/v1/peek",
             "/v1/check_many", "/v1/admit", "/v1/release", "/v1/heartbeat", "/admin/reload",
             "/v1/charge"]
SEP = b"\n~~\n"


def http_request(endpoint, body=b"", line=b"", method=0, clock=0, auth=0):
    """endpoint: an index into fuzz_http.cpp's table, or a whole target (index 14)."""
    if isinstance(endpoint, str):
        sel, line = 14, endpoint.encode() + line
    else:
        sel = endpoint
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    return bytes([sel | (method << 4), clock | (auth << 2)]) + line + b"\n" + body


def rls_request(descriptors, hits_addend=0):
    """A RateLimitRequest for domain "edge" in protobuf's JSON mapping."""
    out = {"domain": "edge", "descriptors": [
        {"entries": [{"key": k, "value": v} for k, v in d]} for d in descriptors]}
    if hits_addend:
        out["hitsAddend"] = hits_addend
    return out


def http_seeds():
    admit_search = {"policy": "search", "key": "alice"}
    admit_gw = {"policy": "gateway", "tenant": "acme-team", "upstream": "llm", "route": "chat"}
    release = {"lease_id": "LEASE", "outcome": "success", "rtt_ms": 12.5}
    check = {"policy": "api-rate", "key": "alice"}
    admit_replicas = {"policy": "replicas", "exclude": ["db-1"]}
    singles = [
        http_request(7, {"policy": "replicas"}), http_request(7, admit_replicas),
        http_request(7, {"policy": "replicas", "exclude": "db-1"}),
        http_request(7, {"policy": "replicas", "exclude": [1, None]}),
        http_request(7, {"policy": "gateway", "attributes": {"tenant": "acme-team",
                                                             "upstream": "llm"}}),
        http_request(7, {"policy": "replicas", "attributes": {"exclude": ["db-1", "db-2"]}}),
        http_request(7, {"policy": "gateway", "tenant": "acme-team",
                         "attributes": {"tenant": "acme", "upstream": "llm"}}),
        http_request(7, {"policy": "search", "key": "k", "attributes": {"": "x", "a b": 1}}),
        http_request(7, {"policy": "search", "key": "k", "attributes": ["tenant"]}),
        http_request(8, {"lease_id": "LEASE", "outcome": "overload"}),
        http_request(8, {"lease_id": "LEASE", "outcome": "timeout", "rtt_ms": 3}),
        http_request(0), http_request(1), http_request(2), http_request(3),
        http_request(0, method=3), http_request(3, method=2),
        http_request(4, check), http_request(4, {"policy": "burst", "key": "k", "hits": 3}),
        http_request(4, {"policy": "api-rate", "key": "", "hits": 0}),
        http_request(4, {"policy": "nope", "key": "k"}), http_request(4, "not json"),
        http_request(4, "[1,2]"), http_request(5, check),
        http_request(6, {"checks": [check, {"policy": "burst", "key": "b", "hits": 2}]}),
        http_request(6, {"checks": "x"}), http_request(6, {"checks": [1]}),
        http_request(7, admit_search), http_request(7, admit_gw),
        http_request(7, {"policy": "gateway", "tenant": "acme", "upstream": "llm", "ttl_ms": 500}),
        http_request(7, {"policy": "gateway", "tenant": "nobody", "upstream": "llm"}),
        http_request(7, {"policy": "api-rate", "key": "k"}),
        http_request(7, {"policy": "search", "key": "k", "ttl_ms": -1}),
        http_request(8, release), http_request(8, {"lease_id": "nope"}),
        http_request(8, {"lease_id": "LEASE", "outcome": "bogus"}),
        http_request(9, {"lease_id": "LEASE", "ttl_ms": 30000}),
        http_request(11, {"policy": "api-rate", "key": "k", "hits": 500}),
        http_request(11, {"policy": "api-rate", "key": "k", "hits": -3}),
        http_request(11, {"policy": "api-rate", "key": "k", "hits": 0}),
        http_request(11, {"policy": "search", "key": "k", "hits": 1}),
        http_request(8, {"lease_id": "LEASE", "cost": 40}),
        http_request(10), http_request(10, auth=1), http_request(10, auth=2),
        http_request("/nowhere?x=1"), http_request("/v1/check?a=%zz", method=2),
        http_request(7, admit_search, line=b"?trace=1"),
        # The throttler (shard main): its checks in the Vitess and freno shapes, its admin verbs
        # and listings, and app names that are not app names.
        http_request("/throttler/check?app=gh-ost", method=1),
        http_request("/throttler/check-self?app=vreplication&p=low", method=3),
        http_request("/throttler/check?app=%FF", method=1),
        http_request("/throttler/check?app=a%0Ab&scope=shard&shard=main", method=1),
        http_request("/check/gh-ost/mysql/main", method=1),
        http_request("/check-read/%C0%AF/mysql/main/0.5", method=1),
        http_request("/check-if-exists/x/mysql/other", method=3),
        http_request("/throttler/throttle-app?app=gh-ost&duration=1h&ratio=0.5", method=1),
        http_request("/throttler/throttle-app?app=%FE", method=2),
        http_request("/throttle-app/gh-ost/ttl/30/ratio/1", method=1),
        http_request("/throttle-app/gh-ost/ratio/0?store_name=main", method=3),
        http_request("/unthrottle-app/gh-ost?store_name=other", method=1),
        http_request("/check/gh-ost/mysql/main?p=low", method=1),
        http_request("/throttled-apps", method=1), http_request("/recent-apps/5", method=1),
        http_request("/lb-check", method=3), http_request("/leader-check", method=1),
        http_request("/skip-host/self/ttl/5", method=1), http_request("/skipped-hosts", method=1),
        http_request("/recover-host/self", method=2),
        http_request("/throttler/app-rule?app=x&metrics=busy&thresholds=busy:0.5", method=1),
        http_request("/throttler/throttled-apps", method=1),
        http_request("/throttler/recent-apps", method=1),
        http_request("/throttler/status", method=1),
        http_request("/throttler/status?shard=%FF", method=3),
        # Envoy's rate limit service in envoyproxy/ratelimit's JSON form.
        http_request("/json", rls_request([[("user", "u")]])),
        http_request("/json", rls_request([[("path", "/api/x"), ("user", "u")], [("user", "u")],
                                           [("tenant", "t")], [("shadowed", "s")],
                                           [("quota", "q")]], hits_addend=2)),
        http_request("/json", {"domain": "edge", "descriptors": [
            {"entries": [{"key": "user", "value": "u"}],
             "limit": {"requestsPerUnit": 1, "unit": "SECOND"}, "hitsAddend": 0}]}),
        http_request("/json", {"domain": "", "descriptors": []}),
        http_request("/json", {"domain": "edge", "descriptors": [{"entries": []}]}),
        http_request("/json", {"domain": "unknown", "descriptors": [{"entries": [
            {"key": "k", "value": "v"}]}]}),
        http_request("/json", '{"domain": 5}'), http_request("/json", "[]"),
        http_request("/json", method=1),
        # Policies in shadow: allowed with would_deny past their limit.
        http_request(4, {"policy": "shadowed", "key": "k"}),
        http_request(7, {"policy": "shadowed-db", "key": "k"}),
    ]
    sequences = [
        # Admit, refuse, release, admit again.
        SEP.join([http_request(7, admit_search), http_request(7, admit_search),
                  http_request(7, admit_search), http_request(8, release),
                  http_request(7, admit_search, clock=2)]),
        # Gateway levels to their limits, then a heartbeat, expiry and a release of the expired.
        SEP.join([http_request(7, admit_gw)] * 3 + [
            http_request(9, {"lease_id": "LEASE"}), http_request(3, clock=3),
            http_request(8, release)]),
        # A cascade: a node fails twice (its breaker opens), the other fills, time passes.
        SEP.join([http_request(7, admit_replicas), http_request(8, {"lease_id": "LEASE",
                                                                    "outcome": "overload"}),
                  http_request(7, admit_replicas),
                  http_request(8, {"lease_id": "LEASE", "outcome": "failed"}),
                  http_request(7, {"policy": "replicas"}), http_request(7, {"policy": "replicas"}),
                  http_request(7, {"policy": "replicas"}), http_request(7, admit_replicas, clock=2),
                  http_request(0)]),
        # Shadow: a rate policy and an admit past their limits, released, time passing.
        SEP.join([http_request(4, {"policy": "shadowed", "key": "k"})] * 3 +
                 [http_request(7, {"policy": "shadowed-db", "key": "k"})] * 3 +
                 [http_request(8, release), http_request(6, {"checks": [
                     {"policy": "shadowed", "key": "k"}, {"policy": "api-rate", "key": "k"}]}),
                  http_request(3, clock=2)]),
        # Envoy's service: a limit reached, the window passing.
        SEP.join([http_request("/json", rls_request([[("user", "u")], [("tenant", "t")]]))] * 4 +
                 [http_request("/json", rls_request([[("user", "u")]]), clock=2),
                  http_request(0)]),
        # The throttler: apps checked, one throttled, unthrottled, the listings read.
        SEP.join([http_request("/throttler/check?app=a", method=1),
                  http_request("/throttler/throttle-app?app=a&duration=1s", method=1),
                  http_request("/check/a/mysql/main", method=1),
                  http_request("/throttler/unthrottle-app?app=a", method=1, clock=2),
                  http_request("/throttler/recent-apps", method=1), http_request(3),
                  http_request(0)]),
        # freno's verbs: an app throttled in every store, listed, then lifted by a ratio of 0.
        SEP.join([http_request("/check/b/mysql/main", method=1),
                  http_request("/throttle-app/b/ttl/1", method=1),
                  http_request("/throttled-apps", method=1), http_request("/recent-apps", method=1),
                  http_request("/throttle-app/b/ratio/0", method=1, clock=1),
                  http_request(3)]),
        # A rate policy spent, then its window passes.
        SEP.join([http_request(4, check)] * 4 + [http_request(4, check, clock=2)]),
        SEP.join([http_request(7, admit_gw), http_request(10), http_request(8, release),
                  http_request(0)]),
    ]
    return singles + sequences


# ---- grpc (protobuf wire format by hand) ----

def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_len(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def f_int(field, n):
    return varint(field << 3) + varint(n)


def duration(seconds=0, nanos=0):
    out = b""
    if seconds:
        out += f_int(1, seconds)
    if nanos:
        out += f_int(2, nanos)
    return out


def check_req(policy, key, hits=None):
    out = f_len(1, policy) + f_len(2, key)
    if hits is not None:
        out += f_int(3, hits)
    return out


def admit_req(policy, key="", tenant="", upstream="", route="", ttl=None, attributes=()):
    out = f_len(1, policy)
    for field, v in ((2, key), (3, tenant), (4, upstream), (5, route)):
        if v:
            out += f_len(field, v)
    if ttl is not None:
        out += f_len(6, duration(*ttl))
    for name, value in attributes:  # AdmitRequest.attributes (9): Attribute{name=1, value=2}
        out += f_len(9, f_len(1, name) + f_len(2, value))
    return out


def release_req(lease="LEASE", outcome=None, rtt=None, cost=None):
    out = f_len(1, lease)
    if outcome is not None:
        out += f_int(2, outcome)
    if rtt is not None:
        out += f_len(3, duration(*rtt))
    if cost is not None:
        out += f_int(4, cost)
    return out


def heartbeat_req(lease="LEASE", ttl=None):
    out = f_len(1, lease)
    if ttl is not None:
        out += f_len(2, duration(*ttl))
    return out


CHECK, PEEK, CHECK_MANY, ADMIT, RELEASE, HEARTBEAT, LIST, THROTTLER_CHECK, CHARGE = range(9)


def throttler_req(app="", shard="", scope="", low=False, threshold=None):
    out = b""
    for field, v in ((1, app), (2, shard), (3, scope)):
        if v:
            out += f_len(field, v)
    if low:
        out += f_int(4, 1)
    if threshold is not None:
        out += varint(5 << 3 | 1) + struct.pack("<d", threshold)
    return out


def record(call, msg, clock=0):
    return bytes([call | (clock << 4)]) + struct.pack("<H", len(msg)) + msg


def grpc_seeds():
    gw = admit_req("gateway", tenant="acme-team", upstream="llm", route="chat")
    singles = [
        record(CHECK, check_req("api-rate", "alice")),
        record(CHECK, check_req("burst", "k", 3)),
        record(CHECK, check_req("api-rate", "", 0)),
        record(CHECK, check_req("api-rate", "k", -1)),
        record(CHECK, check_req("nope", "k")),
        record(PEEK, check_req("api-rate", "alice")),
        record(CHECK_MANY, f_len(1, check_req("api-rate", "a")) + f_len(1, check_req("burst", "b", 2))),
        record(CHECK_MANY, b""),
        record(ADMIT, admit_req("search", key="alice")),
        record(ADMIT, admit_req("search", key="alice", ttl=(5, 0))),
        record(ADMIT, admit_req("search", key="alice", ttl=(-1, 0))),
        record(ADMIT, admit_req("search", key="alice", ttl=(1 << 62, 0))),
        record(ADMIT, gw),
        record(ADMIT, admit_req("gateway", tenant="nobody", upstream="llm")),
        record(ADMIT, admit_req("api-rate", key="k")),
        record(ADMIT, admit_req("gateway", attributes=[("tenant", "acme-team"),
                                                       ("upstream", "llm")])),
        record(ADMIT, admit_req("gateway", tenant="acme-team",
                                attributes=[("tenant", "x"), ("upstream", "llm")])),
        record(ADMIT, admit_req("replicas", attributes=[("exclude", "db-1"), ("exclude", "")])),
        record(ADMIT, admit_req("search", key="k", attributes=[("", "v"), ("n" * 70, "v")])),
        record(CHARGE, check_req("api-rate", "alice", 500)),
        record(CHARGE, check_req("api-rate", "alice", -2)),
        record(CHARGE, check_req("api-rate", "alice", 0)),
        record(CHARGE, check_req("search", "alice", 1)),
        record(RELEASE, release_req("nope")),
        record(RELEASE, release_req(outcome=99)),
        record(HEARTBEAT, heartbeat_req("nope", (1, 0))),
        record(LIST, b""),
        record(THROTTLER_CHECK, throttler_req("gh-ost")),
        record(THROTTLER_CHECK, throttler_req("a:b:c", "main", "self", True, 0.5)),
        record(THROTTLER_CHECK, throttler_req("x", "nowhere")),
        record(THROTTLER_CHECK, throttler_req("x", scope="sideways")),
        record(THROTTLER_CHECK, throttler_req("x", threshold=-1.0)),
        record(THROTTLER_CHECK, f_int(1, 5)),  # app with the wrong wire type
        record(THROTTLER_CHECK, b"\xff\xff"),
    ]
    sequences = [
        record(ADMIT, admit_req("search", key="alice")) * 3
        + record(RELEASE, release_req(outcome=2, rtt=(0, 5_000_000)))
        + record(ADMIT, admit_req("search", key="alice"), clock=2) + record(LIST, b""),
        record(ADMIT, gw) * 3 + record(HEARTBEAT, heartbeat_req(ttl=(30, 0)))
        + record(LIST, b"", clock=3) + record(RELEASE, release_req()),
        record(CHECK, check_req("api-rate", "k")) * 4 + record(CHECK, check_req("api-rate", "k"), clock=2),
        record(ADMIT, admit_req("search", key="b")) + record(RELEASE, release_req(outcome=4))
        + record(RELEASE, release_req()),
        record(ADMIT, admit_req("search", key="c")) + record(RELEASE, release_req(cost=70))
        + record(CHECK, check_req("api-rate", "c")),
    ]
    return singles + sequences


# ---- problem_json ----

def problem_seeds():
    rng = random.Random(20261124)
    seeds = [b"", b"\x00" * 64, b"\xff" * 64]
    for n in (16, 48, 96, 160, 256):
        for _ in range(5):
            seeds.append(bytes(rng.randrange(256) for _ in range(n)))
    # Readable text in the string fields (ConsumeRandomLengthString ends a string at "\\"
    # followed by another byte than "\\").
    for words in (["urn:sluice:problem:x", "Too Many", "api-rate", "llm", "llm.internal", "acme"],
                  ["type", "title", "", "", "", "", "chat"], ["\u00e9t\u00e9", "\u2603", "\U0001f600"]):
        seeds.append(("\\x".join(words)).encode() + bytes(range(64)))
    return seeds


if __name__ == "__main__":
    write("config", config_seeds())
    write("http", http_seeds())
    write("grpc", grpc_seeds())
    write("problem_json", problem_seeds())
