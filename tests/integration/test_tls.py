"""TLS and mTLS end to end: the real fusebox-server (CPU backend, free port) with certificates
made by `openssl` at test time, called from the Python client and the `fusebox` CLI.

Plaintext, a client trusting another CA, a client without a certificate or with one from
another CA (mTLS) are refused; certificates replaced on disk are picked up by new connections
within --tls_reload_s while open ones keep theirs; a token file without TLS is warned about.

Needs PYTHONPATH=<build>/python, FUSEBOX_SERVER_BIN and FUSEBOX_CLI_BIN (ctest sets all three;
by default they are looked up under build/).
"""
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from fusebox_client import Client, FuseboxError

ROOT = Path(__file__).resolve().parents[2]
SERVER_BIN = os.environ.get("FUSEBOX_SERVER_BIN", str(ROOT / "build/server/fusebox-server"))
CLI_BIN = os.environ.get("FUSEBOX_CLI_BIN", str(ROOT / "build/client/fusebox"))
RELOAD_S = 1


# --- certificates -----------------------------------------------------------------------------

class Cert:
    def __init__(self, cert: Path, key: Path):
        self.cert, self.key = cert, key


def make_cert(directory: Path, name: str, ca: "Cert | None" = None) -> Cert:
    """A self-signed CA (ca None) or a certificate for 127.0.0.1 / localhost that ca signs."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    cmd = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
           "-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)]
    if ca is not None:
        cmd += ["-CA", str(ca.cert), "-CAkey", str(ca.key),
                "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                "-addext", "basicConstraints=critical,CA:FALSE",
                "-addext", "extendedKeyUsage=serverAuth,clientAuth"]
    subprocess.run(cmd, check=True, capture_output=True)
    return Cert(cert, key)


@pytest.fixture(scope="module")
def pki():
    """Two unrelated CAs, each with a server and a client certificate."""
    with tempfile.TemporaryDirectory(prefix="fusebox-tls-") as d:
        d = Path(d)
        p = {"dir": d}
        for n in ("1", "2"):
            ca = p[f"ca{n}"] = make_cert(d, f"fusebox-test-ca-{n}")
            p[f"server{n}"] = make_cert(d, f"server-{n}", ca)
            p[f"client{n}"] = make_cert(d, f"client-{n}", ca)
        yield p


# --- the server -------------------------------------------------------------------------------

# SIGKILL for the servers when pytest dies (util-linux's setpriv sets PR_SET_PDEATHSIG and
# execs them): not a preexec_fn, which can deadlock in a multi-threaded process (a server start
# hung in _execute_child under load).
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]


class Server:
    """A fusebox-server child process; its stderr (the log) goes to a file, read by log()."""

    def __init__(self, *flags, tmp: Path):
        self.log_path = Path(tempfile.mkstemp(prefix="fusebox-server-", suffix=".log", dir=tmp)[1])
        self.log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            DIE_WITH_PARENT + [SERVER_BIN, "--address=127.0.0.1:0", "--backend=cpu", *flags],
            stdout=subprocess.PIPE, stderr=self.log_file, stdin=subprocess.DEVNULL)
        line = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(30)
        if not line or not line[0]:
            self.kill()
            raise RuntimeError(f"{SERVER_BIN} did not announce its address:\n{self.log()}")
        self.first_line = line[0].decode()
        m = re.search(r"listening on (\S+):(\d+)", self.first_line)
        assert m, self.first_line
        self.address = f"127.0.0.1:{m.group(2)}"
        threading.Thread(target=lambda: self.proc.stdout.read(), daemon=True).start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.proc.returncode


@pytest.fixture
def start(tmp_path):
    """start(*flags) -> Server, every one stopped after the test."""
    servers = []

    def _start(*flags):
        servers.append(Server(*flags, tmp=tmp_path))
        return servers[-1]
    yield _start
    for s in servers:
        s.stop()


def tls_flags(server_cert: Cert, client_ca: "Cert | None" = None, reload_s: int = RELOAD_S):
    flags = [f"--tls_cert={server_cert.cert}", f"--tls_key={server_cert.key}",
             f"--tls_reload_s={reload_s}"]
    if client_ca is not None:
        flags.append(f"--tls_client_ca={client_ca.cert}")
    return flags


def gelu_ok(client: Client):
    out = client.gelu(np.array([1.0, -1.0], dtype=np.float32))
    np.testing.assert_allclose(out, [0.841192, -0.158808], atol=1e-5)


def refused(client: Client):
    """The call fails at the connection (TLS handshake), not in the service."""
    with pytest.raises(FuseboxError) as e:
        client.health(timeout=5)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
    return e.value


# --- TLS --------------------------------------------------------------------------------------

def test_tls_client_trusting_the_ca_is_served(pki, start):
    s = start(*tls_flags(pki["server1"]))
    assert "tls=on" in s.first_line, s.first_line
    assert "tls: certificate CN=server-1 from CN=fusebox-test-ca-1" in s.log(), s.log()
    with Client(s.address, root_certificates=pki["ca1"].cert) as c:  # a path
        assert c.health() == "SERVING"
        gelu_ok(c)
    with Client(s.address, root_certificates=pki["ca1"].cert.read_bytes()) as c:  # PEM bytes
        gelu_ok(c)


def test_plaintext_client_is_refused(pki, start):
    s = start(*tls_flags(pki["server1"]))
    with Client(s.address) as c:
        refused(c)
    assert s.alive()


def test_client_trusting_another_ca_is_refused(pki, start):
    s = start(*tls_flags(pki["server1"]))
    with Client(s.address, root_certificates=pki["ca2"].cert) as c:
        refused(c)
    with Client(s.address, tls=True) as c:  # the system's CAs do not know the test CA
        refused(c)
    with Client(s.address, root_certificates=pki["ca1"].cert, server_name="not-this-server") as c:
        refused(c)  # the certificate names 127.0.0.1 and localhost only
    with Client(s.address, root_certificates=pki["ca1"].cert, server_name="localhost") as c:
        gelu_ok(c)
    assert s.alive()


def test_tls_client_to_a_plaintext_server_is_refused(pki, start):
    s = start()
    assert "tls=off" in s.first_line, s.first_line
    with Client(s.address, root_certificates=pki["ca1"].cert) as c:
        refused(c)


# --- mTLS -------------------------------------------------------------------------------------

def test_mtls_requires_a_client_certificate_from_the_client_ca(pki, start):
    s = start(*tls_flags(pki["server1"], client_ca=pki["ca2"]))
    assert "tls=mtls" in s.first_line, s.first_line
    assert "mTLS: a client certificate is required, from CN=fusebox-test-ca-2" in s.log()
    with Client(s.address, root_certificates=pki["ca1"].cert) as c:  # no certificate
        refused(c)
    with Client(s.address, root_certificates=pki["ca1"].cert,  # signed by the wrong CA
                certificate_chain=pki["client1"].cert, private_key=pki["client1"].key) as c:
        refused(c)
    with Client(s.address) as c:  # plaintext
        refused(c)
    with Client(s.address, root_certificates=pki["ca1"].cert,
                certificate_chain=pki["client2"].cert, private_key=pki["client2"].key) as c:
        assert c.health() == "SERVING"
        gelu_ok(c)
    assert s.alive()


def test_native_transport_speaks_mtls_and_is_refused_as_grpcio_is(pki, start):
    # Large calls go through libfusebox_native (the C++ client), which takes the same TLS
    # settings: served with the right CA, name and certificate; refused at the handshake else.
    from fusebox_client import _native
    if _native.library() is None:
        pytest.skip("libfusebox_native is not built next to fusebox_client")
    s = start(*tls_flags(pki["server1"], client_ca=pki["ca2"]))
    x = np.linspace(-4, 4, 1 << 19, dtype=np.float32)  # 2 MiB: past native_min_bytes
    mine = dict(certificate_chain=pki["client2"].cert, private_key=pki["client2"].key)
    with Client(s.address, root_certificates=pki["ca1"].cert, server_name="localhost",
                native=True, **mine) as c:
        with Client(s.address, root_certificates=pki["ca1"].cert, native=False, **mine) as g:
            np.testing.assert_array_equal(c.gelu(x), g.gelu(x))
    for bad in (dict(root_certificates=pki["ca2"].cert, **mine),  # trusts another CA
                dict(root_certificates=pki["ca1"].cert),  # no client certificate
                dict(root_certificates=pki["ca1"].cert, server_name="not-this-server", **mine)):
        with Client(s.address, native=True, timeout=5, **bad) as c:
            with pytest.raises(FuseboxError) as e:
                c.gelu(x)
            assert e.value.code == grpc.StatusCode.UNAVAILABLE, (bad, e.value)
    assert s.alive()


def test_python_client_wants_a_certificate_and_its_key_together(pki):
    with pytest.raises(ValueError, match="come together"):
        Client("127.0.0.1:1", certificate_chain=pki["client1"].cert)


def test_mtls_and_a_token_file(pki, start, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-a alice\n")
    s = start(*tls_flags(pki["server1"], client_ca=pki["ca1"]), f"--token_file={tokens}")
    assert "WARNING" not in s.log(), s.log()
    cert = dict(root_certificates=pki["ca1"].cert, certificate_chain=pki["client1"].cert,
                private_key=pki["client1"].key)
    with Client(s.address, token="secret-a", **cert) as c:
        gelu_ok(c)
    with Client(s.address, token="wrong", **cert) as c:
        with pytest.raises(FuseboxError) as e:
            gelu_ok(c)
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_python_clients_take_server_token_and_mtls_files_from_the_environment(
        pki, start, tmp_path, monkeypatch):
    import asyncio
    from fusebox_client.aio import AsyncClient
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-a alice\n")
    s = start(*tls_flags(pki["server1"], client_ca=pki["ca1"]), f"--token_file={tokens}")
    for name, value in [("FUSEBOX_SERVER", s.address), ("FUSEBOX_TOKEN", "secret-a"),
                        ("FUSEBOX_TLS_CA", str(pki["ca1"].cert)),
                        ("FUSEBOX_TLS_CERT", str(pki["client1"].cert)),
                        ("FUSEBOX_TLS_KEY", str(pki["client1"].key))]:
        monkeypatch.setenv(name, value)
    with Client() as c:
        gelu_ok(c)

    async def health():
        async with AsyncClient() as c:
            return await c.health()
    assert asyncio.run(health()) == "SERVING"
    monkeypatch.setenv("FUSEBOX_TOKEN", "wrong")
    with Client() as c:
        with pytest.raises(FuseboxError) as e:
            gelu_ok(c)
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


# --- reloading --------------------------------------------------------------------------------

def swap_in(live: Path, files: dict):
    """Replaces live (a symlink to a directory) with a new directory holding files, at once:
    how Kubernetes updates a Secret volume, and what --help asks for."""
    new = live.parent / f"{live.name}.{time.monotonic_ns()}"
    new.mkdir()
    for name, src in files.items():
        (new / name).write_bytes(Path(src).read_bytes())
    tmp_link = live.parent / f"{live.name}.link"
    os.symlink(new.name, tmp_link)
    os.replace(tmp_link, live)


def eventually(what, timeout=10 * RELOAD_S + 5):
    """Polls what() until it returns true (each try a new connection), or fails."""
    deadline = time.monotonic() + timeout
    while True:
        last = what()
        if last or time.monotonic() > deadline:
            return last
        time.sleep(0.2)


def connects(address, **tls) -> bool:
    with Client(address, **tls) as c:
        try:
            return c.health(timeout=5) == "SERVING"
        except FuseboxError as e:
            assert e.code == grpc.StatusCode.UNAVAILABLE, e
            return False


def test_new_server_certificate_is_picked_up_by_new_connections(pki, start, tmp_path):
    live = tmp_path / "tls"
    swap_in(live, {"tls.crt": pki["server1"].cert, "tls.key": pki["server1"].key})
    s = start(f"--tls_cert={live}/tls.crt", f"--tls_key={live}/tls.key",
              f"--tls_reload_s={RELOAD_S}")
    old = Client(s.address, root_certificates=pki["ca1"].cert)
    gelu_ok(old)

    swap_in(live, {"tls.crt": pki["server2"].cert, "tls.key": pki["server2"].key})  # a new CA
    assert eventually(lambda: connects(s.address, root_certificates=pki["ca2"].cert)), s.log()
    assert not connects(s.address, root_certificates=pki["ca1"].cert)
    gelu_ok(old)  # its connection was made with the old certificate and stays
    old.close()
    assert eventually(lambda: "tls: the TLS files changed: certificate CN=server-2 from "
                              "CN=fusebox-test-ca-2" in s.log()), s.log()
    assert s.stop() == 0


def test_new_client_ca_is_picked_up_by_new_connections(pki, start, tmp_path):
    ca = tmp_path / "client-ca.crt"
    ca.write_bytes(pki["ca1"].cert.read_bytes())
    s = start(*tls_flags(pki["server1"]), f"--tls_client_ca={ca}")
    mtls = lambda n: dict(root_certificates=pki["ca1"].cert,  # noqa: E731
                          certificate_chain=pki[f"client{n}"].cert,
                          private_key=pki[f"client{n}"].key)
    assert connects(s.address, **mtls(1))
    assert not connects(s.address, **mtls(2))

    tmp = tmp_path / "client-ca.crt.new"
    tmp.write_bytes(pki["ca2"].cert.read_bytes())
    os.replace(tmp, ca)
    assert eventually(lambda: connects(s.address, **mtls(2))), s.log()
    assert not connects(s.address, **mtls(1))


def test_a_half_replaced_pair_is_logged_and_served_again_once_whole(pki, start, tmp_path):
    """A key that does not match its certificate (a pair replaced file by file, caught between
    the two): the server says so, stays up, and serves again once the pair matches."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki["server1"].cert.read_bytes())
    key.write_bytes(pki["server1"].key.read_bytes())
    s = start(f"--tls_cert={cert}", f"--tls_key={key}", f"--tls_reload_s={RELOAD_S}")
    assert connects(s.address, root_certificates=pki["ca1"].cert)

    key.write_bytes(pki["server2"].key.read_bytes())
    assert eventually(lambda: "tls: ERROR: the TLS files changed and are not usable" in s.log()), \
        s.log()
    assert "does not match the certificate" in s.log()
    assert "New TLS handshakes fail until they are fixed" in s.log()
    time.sleep(2 * RELOAD_S)  # gRPC has read the mismatched pair by now
    connects(s.address, root_certificates=pki["ca1"].cert)  # may fail: either way, no crash
    assert s.alive(), s.log()

    cert.write_bytes(pki["server2"].cert.read_bytes())
    assert eventually(lambda: connects(s.address, root_certificates=pki["ca2"].cert)), s.log()
    assert s.alive()
    assert s.stop() == 0


def test_a_file_gone_missing_keeps_the_pair_last_read(pki, start, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki["server1"].cert.read_bytes())
    key.write_bytes(pki["server1"].key.read_bytes())
    s = start(f"--tls_cert={cert}", f"--tls_key={key}", f"--tls_reload_s={RELOAD_S}")
    key.unlink()
    assert eventually(lambda: "New connections get the files last read until then" in s.log()), \
        s.log()
    time.sleep(2 * RELOAD_S)  # gRPC has tried to read it by now
    assert connects(s.address, root_certificates=pki["ca1"].cert), s.log()


def test_failed_handshakes_are_logged_at_most_once_a_second(pki, start):
    """gRPC logs a line per failed handshake: a flood of plaintext connections must not fill
    the log."""
    s = start(*tls_flags(pki["server1"]))

    def plaintext_connection():
        with socket.create_connection(("127.0.0.1", int(s.address.rsplit(":", 1)[1]))) as c:
            c.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            c.settimeout(5)
            try:
                c.recv(100)  # the server closes it
            except OSError:
                pass

    begin = time.monotonic()
    for _ in range(50):
        plaintext_connection()
    time.sleep(1.1)
    plaintext_connection()  # logged, with the count of those left out
    seconds = time.monotonic() - begin
    assert eventually(lambda: "more failed TLS handshakes since the last one logged" in s.log())
    lines = s.log().count("Handshake failed")
    assert 2 <= lines <= seconds + 2, (lines, seconds, s.log())
    with Client(s.address, root_certificates=pki["ca1"].cert) as c:
        gelu_ok(c)


# --- start-up ---------------------------------------------------------------------------------

def test_token_file_without_tls_is_warned_about_loudly(start, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-a alice\n")
    s = start(f"--token_file={tokens}")
    log = s.log()
    assert "WARNING: --token_file without TLS: bearer tokens and tensors cross the network in " \
           "CLEARTEXT" in log, log
    assert "WARNING: serve TLS (--tls_cert and --tls_key" in log, log
    # An open server has no tokens to leak: no warning, but it says TLS is off.
    s2 = start()
    assert "WARNING" not in s2.log() and "tls: off" in s2.log(), s2.log()


@pytest.mark.parametrize("case", ["cert_only", "key_only", "client_ca_only", "missing_file",
                                  "mismatched_key", "not_pem", "reload_0"])
def test_bad_tls_flags_stop_the_server_with_status_2(pki, tmp_path, case):
    s1, s2, ca = pki["server1"], pki["server2"], pki["ca1"]
    junk = tmp_path / "junk.pem"
    junk.write_text("junk\n")
    flags, want = {
        "cert_only": ([f"--tls_cert={s1.cert}"], "--tls_cert and --tls_key come together"),
        "key_only": ([f"--tls_key={s1.key}"], "--tls_cert and --tls_key come together"),
        "client_ca_only": ([f"--tls_client_ca={ca.cert}"], "--tls_client_ca (mTLS) needs"),
        "missing_file": ([f"--tls_cert={tmp_path}/none.crt", f"--tls_key={s1.key}"],
                         f"--tls_cert={tmp_path}/none.crt: No such file or directory"),
        "mismatched_key": ([f"--tls_cert={s1.cert}", f"--tls_key={s2.key}"],
                           "does not match the certificate"),
        "not_pem": ([f"--tls_cert={junk}", f"--tls_key={s1.key}"], "not a PEM certificate"),
        "reload_0": (tls_flags(s1, reload_s=0), "--tls_reload_s must be in 1..86400"),
    }[case]
    r = subprocess.run(DIE_WITH_PARENT + [SERVER_BIN, "--address=127.0.0.1:0", "--backend=cpu", *flags],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert want in r.stderr, r.stderr
    assert "listening" not in r.stdout


# --- the CLI (the C++ client) -----------------------------------------------------------------

def cli(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOX_")}
    e.update(env or {})
    return subprocess.run([CLI_BIN, *args], capture_output=True, text=True, timeout=60, env=e)


def test_cli_speaks_tls_and_mtls(pki, start, tmp_path):
    s = start(*tls_flags(pki["server1"], client_ca=pki["ca2"]))
    ca, c2 = str(pki["ca1"].cert), pki["client2"]
    r = cli("--server", s.address, "--tls_ca", ca, "--tls_cert", str(c2.cert),
            "--tls_key", str(c2.key), "health")
    assert r.returncode == 0 and r.stdout.strip() == "SERVING", (r.stdout, r.stderr)

    # The same from the environment, and an op on .npy files.
    x = np.array([[1.0, -1.0]], dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    env = {"FUSEBOX_SERVER": s.address, "FUSEBOX_TLS_CA": ca, "FUSEBOX_TLS_CERT": str(c2.cert),
           "FUSEBOX_TLS_KEY": str(c2.key)}
    r = cli("gelu", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"), "-q", env=env)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), [[0.841192, -0.158808]], atol=1e-5)

    # Refused: no client certificate; one from the wrong CA; plaintext; the wrong CA.
    c1 = pki["client1"]
    for args in (["--tls_ca", ca],
                 ["--tls_ca", ca, "--tls_cert", str(c1.cert), "--tls_key", str(c1.key)],
                 [],
                 ["--tls_ca", str(pki["ca2"].cert), "--tls_cert", str(c2.cert),
                  "--tls_key", str(c2.key)]):
        r = cli("--server", s.address, *args, "health", "--timeout_ms", "5000")
        assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, (args, r.stderr)
    # An empty flag overrides its variable: no client certificate, refused.
    r = cli("--tls_cert=", "--tls_key=", "health", "--timeout_ms", "5000", env=env)
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr, r.stderr


def test_cli_tls_without_client_certificate(pki, start):
    s = start(*tls_flags(pki["server1"]))
    r = cli("--server", s.address, "--tls_ca", str(pki["ca1"].cert), "health")
    assert r.returncode == 0 and r.stdout.strip() == "SERVING", r.stderr
    r = cli("--server", s.address, "--tls_ca", str(pki["ca1"].cert),
            "--tls_server_name", "localhost", "health")
    assert r.returncode == 0, r.stderr


def test_cli_refuses_half_a_client_certificate_and_unreadable_files(pki):
    r = cli("--tls_cert", str(pki["client1"].cert), "health")
    assert r.returncode == 2 and "--tls_cert and --tls_key come together" in r.stderr, r.stderr
    r = cli("--tls_ca", "/nonexistent/ca.pem", "health")
    assert r.returncode == 1 and "/nonexistent/ca.pem" in r.stderr, r.stderr
