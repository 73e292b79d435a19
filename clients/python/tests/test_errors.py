"""Bad input: each error is the right SluiceError subclass, carries the gRPC code, and its message
names the field at fault."""

import os
import secrets

import grpc
import pytest

from sluice_client import FailedPrecondition, InvalidArgument, NotFound, SluiceError


def raises(exc_type, field, call, *args, **kwargs):
    with pytest.raises(exc_type) as info:
        call(*args, **kwargs)
    err = info.value
    assert isinstance(err, SluiceError)
    assert err.code == exc_type.code
    assert err.field == field, err.message
    assert err.message.startswith(field + ": ")
    return err


def test_unknown_policy_is_not_found(client):
    err = raises(NotFound, "policy", client.check, "no-such-policy", "k")
    assert "no-such-policy" in err.message
    raises(NotFound, "policy", client.peek, "no-such-policy", "k")
    raises(NotFound, "policy", client.admit, "no-such-policy")
    assert err.code == grpc.StatusCode.NOT_FOUND


def test_empty_key_is_invalid(client):
    raises(InvalidArgument, "key", client.check, "api-rate", "")
    raises(InvalidArgument, "key", client.peek, "api-rate", "")


@pytest.mark.parametrize("hits", [0, -1])
def test_hits_below_one_are_invalid(client, key, hits):
    err = raises(InvalidArgument, "hits", client.check, "api-rate", key(), hits=hits)
    assert str(hits) in err.message
    raises(InvalidArgument, "hits", client.peek, "api-rate", key(), hits=hits)


def test_oversized_key_is_invalid(client):
    err = raises(InvalidArgument, "key", client.check, "api-rate", "x" * 2000)
    assert "2000" in err.message and "1024" in err.message
    assert client.check("api-rate", "y" * 1024).allowed  # the limit itself is fine


def test_unknown_lease_is_not_found(client):
    unknown = secrets.token_hex(16)
    raises(NotFound, "lease_id", client.release, unknown)
    raises(NotFound, "lease_id", client.heartbeat, unknown)


@pytest.mark.parametrize("lease_id", ["", "nope", "g" * 32, "a" * 31, "a" * 33, "A" * 32])
def test_malformed_lease_id_is_invalid(client, lease_id):
    raises(InvalidArgument, "lease_id", client.release, lease_id)
    raises(InvalidArgument, "lease_id", client.heartbeat, lease_id)


def test_wrong_family_is_failed_precondition(client):
    err = raises(FailedPrecondition, "policy", client.check, "small", "k")
    assert "small" in err.message
    raises(FailedPrecondition, "policy", client.peek, "gateway", "k")
    raises(FailedPrecondition, "policy", client.admit, "api-rate", key="k")
    assert client.policies()["small"].in_flight == 0


def test_second_release_is_not_found(client):
    lease = client.admit("small")
    client.release(lease)
    raises(NotFound, "lease_id", client.release, lease)
    raises(NotFound, "lease_id", client.heartbeat, lease)


def test_check_many_errors_name_the_check(client, key):
    raises(InvalidArgument, "checks[1].hits", client.check_many,
           [("api-rate", key()), ("api-rate", key(), 0)])
    raises(NotFound, "checks[0].policy", client.check_many, [("nope", key())])
    raises(InvalidArgument, "checks", client.check_many, [])
    raises(InvalidArgument, "checks", client.check_many, [("api-rate", key())] * 129)
    # An error debits nothing, not even the valid checks before it.
    k = key()
    raises(InvalidArgument, "checks[1].key", client.check_many,
           [("per-minute", k, 100), ("per-minute", "")])
    assert client.peek("per-minute", k).remaining == 999


def test_admit_argument_errors(client):
    raises(InvalidArgument, "ttl", client.admit, "small", ttl=-1)
    raises(InvalidArgument, "ttl", client.admit, "small", ttl=0)
    raises(InvalidArgument, "ttl", client.admit, "small", ttl=3600)  # max_lease_ttl: 10m
    raises(InvalidArgument, "key", client.admit, "search")  # chains api-rate, keyed by key
    raises(InvalidArgument, "tenant", client.admit, "gateway", upstream="llm")
    raises(InvalidArgument, "upstream", client.admit, "gateway", tenant="acme")
    with pytest.raises(NotFound):
        client.admit("gateway", tenant="nobody", upstream="llm")
    # The same fields as attributes, checked the same way by the kind that reads them.
    raises(InvalidArgument, "tenant", client.admit, "gateway", attributes={"upstream": "llm"})
    raises(InvalidArgument, "tenant", client.admit, "gateway",
           attributes={"tenant": ["acme", "globex"], "upstream": "llm"})
    raises(InvalidArgument, "attributes", client.admit, "gateway",
           attributes={"not a name": "x"})
    with pytest.raises(TypeError):
        client.admit("gateway", attributes={"tenant": 3})
    ps = client.policies()
    assert ps.leases == 0
    assert ps["small"].in_flight == 0 and ps["gateway"].in_flight == 0


def test_heartbeat_and_release_argument_errors(client):
    lease = client.admit("small", ttl=5)
    raises(InvalidArgument, "ttl", client.heartbeat, lease, ttl=0)
    raises(InvalidArgument, "ttl", client.heartbeat, lease, ttl=3600)
    raises(InvalidArgument, "rtt", client.release, lease, rtt=-0.5)
    client.release(lease)  # the bad calls left it alone


def test_unknown_outcome_on_the_wire_is_invalid_and_keeps_the_lease(server, client):
    """An Outcome value this server does not know is refused, not taken as a success."""
    from sluice.v1 import sluice_pb2, sluice_pb2_grpc

    lease = client.admit("small", ttl=5)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = sluice_pb2_grpc.SluiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Release(sluice_pb2.ReleaseRequest(lease_id=lease.lease_id, outcome=7), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("outcome: "), info.value.details()
    client.release(lease)  # still held: the bad call released nothing


@pytest.mark.parametrize("flag", ["http", "grpc"])
@pytest.mark.parametrize("address", ["127.0.0.1:70000", "127.0.0.1:80x", "127.0.0.1", "host:80",
                                     "0.0.0.0:99999"])
def test_bad_address_stops_the_server_with_a_clear_error(tmp_path, address, flag):
    import subprocess

    from conftest import free_port, sluice_bin

    ports = {"grpc": f"127.0.0.1:{free_port()}", "http": f"127.0.0.1:{free_port()}"}
    ports[flag] = address  # out of range: an error, never wrapped to another port
    proc = subprocess.run([sluice_bin(), "serve", "--grpc", ports["grpc"], "--http", ports["http"]],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 1, proc.stderr
    assert f"{flag} address" in proc.stderr, proc.stderr
    assert address in proc.stderr or "host" in proc.stderr, proc.stderr


def test_client_side_checks():
    import sluice_client

    c = sluice_client.Client("127.0.0.1:1")  # never contacted
    try:
        with pytest.raises(ValueError):
            c.release("0" * 32, outcome="crashed")
        with pytest.raises(TypeError):
            c.check("api-rate", "k", hits=1.5)
        with pytest.raises(ValueError):
            c.check_many([("api-rate",)])
        with pytest.raises(ValueError):
            c.admit("small", ttl=float("inf"))
    finally:
        c.close()


def test_unreachable_server_is_unavailable():
    import socket

    import sluice_client

    with socket.socket() as s:  # nobody listens on a port we hold without listen()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with sluice_client.Client(f"127.0.0.1:{port}", timeout=1.0) as c:
            with pytest.raises(sluice_client.Unavailable) as info:
                c.check("api-rate", "k")
            assert info.value.code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("method,raw,message", [
    # field 1 (policy) "api-rate", field 2 (key) two bytes that are not UTF-8
    ("Check", b"\x0a\x08api-rate\x12\x02\xff\xfe", "key: not valid UTF-8"),
    ("Admit", b"\x0a\x05small\x12\x01\xc3", "key: not valid UTF-8"),
    ("Release", b"\x0a\x02\xff\xff", "lease_id: not valid UTF-8"),
    ("Charge", b"\x0a\x08api-rate\x12\x02\xff\xfe\x18\x05", "key: not valid UTF-8"),
    ("CheckMany", b"\x0a\x04\x12\x02\xff\xfe", "checks[0].key: not valid UTF-8"),
    # the first entry fine ("abc"), the second not
    ("CheckMany", b"\x0a\x05\x12\x03abc\x0a\x04\x12\x02\xff\xfe",
     "checks[1].key: not valid UTF-8"),
    ("Check", b"\xff\xff\xff", "request: cannot be decoded as sluice.v1.CheckRequest"),
    ("Heartbeat", b"\x0a", "request: cannot be decoded as sluice.v1.HeartbeatRequest"),
])
def test_an_undecodable_request_is_invalid_argument_naming_the_field(server, method, raw,
                                                                     message):
    import grpc

    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.unary_unary(f"/sluice.v1.Sluice/{method}",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as info:
            call(raw, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert info.value.details() == message
    assert server.client().check("api-rate", "still-serving").allowed
    assert "invalid UTF-8" not in server.log()  # the client's error, not the log's


def test_a_cli_server_address_with_a_port_out_of_range_is_refused():
    """--server 127.0.0.1:99999 used to wrap to another port (99999 - 65536 = 34463)."""
    import subprocess

    from conftest import sluice_bin

    for bad in ("127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", "127.0.0.1:7070x"):
        r = subprocess.run([sluice_bin(), "check", "api-rate", "k", "--server", bad],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0, (bad, r.stdout)
        assert f"must be host:port with a port in 1..65535, not '{bad}'" in r.stderr, r.stderr
    # $SLUICE_SERVER, which stands for --server, is checked alike, naming it.
    env = dict(os.environ, SLUICE_SERVER="127.0.0.1:99999")
    r = subprocess.run([sluice_bin(), "check", "api-rate", "k"], capture_output=True, text=True,
                       timeout=30, env=env)
    assert r.returncode != 0, r.stdout
    assert "SLUICE_SERVER: must be host:port with a port in 1..65535, not '127.0.0.1:99999'" \
        in r.stderr, r.stderr
