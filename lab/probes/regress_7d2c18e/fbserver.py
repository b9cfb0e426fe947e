"""Shared helpers for the issue-30 reproduction scripts in this folder: start a fusebox-server
binary (any commit: only flags that 7d2c18e also knows unless a script adds newer ones), the
generated stubs from a build's python/ folder, raw HTTP/2 and proxy helpers.

Each script takes the server binary as its first argument (default: $FUSEBOX_SERVER_BIN) and
exits 0 when the finding's behaviour is fixed (PASS), 1 when it reproduces (FAIL), 2 when the
probe itself could not run. PYTHONPATH must hold a build's python/ (the fusebox.v1 stubs).
"""
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
import grpc  # noqa: E402
from fusebox.v1 import kernel_service_pb2 as pb  # noqa: E402
from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc  # noqa: E402

DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]
BIG = [("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)]


def server_bin():
    b = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FUSEBOX_SERVER_BIN", "")
    if not b or not os.access(b, os.X_OK):
        print(f"usage: {sys.argv[0]} FUSEBOX_SERVER_BIN", file=sys.stderr)
        sys.exit(2)
    return b


def verdict(ok, why):
    print(("PASS: " if ok else "FAIL: ") + why, flush=True)
    sys.exit(0 if ok else 1)


class Server:
    def __init__(self, binary, *flags, limits=(), stderr=None):
        prefix = DIE_WITH_PARENT + (["prlimit", *limits, "--"] if limits else [])
        self.stderr_file = stderr if stderr is not None else tempfile.TemporaryFile()
        self.proc = subprocess.Popen(prefix + [binary, "--address=127.0.0.1:0", "--backend=cpu",
                                               *flags],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     stderr=self.stderr_file)
        line = b""
        if select.select([self.proc.stdout], [], [], 30)[0]:
            line = self.proc.stdout.readline()
        self.first_line = line.decode(errors="replace")
        m = re.search(r"listening on (\S+):(\d+)", self.first_line)
        if not m:
            self.kill()
            raise RuntimeError(f"server did not start: {self.first_line!r} {self.stderr_text()}")
        self.port = int(m.group(2))
        self.address = f"127.0.0.1:{self.port}"
        m = re.search(r" metrics=(\S+):(\d+)", self.first_line)
        self.metrics_port = int(m.group(2)) if m else None
        threading.Thread(target=lambda: self.proc.stdout.read(), daemon=True).start()

    def stderr_text(self):
        try:
            self.stderr_file.seek(0)
            return self.stderr_file.read().decode(errors="replace")
        except Exception:
            return ""

    def alive(self):
        return self.proc.poll() is None

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stub(address, options=()):
    ch = grpc.insecure_channel(address, options=list(BIG) + list(options))
    return ch, pb_grpc.KernelServiceStub(ch)


def md(token):
    return [("authorization", f"Bearer {token}")] if token else []


def f32(n, value=0.5):
    import struct
    return pb.Tensor(dtype=pb.FLOAT32, shape=[n], data=struct.pack("<f", value) * n)


def gelu_ok(address, token=None):
    """One small Gelu call: True if it answers correctly."""
    ch, s = stub(address)
    try:
        r = s.Gelu(pb.GeluRequest(input=pb.TensorRef(tensor=f32(4))), timeout=10,
                   metadata=md(token))
        return list(r.output.tensor.shape) == [4]
    except grpc.RpcError:
        return False
    finally:
        ch.close()


def token_file(tenants):
    """A token file with `token tenant` lines, e.g. {"secret-a": "alice"}; returns its path."""
    fd, path = tempfile.mkstemp(suffix=".tokens")
    with os.fdopen(fd, "w") as f:
        for tok, ten in tenants.items():
            f.write(f"{tok} {ten}\n")
    return path


def closed_by_server(sock):
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def idle_connections(port, n, timeout=5):
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        except OSError:
            pass
    return socks


def h2_connect(port, timeout=None):
    import h2.config
    import h2.connection
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    return sock, conn


def grpc_headers(path, token=None):
    h = [(":method", "POST"), (":scheme", "http"), (":path", path),
         (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]
    if token:
        h.append(("authorization", f"Bearer {token}"))
    return h


class PausableProxy:
    """A one-connection loopback TCP proxy to the server; while paused it stops reading what
    the server sends (the client takes no replies). Small socket buffers on both sides, so what
    the proxy does not read stays with the server."""

    def __init__(self, server_port):
        self.server_port = server_port
        self.paused = False
        self.stop_ = False
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        client, _ = self.listener.accept()
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        server.connect(("127.0.0.1", self.server_port))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        while not self.stop_:
            rl = [client] + ([] if self.paused else [server])
            r, _, _ = select.select(rl, [], [], 0.02)
            for src in r:
                dst = server if src is client else client
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.stop_ = True
                    break
                try:
                    dst.sendall(data)
                except OSError:
                    self.stop_ = True
                    break
        client.close()
        server.close()
