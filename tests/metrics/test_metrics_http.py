"""A real fusebox-server's /metrics port, sent every kind of request over real TCP.

Each test starts `fusebox-server --backend=cpu` with --metrics_address on
loopback, sends raw bytes to the metrics port (other paths, other methods,
HEAD, garbage, a 64 KiB header, a request in 1-byte writes, random bytes,
clients that vanish mid-request, hundreds of idle connections) and checks the
status code of each answer, then that the server is still alive: the process
runs, a Gelu call over gRPC succeeds and GET /metrics answers 200; at the end
SIGTERM must stop it with exit status 0. Run by ctest
(tests/metrics/CMakeLists.txt) with FUSEBOX_SERVER and FUSEBOX_PYTHON_PATH.
"""
import os
import random
import re
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

SOURCE_DIR = os.environ.get(
    "FUSEBOX_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SERVER = os.environ.get("FUSEBOX_SERVER", os.path.join(SOURCE_DIR, "build/server/fusebox-server"))
PYTHON_PATH = os.environ.get("FUSEBOX_PYTHON_PATH", os.path.join(SOURCE_DIR, "build/python"))

sys.path.insert(0, PYTHON_PATH)
import grpc  # noqa: E402
from fusebox.v1 import kernel_service_pb2 as pb  # noqa: E402
from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc  # noqa: E402

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GET_METRICS = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ipv6_loopback_works():
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


class Reply:
    def __init__(self, raw):
        self.raw = raw
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        m = re.match(r"HTTP/1\.[01] (\d{3}) ", lines[0] + " ")
        self.status = int(m.group(1)) if m else None
        self.headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()

    def __repr__(self):
        return f"Reply({self.raw[:300]!r})"


def connect(port, host="127.0.0.1", timeout=5.0):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect((host, port))
    return s


def read_all(s):
    chunks = []
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    except ConnectionResetError:  # what came before the reset still counts
        pass
    return b"".join(chunks)


def exchange(port, request, host="127.0.0.1", timeout=5.0, half_close=False):
    """Sends `request`, returns everything the server sends until it closes."""
    with connect(port, host, timeout) as s:
        try:
            s.sendall(request)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer before it has read everything
        return Reply(read_all(s))


class Server:
    def __init__(self, metrics_address=None):
        self.log = tempfile.TemporaryFile(mode="w+")
        if metrics_address is None:
            metrics_address = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [SERVER, "--backend=cpu", "--address=127.0.0.1:0",
             f"--metrics_address={metrics_address}", "--workers=1", "--cpu_threads=1",
             "--drain_seconds=1"],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        deadline = time.monotonic() + 30
        self.line = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                self.line = self.proc.stdout.readline()
                break
        m = re.search(r"listening on (\S+:\d+) ", self.line)
        if not m:
            self.stop()
            raise AssertionError(f"fusebox-server did not start: {self.line!r}\n{self.logs()}")
        self.address = m.group(1)
        m = re.search(r" metrics=(\S+):(\d+)", self.line)
        if m:
            self.metrics_host, self.metrics_port = m.group(1).strip("[]"), int(m.group(2))
        else:  # a server that does not say: the port asked for
            host, _, port = metrics_address.rpartition(":")
            self.metrics_host, self.metrics_port = host.strip("[]"), int(port)
        self.channel = grpc.insecure_channel(self.address)

    def logs(self):
        self.log.seek(0)
        return self.log.read()[-4000:]

    def assert_alive(self):
        assert self.proc.poll() is None, \
            f"fusebox-server died (exit status {self.proc.returncode})\n{self.logs()}"
        x = pb.Tensor(dtype=pb.FLOAT32, shape=[4], data=struct.pack("<4f", -1, 0, 1, 2))
        reply = pb_grpc.KernelServiceStub(self.channel).Gelu(
            pb.GeluRequest(input=pb.TensorRef(tensor=x)), timeout=10)
        assert list(reply.output.tensor.shape) == [4]
        r = exchange(self.metrics_port, GET_METRICS, self.metrics_host)
        assert r.status == 200, r
        assert b"\nfusebox_calls_total{" in r.body

    def stop(self):
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc.stdout.close()
        return self.proc.returncode


@pytest.fixture
def server():
    assert os.access(SERVER, os.X_OK), f"missing fusebox-server (build it): {SERVER}"
    s = Server()
    try:
        yield s
    finally:
        rc = s.stop()
        logs = s.logs()
        s.log.close()
    assert rc == 0, f"fusebox-server exited with status {rc}\n{logs}"


BAD_REQUESTS = [
    ("GET /", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", {404}),
    ("GET /favicon.ico", b"GET /favicon.ico HTTP/1.1\r\nHost: x\r\n\r\n", {404}),
    ("GET /metrics/", b"GET /metrics/ HTTP/1.0\r\n\r\n", {404}),
    ("POST /metrics", b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
     {405}),
    ("PUT /metrics", b"PUT /metrics HTTP/1.1\r\nHost: x\r\n\r\n", {405}),
    ("HEAD /x", b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n", {404}),
    ("OPTIONS *", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", {404}),
    ("garbage request line", b"\x00\xffgarbage garbage garbage\r\n\r\n", {400}),
    ("no version", b"GET /metrics\r\n\r\n", {400}),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", {400}),
    ("TLS client hello", bytes.fromhex("160301020001") + os.urandom(64), {400}),
    ("header without colon", b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n", {400}),
    ("64 KiB header",
     b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 10) + b"\r\n\r\n",
     {431, 400}),
    ("64 KiB request line", b"GET /" + b"m" * (64 << 10) + b" HTTP/1.1\r\n\r\n", {431, 400}),
]


@pytest.mark.parametrize("name,request_bytes,statuses", BAD_REQUESTS,
                         ids=[c[0] for c in BAD_REQUESTS])
def test_other_requests_get_an_error_and_the_server_survives(server, name, request_bytes,
                                                             statuses):
    r = exchange(server.metrics_port, request_bytes)
    assert r.status in statuses, f"{name}: {r}"
    if r.status == 405:
        assert r.headers.get("allow") == "GET, HEAD", r.headers
    if request_bytes.startswith(b"HEAD"):
        assert r.body == b"", r
    server.assert_alive()


def test_get_metrics_is_200_in_the_text_format(server):
    r = exchange(server.metrics_port, GET_METRICS)
    assert r.status == 200, r
    assert r.headers.get("content-type") == METRICS_TYPE, r.headers
    assert int(r.headers["content-length"]) == len(r.body)
    assert r.body.startswith(b"# HELP fusebox_") and r.body.endswith(b"\n")
    assert b"\nfusebox_calls_total{" in r.body
    server.assert_alive()


def test_head_metrics_is_200_with_the_length_and_no_body(server):
    get = exchange(server.metrics_port, GET_METRICS)
    head = exchange(server.metrics_port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.status == 200, head
    assert head.headers.get("content-type") == METRICS_TYPE
    assert head.body == b""
    # The page changes between two scrapes only in its numbers: about the same length.
    assert abs(int(head.headers["content-length"]) - len(get.body)) < 1000
    server.assert_alive()


def test_every_bad_request_in_a_row_then_a_scrape(server):
    for name, request_bytes, statuses in BAD_REQUESTS:
        r = exchange(server.metrics_port, request_bytes)
        assert r.status in statuses, f"{name}: {r}"
    server.assert_alive()


def test_a_request_in_one_byte_writes_is_served(server):
    with connect(server.metrics_port) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(GET_METRICS)):
            s.sendall(GET_METRICS[i:i + 1])
            time.sleep(0.002)
        r = Reply(read_all(s))
    assert r.status == 200, r
    assert b"\nfusebox_calls_total{" in r.body
    server.assert_alive()


def test_random_bytes_and_vanishing_clients_do_not_hurt(server):
    rng = random.Random(1234)
    for i in range(40):
        blob = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 3000)))
        if i % 2:
            blob = b"GET /metrics HTTP/1.1\r\n" + blob
        r = exchange(server.metrics_port, blob, half_close=True)
        assert r.raw == b"" or r.status in (200, 400, 431), r
    for i in range(20):  # gone mid-request, with a reset
        s = connect(server.metrics_port)
        s.sendall(GET_METRICS[:rng.randint(1, len(GET_METRICS) - 1)])
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    for i in range(20):  # gone right after the request, the reply unread
        s = connect(server.metrics_port)
        s.sendall(GET_METRICS)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    server.assert_alive()


def test_300_idle_connections_do_not_stall_a_scrape(server):
    idle = []
    try:
        for i in range(300):
            s = connect(server.metrics_port)
            if i % 3 == 0:
                s.sendall(b"GET /metr")  # and some stalled mid-request
            idle.append(s)
        time.sleep(0.2)
        t0 = time.monotonic()
        r = exchange(server.metrics_port, GET_METRICS, timeout=3)
        took = time.monotonic() - t0
        assert r.status == 200, r
        assert took < 2, f"the scrape took {took:.1f} s behind 300 idle connections"
        server.assert_alive()
    finally:
        for s in idle:
            s.close()


def test_slow_request_head_gets_408_after_the_deadline(server):
    with connect(server.metrics_port, timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        t0 = time.monotonic()
        r = Reply(read_all(s))
        took = time.monotonic() - t0
    assert r.status == 408, r
    assert 3 < took < 8, took
    server.assert_alive()


def test_metrics_port_0_is_chosen_and_printed():
    s = Server("127.0.0.1:0")
    try:
        assert re.search(r" metrics=127\.0\.0\.1:\d+$", s.line.strip()), s.line
        assert s.metrics_port > 0
        s.assert_alive()
    finally:
        rc = s.stop()
        s.log.close()
    assert rc == 0


@pytest.mark.skipif(not ipv6_loopback_works(), reason="no IPv6 loopback here")
def test_ipv6_loopback_with_a_chosen_port():
    s = Server("[::1]:0")
    try:
        assert re.search(r" metrics=\[::1\]:\d+$", s.line.strip()), s.line
        assert s.metrics_host == "::1"
        s.assert_alive()
        assert exchange(s.metrics_port, b"GET / HTTP/1.1\r\n\r\n", "::1").status == 404
        s.assert_alive()
    finally:
        rc = s.stop()
        s.log.close()
    assert rc == 0
