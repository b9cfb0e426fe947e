"""Held tensors across replicas: three fusebox-server replicas on loopback behind the real
HAProxy with deploy/proxy/haproxy.cfg, and the Python client's Router without a proxy.

Calls naming a handle reach the replica holding it; the rest spread; a replica stopped with
SIGTERM under load costs no acknowledged call, its handles then answer NOT_FOUND saying the
replica is gone, and the other replicas' handles and new uploads keep working.

Needs PYTHONPATH=<build>/python, FUSEBOX_SERVER_BIN, FUSEBOX_CLI_BIN, and haproxy on PATH (ctest sets them).
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest

from fusebox_client import Client, FuseboxError, Handle, Router, replica_of

ROOT = Path(__file__).resolve().parents[2]
SERVER_BIN = os.environ.get("FUSEBOX_SERVER_BIN", str(ROOT / "build/server/fusebox-server"))
CLI_BIN = os.environ.get("FUSEBOX_CLI_BIN", str(ROOT / "build/client/fusebox"))
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CONFIG = ROOT / "deploy/proxy/haproxy.cfg"
TENANTS = {"tok-alice": "alice", "tok-bob": "bob", "tok-carol": "carol", "tok-dave": "dave"}
REPLICAS = ["fusebox-0", "fusebox-1", "fusebox-2"]


# SIGKILL for the servers and the proxy when pytest dies (util-linux's setpriv sets
# PR_SET_PDEATHSIG and execs them): not a preexec_fn, which can deadlock in a multi-threaded
# process.
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A fusebox-server replica on a free loopback port (parsed from its start-up line)."""

    def __init__(self, replica, token_file, flags=()):
        self.replica = replica
        self.proc = subprocess.Popen(
            DIE_WITH_PARENT + [SERVER_BIN, "--address=127.0.0.1:0", "--backend=cpu", f"--replica_id={replica}",
             f"--token_file={token_file}", "--drain_seconds=20", "--workers=2", *flags],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode()
        m = re.search(r"listening on (\S+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"cannot parse server line: {line!r}")
        self.address = f"127.0.0.1:{m.group(2)}"
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self, timeout=60):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _replica_states(stats_address):
    """{server name: status} of the `spread` backend, from HAProxy's CSV stats."""
    import urllib.request
    with urllib.request.urlopen(f"http://{stats_address}/stats;csv", timeout=5) as r:
        rows = r.read().decode().splitlines()
    out = {}
    for row in rows[1:]:
        f = row.split(",")
        if len(f) > 17 and f[0] == "spread" and f[1].startswith("fusebox-"):
            out[f[1]] = f[17]
    return out


def _wait_for(predicate, timeout=15, what="a condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Cluster:
    """Three replicas and the proxy; with tls, TLS on both hops, with the certificates that
    deploy/k8s/make-secrets.sh makes and the proxy options the Kubernetes manifests set."""

    def __init__(self, tmp, tls=False, notice_s=0):
        self.token_file = tmp / "tokens"
        self.token_file.write_text("".join(f"{t} {n}\n" for t, n in TENANTS.items()))
        tls_flags, env = (), dict(os.environ)
        self.client_tls = {}
        if tls:
            pki = tmp / "secrets"
            subprocess.run([str(ROOT / "deploy/k8s/make-secrets.sh"), str(pki), "test"],
                           check=True, capture_output=True)
            shutil.copy(pki / "tls.crt", tmp / "proxy.pem")
            shutil.copy(pki / "tls.key", tmp / "proxy.pem.key")
            tls_flags = (f"--tls_cert={pki / 'tls.crt'}", f"--tls_key={pki / 'tls.key'}")
            env["FUSEBOX_PROXY_BIND_OPTS"] = f"ssl crt {tmp / 'proxy.pem'} alpn h2"
            env["FUSEBOX_SERVER_OPTS"] = (f"ssl verify required ca-file {pki / 'ca.crt'} "
                                          "verifyhost fusebox alpn h2")
            self.client_tls = {"root_certificates": str(pki / "ca.crt"),
                               "server_name": "fusebox"}
        flags = (*tls_flags, f"--shutdown_notice_s={notice_s}")
        self.servers = {r: Server(r, self.token_file, flags) for r in REPLICAS}
        self.proxy_address = f"127.0.0.1:{_free_port()}"
        self.stats_address = f"127.0.0.1:{_free_port()}"
        env.update(FUSEBOX_PROXY_BIND=self.proxy_address, FUSEBOX_PROXY_STATS=self.stats_address)
        for i, r in enumerate(REPLICAS):
            env[f"FUSEBOX_REPLICA_{i}"] = self.servers[r].address
        self.proxy = subprocess.Popen(DIE_WITH_PARENT + [HAPROXY, "-db", "-f", str(CONFIG)], env=env,
                                      stdin=subprocess.DEVNULL, stdout=open(tmp / "haproxy.log", "wb"),
                                      stderr=subprocess.STDOUT)
        _wait_for(self._settled, what="HAProxy to see every replica up and the empty slots down")

    def _settled(self):
        # Slots start UP until their first check: a call sent before then could meet a slot
        # with no replica behind it.
        try:
            states = _replica_states(self.stats_address)
        except OSError:
            return False
        return len(states) == 8 and all((states[s] == "UP") == (s in REPLICAS) for s in states)

    def close(self):
        for s in self.servers.values():
            s.kill()
        self.proxy.kill()
        self.proxy.wait()


@pytest.fixture
def cluster(tmp_path):
    if not os.path.exists(HAPROXY):
        pytest.fail("haproxy is not installed (scripts/setup.sh installs it)")
    c = Cluster(tmp_path)
    yield c
    c.close()


def _chain(client, rng):
    """upload -> gelu (kept) -> softmax (kept) -> rowsum, checked; returns the handles made."""
    x = rng.standard_normal((8, 33)).astype(np.float32)
    h = client.upload(x)
    g = client.gelu(h, keep=True)
    s = client.softmax(g, keep=True)
    sums = client.rowsum(s)
    np.testing.assert_allclose(sums, np.ones(8), rtol=1e-5)
    assert client.download(h).tobytes() == x.tobytes()
    return [h, g, s]


def test_chains_through_handles_reach_their_replica_for_every_tenant(cluster):
    seen, errors = Counter(), []

    def tenant(token, seed):
        rng = np.random.default_rng(seed)
        try:
            with Client(cluster.proxy_address, token=token, timeout=30) as c:
                for _ in range(12):
                    handles = _chain(c, rng)
                    assert len({replica_of(h) for h in handles}) == 1
                    seen[replica_of(handles[0])] += 1
                    for h in handles:
                        c.free(h)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=tenant, args=(t, i)) for i, t in enumerate(TENANTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert set(seen) == set(REPLICAS), seen  # uploads spread over every replica


def test_the_cpp_client_routes_its_handles_through_the_proxy(cluster, tmp_path):
    """The `fusebox` CLI (the C++ client) sends the replica header: with three replicas, a
    call naming a handle that went anywhere else would fail two times in three."""
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    np.save(tmp_path / "x.npy", x)
    env = dict(os.environ, FUSEBOX_SERVER=cluster.proxy_address, FUSEBOX_TOKEN="tok-bob")

    def cli(*args):
        r = subprocess.run([CLI_BIN, *args], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    replicas = set()
    for _ in range(9):
        h = cli("upload", str(tmp_path / "x.npy")).split()[0]
        replicas.add(replica_of(h))
        kept = cli("softmax", "@" + h, "--keep", "-q").strip()
        assert replica_of(kept) == replica_of(h)
        cli("download", kept, "-o", str(tmp_path / "s.npy"))
        np.testing.assert_allclose(np.load(tmp_path / "s.npy").sum(axis=1), np.ones(4), rtol=1e-5)
        cli("free", h, kept)
    assert len(replicas) > 1


def test_ranged_uploads_and_downloads_reach_their_replica_through_the_proxy(cluster):
    """A ranged upload's CreateUpload goes to any replica; its WriteUpload streams (several
    connections) and its commit carry the upload id's replica in the header, so the proxy sends
    them there: with three replicas, a write sent anywhere else would be NOT_FOUND."""
    x = np.random.default_rng(8).standard_normal((3 << 18) + 5).astype(np.float32)  # 3 MiB
    replicas = set()
    with Client(cluster.proxy_address, token="tok-alice", timeout=30, connections=3,
                parallel_min_bytes=1 << 20, range_bytes=256 << 10) as c:
        for _ in range(6):
            h = c.upload(x)
            replicas.add(replica_of(h))
            assert c.download(h).tobytes() == x.tobytes()
            c.free(h)
    assert len(replicas) > 1


def test_chains_run_with_tls_on_both_sides_of_the_proxy(tmp_path):
    cluster = Cluster(tmp_path, tls=True)
    try:
        with Client(cluster.proxy_address, token="tok-carol", timeout=30,
                    **cluster.client_tls) as c:
            rng = np.random.default_rng(3)
            replicas = {replica_of(_chain(c, rng)[0]) for _ in range(9)}
            assert len(replicas) > 1
    finally:
        cluster.close()


def test_a_tenant_cannot_reach_another_tenants_handle_through_the_proxy(cluster):
    with Client(cluster.proxy_address, token="tok-alice") as a, \
            Client(cluster.proxy_address, token="tok-bob") as b:
        h = a.upload(np.ones(4, np.float32))
        with pytest.raises(FuseboxError) as e:
            b.gelu(h)
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_an_unknown_replica_is_not_found_from_the_proxy(cluster):
    with Client(cluster.proxy_address, token="tok-alice") as c:
        with pytest.raises(FuseboxError) as e:
            c.download(Handle("fusebox-9.t0000"))
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert "replica is gone" in e.value.details


# notice 0: the replica refuses new calls at once; 1: it keeps serving for a second first, as
# the Kubernetes manifests have it (5 s there), while the proxy still sends it calls.
@pytest.mark.parametrize("notice_s", [0, 1])
def test_a_replica_stopped_under_load_loses_no_acknowledged_call(tmp_path, notice_s):
    """SIGTERM to one replica while every tenant runs chains. Calls naming a handle of the
    stopping replica may fail as README documents for a replica going away (NOT_FOUND "is
    gone", UNAVAILABLE, or CANCELLED for a call that crossed its shutdown): its tensors are lost
    anyway. Every other call succeeds; an upload (which names no handle) that crossed the
    shutdown unrun may end UNAVAILABLE or CANCELLED and succeeds when sent again; every call
    that succeeded returned the right numbers."""
    cluster = Cluster(tmp_path, notice_s=notice_s)
    try:
        _stop_one_replica_under_load(cluster)
    finally:
        cluster.close()


def _stop_one_replica_under_load(cluster):
    victim = "fusebox-1"
    held = {}
    with Client(cluster.proxy_address, token="tok-alice") as c:
        while set(held) != set(REPLICAS):  # one long-lived tensor on each replica
            x = np.arange(16, dtype=np.float32)
            h = c.upload(x)
            if replica_of(h) not in held:
                held[replica_of(h)] = h.release()  # outlives this client (the others are freed)

    stop = threading.Event()
    codes = Counter()      # failures, by (where: the replica or "upload", code)
    bad = []               # failures that no replica going away explains
    done = Counter()
    gone = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    details = set()

    retried = Counter()

    def upload(c, x):
        # An upload that crossed the replica's shutdown never ran (README: UNAVAILABLE or
        # CANCELLED) and left nothing behind: the documented answer is to send it again.
        for _ in range(3):
            try:
                return c.upload(x)
            except FuseboxError as e:
                if e.code not in gone:
                    raise
                retried[e.code.name] += 1
        return c.upload(x)

    def tenant(token, seed):
        rng = np.random.default_rng(seed)
        with Client(cluster.proxy_address, token=token, timeout=30) as c:
            while not stop.is_set():
                replica = "upload"
                try:
                    x = rng.standard_normal((4, 17)).astype(np.float32)
                    h = upload(c, x)
                    replica = replica_of(h)
                    g = c.gelu(h, keep=True)
                    sums = c.rowsum(c.softmax(g, keep=True))
                    np.testing.assert_allclose(sums, np.ones(4), rtol=1e-5)
                    c.free(g)
                    c.free(h)
                    done[replica] += 1
                except FuseboxError as e:
                    codes[(replica, e.code.name)] += 1
                    documented = e.code in gone or (
                        e.code == grpc.StatusCode.NOT_FOUND and "is gone" in e.details)
                    if not (replica == victim and documented):
                        bad.append((replica, e.code.name, e.details))
                    details.add(e.details)

    threads = [threading.Thread(target=tenant, args=(t, i)) for i, t in enumerate(TENANTS)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    before = sum(done.values())
    assert cluster.servers[victim].stop() == 0  # drained and exited cleanly
    _wait_for(lambda: _replica_states(cluster.stats_address).get(victim) != "UP",
              what="HAProxy to see the stopped replica down")
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join()

    print("failures by (replica or upload, code):", dict(codes), "chains done:", dict(done),
          "messages:", details, "uploads sent again:", dict(retried))
    assert not bad, (bad[:5], codes)
    assert before > 0 and sum(done.values()) > before, done
    assert done["fusebox-0"] > 0 and done["fusebox-2"] > 0

    with Client(cluster.proxy_address, token="tok-alice") as c:
        with pytest.raises(FuseboxError) as e:
            c.download(held[victim])
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert f"replica {victim} is gone" in e.value.details
        for r in ("fusebox-0", "fusebox-2"):
            assert c.download(held[r]).tolist() == list(range(16))
        fresh = [c.upload(np.ones(3, np.float32)) for _ in range(6)]
        assert {replica_of(h) for h in fresh} == {"fusebox-0", "fusebox-2"}
        for h in fresh:
            assert c.gelu(h).shape == (3,)


def test_router_sends_handles_to_their_replica_without_a_proxy(tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("tok-alice alice\n")
    servers = [Server(r, token_file) for r in REPLICAS]
    try:
        with Router([s.address for s in servers], token="tok-alice", timeout=30) as r:
            rng = np.random.default_rng(7)
            # Released: the ids outlive the Router, for the CLI below.
            made = [[h.release() for h in _chain(r, rng)] for _ in range(9)]
            assert {replica_of(hs[0]) for hs in made} == set(REPLICAS)
            listed = {t.handle.id for t in r.list_tensors()[0]}
            assert listed == {h for hs in made for h in hs}
            with pytest.raises(FuseboxError) as e:
                r.gelu(Handle("fusebox-9.t0000"))
            assert e.value.code == grpc.StatusCode.NOT_FOUND
        # The CLI, given every replica by name, routes each handle to its own.
        servers_arg = ",".join(f"{s.replica}={s.address}" for s in servers)
        env = dict(os.environ, FUSEBOX_TOKEN="tok-alice")
        for hs in made[:3]:
            r = subprocess.run([CLI_BIN, "--server", servers_arg, "softmax", "@" + hs[0], "--keep",
                                "-q"], capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 0, r.stderr
            assert replica_of(r.stdout.strip()) == replica_of(hs[0])
        r = subprocess.run([CLI_BIN, "--server", servers_arg, "download", "fusebox-9.t0", "-o",
                            str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=60,
                           env=env)
        assert r.returncode == 1 and "NOT_FOUND" in r.stderr
        # Sent to the wrong replica, a handle is NOT_FOUND naming the replica that holds it.
        wrong = next(s for s in servers if s.replica != replica_of(made[0][0]))
        with Client(wrong.address, token="tok-alice") as c:
            with pytest.raises(FuseboxError) as e:
                c.download(made[0][0])
            assert e.value.code == grpc.StatusCode.NOT_FOUND
            assert f"made by replica '{replica_of(made[0][0])}'" in e.value.details
    finally:
        for s in servers:
            s.kill()


def test_a_replica_id_that_cannot_be_a_header_or_dns_label_exits_2():
    r = subprocess.run([SERVER_BIN, "--backend=cpu", "--replica_id=a.b"],
                       capture_output=True, timeout=30)
    assert r.returncode == 2
    assert b"--replica_id" in r.stderr
