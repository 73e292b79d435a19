"""`sluice top` in a pseudo-terminal of 80 x 24, its screen read by a terminal emulator (pyte,
Debian's python3-pyte), against a real `sluice serve` on the default config: every policy on
a line of its own, in-flight and refusals moving as leases are taken, the sort and filter keys,
q and Ctrl-C leaving with the terminal as it was (cooked mode, the main screen, the cursor
shown); off a terminal, one plain frame (or JSON) and the exit code.

SLUICE_BIN names the binary (default: the test-default build of this checkout).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
import urllib.request
from pathlib import Path
from typing import List

import pyte
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("SLUICE_BIN") or str(REPO / "build" / "test-default" / "apps" / "sluice" / "sluice")
COLS, ROWS = 80, 24


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def default_policy_names() -> List[str]:
    names, inside = [], False
    for line in (REPO / "config" / "default.yaml").read_text().splitlines():
        if re.match(r"^\S", line):
            inside = line.startswith("policies:")
        m = inside and re.match(r"^  ([A-Za-z0-9_.-]+):\s*$", line)
        if m:
            names.append(m.group(1))
    return names


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    grpc, http = free_port(), free_port()
    log = open(tmp_path_factory.mktemp("top") / "server.log", "wb")
    proc = subprocess.Popen([BIN, "serve", "--grpc", f"127.0.0.1:{grpc}", "--http",
                             f"127.0.0.1:{http}"], stdout=log, stderr=subprocess.STDOUT)

    def healthy():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    wait_until(healthy, 15, "the server")
    yield {"grpc": f"127.0.0.1:{grpc}", "http": f"http://127.0.0.1:{http}"}
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    log.close()


def post(server, path: str, body: dict) -> dict:
    req = urllib.request.Request(server["http"] + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"status": e.code, **json.loads(e.read() or b"{}")}


class Top:
    """`sluice top` on a pseudo-terminal it has as its controlling terminal (so that Ctrl-C
    typed there is a SIGINT, as in a shell), the screen kept by a terminal emulator."""

    def __init__(self, *args: str):
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        self.cooked = termios.tcgetattr(self.slave)
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.lock = threading.Lock()
        slave = self.slave

        def controlling_terminal():
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([BIN, "top", *args], stdin=slave, stdout=slave,
                                     stderr=slave, preexec_fn=controlling_terminal,
                                     env={**os.environ, "TERM": "xterm"})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            r, _, _ = select.select([self.master], [], [], 0.1)
            if not r:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.raw += data
                self.stream.feed(data)

    def lines(self) -> List[str]:
        with self.lock:
            return [line.rstrip() for line in self.screen.display]

    def text(self) -> str:
        return "\n".join(self.lines())

    def row(self, policy: str) -> str:
        return next((line for line in self.lines() if line.split(" ")[0] == policy), "")

    def wait_for(self, predicate, what: str, timeout: float = 10):
        try:
            return wait_until(lambda: predicate(self), timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}; the screen:\n{self.text()}") from None

    def type(self, keys: bytes):
        os.write(self.master, keys)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.reader.join(2)
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.fixture
def top(server):
    made = []

    def start(*args):
        t = Top("--server", server["grpc"], "--interval", "0.2", *args)
        made.append(t)
        return t

    yield start
    for t in made:
        t.close()


def restored(t: Top) -> None:
    """The terminal as top found it: cooked mode (echo, canonical input) on the pty, the main
    screen back and the cursor shown."""
    attrs = termios.tcgetattr(t.slave)
    assert attrs[3] & termios.ECHO and attrs[3] & termios.ICANON, "the pty was left in raw mode"
    assert attrs[3] == t.cooked[3]
    # top has exited, but its last bytes may still be on their way through the pty to the reader
    # thread: wait for them a little.
    deadline = time.monotonic() + 3
    while True:
        with t.lock:
            tail = bytes(t.raw[-64:])
        if (b"\x1b[?1049l" in tail and b"\x1b[?25h" in tail) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert b"\x1b[?1049l" in tail, f"the alternate screen was not left: {tail!r}"
    assert b"\x1b[?25h" in tail, f"the cursor was not shown again: {tail!r}"


def test_every_policy_on_its_own_line_within_80_columns(top):
    t = top()
    names = default_policy_names()
    assert len(names) >= 5
    t.wait_for(lambda t: all(t.row(n) for n in names), "a line per policy")
    assert re.search(rf"{len(names)} of {len(names)} policies\s+sort: name", t.text())
    shown = [line.split(" ")[0] for line in t.lines() if line.split(" ")[0] in names]
    assert shown == sorted(names), shown  # by name, each once
    with t.lock:
        raw = bytes(t.raw)
    # No line written wider than the terminal (pyte would wrap it onto the next row): the
    # text between two line ends or screen controls (a frame starts with "home").
    pieces = re.split(rb"\r\n|\x1b\[[0-9;?]*[A-Za-z]", raw)
    assert max(len(p) for p in pieces) <= COLS, max(pieces, key=len)
    # The kind's own column: a fleet's phase and L_global, the throttler's metric.
    assert re.search(r"active L\d+ n1 s\d+", t.row("inventory")), t.row("inventory")
    assert re.search(r"load [0-9.]+/32", t.row("db")), t.row("db")
    t.type(b"q")
    assert t.proc.wait(5) == 0
    restored(t)


def test_in_flight_and_refusals_move_and_sort_and_filter_keys_work(server, top):
    t = top()
    t.wait_for(lambda t: re.search(r"\b0/10\b", t.row("small")), "small at 0/10")
    leases = [post(server, "/v1/admit", {"policy": "small", "key": "top"}) for _ in range(10)]
    assert all(x.get("admitted") for x in leases), leases
    t.wait_for(lambda t: re.search(r"\b10/10\b", t.row("small")), "small at 10/10")
    # Refused past the limit: a refusal rate, the reason "limit", while they keep coming.
    stop = threading.Event()

    def refuse():
        while not stop.is_set():
            post(server, "/v1/admit", {"policy": "small", "key": "top"})
            time.sleep(0.01)

    refusing = threading.Thread(target=refuse)
    refusing.start()
    try:
        t.wait_for(lambda t: re.search(r"10/10\s+[0-9.]+\s+[0-9.]+ limit", t.row("small")),
                   "refusals of small by its limit")
        # By refusals: small first. By name: api-rate first again. By utilisation: small too.
        first = lambda t: next((line.split(" ")[0] for line in t.lines()[3:] if line), "")
        t.type(b"f")
        t.wait_for(lambda t: first(t) == "small" and "sort: refused" in t.text(), "sort by refusals")
        t.type(b"n")
        t.wait_for(lambda t: first(t) == "api-rate" and "sort: name" in t.text(), "sort by name")
        t.type(b"u")
        t.wait_for(lambda t: first(t) == "small" and "sort: util" in t.text(), "sort by util")
    finally:
        stop.set()
        refusing.join()
    # The filter: '/' then text then Enter; Esc clears it.
    t.type(b"/inv")
    t.wait_for(lambda t: "filter: inv_" in t.text(), "the filter prompt")
    t.type(b"\r")
    t.wait_for(lambda t: "1 of 8 policies" in t.text() and t.row("inventory") and not t.row("small"),
               "only inventory")
    t.type(b"\x1b")
    t.wait_for(lambda t: "8 of 8 policies" in t.text(), "the filter cleared")
    for x in leases:
        assert post(server, "/v1/release", {"lease_id": x["lease_id"]})["released"]
    t.wait_for(lambda t: re.search(r"\b0/10\b", t.row("small")), "small back to 0/10")
    t.type(b"q")
    assert t.proc.wait(5) == 0
    restored(t)


def test_ctrl_c_quits_cleanly(top):
    t = top()
    t.wait_for(lambda t: t.row("small"), "the first frame")
    t.type(b"\x03")  # the terminal makes it a SIGINT
    assert t.proc.wait(5) == 0
    restored(t)


def test_a_server_that_does_not_answer_is_shown_and_top_keeps_going(top):
    t = Top("--server", f"127.0.0.1:{free_port()}", "--interval", "0.2", "--timeout", "0.3")
    try:
        t.wait_for(lambda t: "not answering" in t.lines()[0], "the server's silence said")
        time.sleep(0.5)
        assert t.proc.poll() is None
        t.type(b"q")
        assert t.proc.wait(5) == 0
        restored(t)
    finally:
        t.close()


def test_off_a_terminal_one_frame_or_json(server):
    r = subprocess.run([BIN, "top", "--server", server["grpc"], "--interval", "0.2"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    names = default_policy_names()
    assert all(re.search(rf"^{re.escape(n)}\s", r.stdout, re.M) for n in names), r.stdout
    r = subprocess.run([BIN, "top", "--server", server["grpc"], "--once", "--json", "--filter",
                        "inventory"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert [p["name"] for p in body["policies"]] == ["inventory"]
    assert body["policies"][0]["kind"] == "fleet"
    r = subprocess.run([BIN, "top", "--server", f"127.0.0.1:{free_port()}", "--once",
                        "--timeout", "0.3"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 2 and "not answering" in r.stderr, (r.returncode, r.stderr)
    r = subprocess.run([BIN, "top", "--sort", "fastest"], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode != 0 and "must be name, kind, util, rate or refused" in r.stderr
