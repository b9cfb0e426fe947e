#!/usr/bin/env python3
"""Soak: a mixed load on one fusebox-server for a chosen time, every result checked, the
server's resources sampled; fails on any wrong result, unexpected error, or growth.

    PYTHONPATH=build/python /usr/bin/python3 tools/soak.py --duration 3600 --out soak-1h

Starts build/server/fusebox-server (--server_bin; --server_arg passes flags, e.g.
--server_arg=--backend=cuda) with a token file of --tenants tenants, or targets a running
server (--address, with --token_file to use and --pid to sample). --workers threads, each
with its own tenant (worker i is tenant i % --tenants), run a mix of:

  * Gelu, Softmax, RowSum and MatmulRelu inline in float32, float16 and bfloat16, checked
    against NumPy in float64 (the integration tests' tolerances);
  * Upload (chunked), the four ops by handle, with and without keep_on_server, Download,
    ListTensors and FreeTensor, every byte checked; ListTensors must show a tenant its own
    live tensors and no other tenant's;
  * cancellations: unary calls with deadlines of 0.1-3 ms (DEADLINE_EXCEEDED, or a result
    that is checked), calls and uploads cancelled midway (CANCELLED, or checked);
  * bad requests that must be refused with their code: INVALID_ARGUMENT (wrong byte count,
    unspecified dtype, mixed dtypes, a scalar softmax, inner dimensions that differ, a short
    upload), NOT_FOUND (an unknown handle, a freed one, another tenant's), UNAUTHENTICATED
    (an unknown token).

Every --sample_every seconds it records the server's RSS, threads and open descriptors
(/proc/<pid>) and, where nvidia-smi exists, the device memory the server's process holds
(or the GPU's used memory), into <out>.csv; <out>.json gets the summary. At the end each
tenant must hold no tensors but those of uploads whose cancel came after their reply had gone
out (fusebox.v1 allows that; counted apart, see CANCELLED_UPLOAD_SHAPE). Over the second half of the run, the least-squares growth
(slope x the half's length) of each sampled quantity must stay within its tolerance
(--rss_growth_mib, --thread_growth, --fd_growth, --device_growth_mib).

Exit status: 0 clean; 1 a wrong result, an unexpected error, or tensors left behind;
2 growth past a tolerance; 3 the server died or could not start.
"""
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300, help="seconds of load (default 300)")
    p.add_argument("--workers", type=int, default=8, help="client threads (default 8)")
    p.add_argument("--tenants", type=int, default=4, help="tenants, one token each (default 4)")
    p.add_argument("--build_dir", default=str(ROOT / "build"), help="for the server and stubs")
    p.add_argument("--server_bin", help="default: <build_dir>/server/fusebox-server")
    p.add_argument("--server_arg", action="append", default=[],
                   help="a flag for the server it starts (repeatable)")
    p.add_argument("--address", help="target a running server instead of starting one")
    p.add_argument("--token_file", help="with --address: the server's `token tenant` lines")
    p.add_argument("--pid", type=int, help="with --address: the server's pid, to sample")
    p.add_argument("--sample_every", type=float, default=5, help="seconds between samples")
    p.add_argument("--out", default="soak", help="writes <out>.csv and <out>.json")
    p.add_argument("--seed", type=int, default=None, help="the load's random seed")
    p.add_argument("--rss_growth_mib", type=float, default=32,
                   help="allowed RSS growth over the second half (default 32 MiB)")
    p.add_argument("--thread_growth", type=float, default=4,
                   help="allowed thread-count growth over the second half (default 4)")
    p.add_argument("--fd_growth", type=float, default=8,
                   help="allowed open-descriptor growth over the second half (default 8)")
    p.add_argument("--device_growth_mib", type=float, default=32,
                   help="allowed device-memory growth over the second half (default 32 MiB)")
    p.add_argument("--strict_orphans", action="store_true",
                   help="fail on cancelled uploads that left their tensor (see CANCELLED_UPLOAD_SHAPE)")
    p.add_argument("--max_failures_shown", type=int, default=20)
    return p.parse_args()


ARGS = parse_args()
sys.path.insert(0, str(Path(ARGS.build_dir) / "python"))
sys.path.insert(0, str(ROOT / "client" / "python"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))  # oracle.py, the tests' NumPy oracle
import grpc  # noqa: E402
import numpy as np  # noqa: E402
from fusebox.v1 import kernel_service_pb2 as pb  # noqa: E402
from fusebox_client import Client, FuseboxError, Handle, from_tensor, to_tensor  # noqa: E402
from oracle import TOL, as_sent, gelu_ref, rel_err, softmax_ref  # noqa: E402

DTYPES = ["float32", "float16", "bfloat16"]
PB_DTYPE = {"float32": pb.FLOAT32, "float16": pb.FLOAT16, "bfloat16": pb.BFLOAT16}
C = grpc.StatusCode


class Wrong(Exception):
    """A result that is not what it must be."""


def expect_close(got, want, dtype, what):
    if got.shape != want.shape:
        raise Wrong(f"{what}: shape {got.shape}, want {want.shape}")
    e = rel_err(got, want)
    if not e < TOL[dtype]:
        raise Wrong(f"{what}: relative error {e:.3g} over {TOL[dtype]}")


def expect_matmul(got, a, b, bias, dtype, what):
    """relu(a @ b + bias) within TOL of each output's own scale, |a| @ |b| + |bias|: a dot
    product that cancels to near zero keeps the rounding of its terms, which a norm-relative
    check would call wrong (fp32 1x89 @ 89x5: 1.5e-5 of the norm, 1e-7 of that scale)."""
    want = a @ b + (bias if bias is not None else 0)
    scale = np.abs(a) @ np.abs(b) + (np.abs(bias) if bias is not None else 0)
    want = np.maximum(want, 0)
    if got.shape != want.shape:
        raise Wrong(f"{what}: shape {got.shape}, want {want.shape}")
    err = np.abs(np.asarray(got, dtype=np.float64) - want)
    bound = TOL[dtype] * scale + 1e-6
    if not (err <= bound).all():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise Wrong(f"{what}: off by {err[i]:.3g} at {tuple(int(v) for v in i)}, over {bound[i]:.3g} "
                    f"({TOL[dtype]} of |a| @ |b| + |bias|)")


def expect_rowsum(got, sent, what):
    want = sent.sum(-1)
    if got.shape != want.shape or got.dtype != np.float32:
        raise Wrong(f"{what}: {got.dtype}{got.shape}, want float32{want.shape}")
    atol = 1e-5 * (np.abs(sent).sum(-1).max() if sent.size else 0) + 1e-6
    if not np.allclose(got, want, rtol=0, atol=atol):
        raise Wrong(f"{what}: off by {np.abs(got - want).max():.3g} (atol {atol:.3g})")


# --- the load -------------------------------------------------------------------------------

class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls = collections.Counter()     # action -> count
        self.expected = collections.Counter()  # "action:CODE" -> count (refusals we asked for)
        self.failures = []                     # (time, action, message)
        self.failure_count = 0

    def ok(self, action, n=1):
        with self.lock:
            self.calls[action] += n

    def refused(self, action, code):
        with self.lock:
            self.expected[f"{action}:{code.name}"] += 1

    def fail(self, action, msg):
        with self.lock:
            self.failure_count += 1
            if len(self.failures) < 200:
                self.failures.append((round(time.monotonic() - T0, 1), action, msg))
            if self.failure_count <= ARGS.max_failures_shown:
                print(f"FAIL {action}: {msg}", file=sys.stderr, flush=True)

    def total(self):
        """Actions done: results checked, refusals as asked, failures."""
        with self.lock:
            return sum(self.calls.values()) + sum(self.expected.values()) + self.failure_count


# The shape of the uploads the soak cancels (no other action makes a tensor of it). One whose
# cancel reaches the server only after its reply has gone out stays held, as fusebox.v1
# documents ("one cancelled before its reply goes out leaves nothing behind"): the client
# never learns its handle, ListTensors shows it, idle expiry frees it. The end of the run
# counts such tensors apart (--strict_orphans: they fail the run too).
CANCELLED_UPLOAD_SHAPE = (256, 1024)

T0 = time.monotonic()
STATS = Stats()
LIVE = {}  # handle -> tenant, for every tensor a worker holds now
LIVE_LOCK = threading.Lock()


def code_of(e):
    if isinstance(e, FuseboxError):
        return e.code
    if isinstance(e, grpc.RpcError):
        return e.code()
    return None


class Worker:
    def __init__(self, index, client, tenant, rng, bad_client):
        self.i = index
        self.c = client
        self.tenant = tenant
        self.rng = rng
        self.bad = bad_client  # a client with a token the server does not know
        self.mine = []  # handles this worker holds

    # helpers
    def array(self, shape, lo=-4, hi=4):
        return self.rng.uniform(lo, hi, shape).astype(np.float32)

    def shape(self, rank_min=1, rank_max=3, big=False):
        """Small shapes; big ones up to 128 x 2047 (1 MiB of float32)."""
        rank = int(self.rng.integers(rank_min, rank_max + 1))
        dims = [int(self.rng.integers(1, 9)) for _ in range(rank - 1)]
        dims.append(int(self.rng.integers(1, 2048 if big else 96)))
        if big and rank >= 2:
            dims[0] = int(self.rng.integers(1, 129))
        return tuple(dims)

    def dtype(self):
        return DTYPES[int(self.rng.integers(0, 3))]

    def hold(self, h):
        with LIVE_LOCK:
            LIVE[h] = self.tenant
        self.mine.append(h)

    def release(self, h):
        freed = self.c.free(h)
        with LIVE_LOCK:
            LIVE.pop(h, None)
        self.mine.remove(h)
        return freed

    def expect_refused(self, action, codes, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            code = code_of(e)
            if code in codes:
                STATS.refused(action, code)
                return
            STATS.fail(action, f"got {code.name if code else type(e).__name__}: {e}; "
                               f"want {'/'.join(c.name for c in codes)}")
            return
        STATS.fail(action, f"succeeded; want {'/'.join(c.name for c in codes)}")

    # actions: each checks its own results and raises Wrong or an RPC error on a bad one
    def op_inline(self):
        dt = self.dtype()
        which = self.rng.integers(0, 4)
        if which == 0:
            x = self.array(self.shape(big=self.rng.random() < 0.1))
            expect_close(self.c.gelu(x, dtype=dt), gelu_ref(as_sent(x, dt)), dt, f"gelu {dt}{x.shape}")
            return "gelu"
        if which == 1:
            x = self.array(self.shape(big=self.rng.random() < 0.1))
            expect_close(self.c.softmax(x, dtype=dt), softmax_ref(as_sent(x, dt)), dt,
                         f"softmax {dt}{x.shape}")
            return "softmax"
        if which == 2:
            x = self.array(self.shape(big=self.rng.random() < 0.1))
            expect_rowsum(self.c.rowsum(x, dtype=dt), as_sent(x, dt), f"rowsum {dt}{x.shape}")
            return "rowsum"
        m, k, n = (int(v) for v in self.rng.integers(1, 65, 3))
        a, b = self.array((m, k), -1, 1), self.array((k, n), -1, 1)
        bias = self.array((n,), -1, 1) if self.rng.random() < 0.5 else None
        expect_matmul(self.c.matmul_relu(a, b, bias, dtype=dt), as_sent(a, dt), as_sent(b, dt),
                      None if bias is None else as_sent(bias, dt), dt, f"matmul_relu {dt} {m}x{k}x{n}")
        return "matmul_relu"

    def tensors(self):
        dt = self.dtype()
        x = self.array(self.shape(rank_min=2, rank_max=2, big=self.rng.random() < 0.3))
        sent = as_sent(x, dt)
        chunk = int(self.rng.choice([4096, 65536, 1 << 20]))
        h = self.c.upload(x, dtype=dt, chunk_bytes=chunk)
        self.hold(h)
        back = self.c.download(h)
        if back.shape != x.shape or not np.array_equal(back.astype(np.float64), sent):
            raise Wrong(f"download of an upload {dt}{x.shape}: other values")
        which = self.rng.integers(0, 4)
        keep = self.rng.random() < 0.5
        if which == 0:
            out, want, check = self.c.gelu(h, keep=keep), gelu_ref(sent), "gelu"
        elif which == 1:
            out, want, check = self.c.softmax(h, keep=keep), softmax_ref(sent), "softmax"
        elif which == 2:
            out, check = self.c.rowsum(h, keep=keep), "rowsum"
            want = None
        else:
            b = self.array((x.shape[1], 5), -1, 1)
            out, check = self.c.matmul_relu(h, b, dtype=dt, keep=keep), "matmul_relu"
            want = ("matmul", as_sent(b, dt))
        if keep:
            if not isinstance(out, Handle):
                raise Wrong(f"{check} by handle with keep: no handle")
            self.hold(out)
            kept = out
            out = self.c.download(kept)
        if want is None:
            expect_rowsum(out, sent, f"rowsum by handle {dt}{x.shape}")
        elif isinstance(want, tuple):
            expect_matmul(out, sent, want[1], None, dt, f"{check} by handle {dt}{x.shape}")
        else:
            expect_close(out, want, dt, f"{check} by handle {dt}{x.shape}")
        listed, used, quota = self.c.list_tensors()
        listed = {t.handle for t in listed}
        with LIVE_LOCK:
            others = {hh for hh, ten in LIVE.items() if ten != self.tenant}
        if not set(self.mine) <= listed:
            raise Wrong(f"ListTensors lacks {len(set(self.mine) - listed)} of this worker's tensors")
        if listed & others:
            raise Wrong(f"ListTensors shows {len(listed & others)} tensors of other tenants")
        if used < 0 or used > quota:
            raise Wrong(f"ListTensors: used {used} of quota {quota}")
        # Another tenant's live tensor is NOT_FOUND, like one that never existed.
        if others:
            victim = sorted(others)[int(self.rng.integers(0, len(others)))]
            self.expect_refused("download_other_tenants", {C.NOT_FOUND},
                                lambda: self.c.download(Handle(victim)))
        for hh in list(self.mine):
            want_bytes = None
            if hh == h:
                want_bytes = x.size * (4 if dt == "float32" else 2)
            freed = self.release(hh)
            if want_bytes is not None and freed != want_bytes:
                raise Wrong(f"FreeTensor freed {freed} bytes, want {want_bytes}")
        self.expect_refused("download_freed", {C.NOT_FOUND}, lambda: self.c.download(h))
        return "tensors"

    def deadline(self):
        """Softmax with a deadline of 0.1-3 ms: DEADLINE_EXCEEDED, or a result that is right.

        Through the stub rather than Client.softmax: about once in 10^4 such calls, gRPC's
        Python client returns status OK with no message when its deadline fires as the reply
        arrives (the server sends OK only with its message); that is counted apart, as
        deadline:OK_WITHOUT_MESSAGE (fusebox_client's own call raises AttributeError there).
        """
        dt = self.dtype()
        x = self.array((int(self.rng.integers(1, 64)), 4096))
        req = pb.SoftmaxRequest(input=pb.TensorRef(tensor=to_tensor(x, dt)))
        try:
            resp = self.c.stub.Softmax(req, timeout=float(self.rng.uniform(0.0001, 0.003)),
                                       metadata=self.c._metadata)
        except grpc.RpcError as e:
            if e.code() != C.DEADLINE_EXCEEDED:
                raise
            STATS.refused("deadline", e.code())
            return None
        if resp is None:
            with STATS.lock:
                STATS.expected["deadline:OK_WITHOUT_MESSAGE"] += 1
            return None
        expect_close(from_tensor(resp.output.tensor), softmax_ref(as_sent(x, dt)), dt,
                     "softmax under a short deadline")
        return "deadline"

    def cancel_unary(self):
        x = self.array((int(self.rng.integers(1, 64)), 4096))
        req = pb.GeluRequest(input=pb.TensorRef(tensor=pb.Tensor(
            dtype=pb.FLOAT32, shape=list(x.shape), data=x.tobytes())))
        fut = self.c.stub.Gelu.future(req, timeout=30, metadata=self.c._metadata)
        time.sleep(float(self.rng.uniform(0, 0.002)))
        fut.cancel()
        try:
            resp = fut.result()
        except grpc.FutureCancelledError:
            STATS.refused("cancel_unary", C.CANCELLED)
            return None
        except grpc.RpcError as e:
            if e.code() != C.CANCELLED:
                raise
            STATS.refused("cancel_unary", C.CANCELLED)
            return None
        if resp is None:  # as in deadline(): the client's cancel raced the reply
            with STATS.lock:
                STATS.expected["cancel_unary:OK_WITHOUT_MESSAGE"] += 1
            return None
        t = resp.output.tensor
        y = np.frombuffer(t.data, dtype="<f4").reshape(tuple(t.shape))
        expect_close(y, gelu_ref(x.astype(np.float64)), "float32", "gelu not cancelled in time")
        return "cancel_unary"

    def cancel_upload(self):
        x = self.array(CANCELLED_UPLOAD_SHAPE)  # 1 MiB, in 16 KiB messages
        data = x.tobytes()
        stop = threading.Event()

        def chunks():
            yield pb.UploadRequest(dtype=pb.FLOAT32, shape=list(x.shape), data=data[:16384])
            for off in range(16384, len(data), 16384):
                if stop.is_set():
                    return
                yield pb.UploadRequest(data=data[off:off + 16384])

        fut = self.c.stub.Upload.future(chunks(), timeout=30, metadata=self.c._metadata)
        time.sleep(float(self.rng.uniform(0, 0.005)))
        fut.cancel()
        stop.set()
        try:
            resp = fut.result()
        except (grpc.FutureCancelledError, grpc.RpcError) as e:
            if isinstance(e, grpc.RpcError) and e.code() != C.CANCELLED:
                raise
            STATS.refused("cancel_upload", C.CANCELLED)
            return None
        # It finished first: the tensor is there and whole.
        h = Handle(resp.tensor.handle)
        self.hold(h)
        if not np.array_equal(self.c.download(h), x):
            raise Wrong("an upload that beat its cancel holds other bytes")
        self.release(h)
        return "cancel_upload"

    def bad(self):
        stub, md = self.c.stub, self.c._metadata
        which = int(self.rng.integers(0, 9))
        inv = {C.INVALID_ARGUMENT}

        def call(method, req):
            return lambda: getattr(stub, method)(req, timeout=30, metadata=md)

        t32 = lambda shape, n: pb.TensorRef(tensor=pb.Tensor(dtype=pb.FLOAT32, shape=shape,  # noqa: E731
                                                             data=b"\0" * n))
        if which == 0:
            self.expect_refused("bad_byte_count", inv, call("Gelu", pb.GeluRequest(input=t32([2, 3], 20))))
        elif which == 1:
            req = pb.SoftmaxRequest(input=pb.TensorRef(tensor=pb.Tensor(shape=[2], data=b"\0" * 8)))
            self.expect_refused("bad_dtype", inv, call("Softmax", req))
        elif which == 2:
            b = pb.TensorRef(tensor=pb.Tensor(dtype=pb.FLOAT16, shape=[1, 1], data=b"\0" * 2))
            self.expect_refused("bad_mixed_dtypes", inv,
                                call("MatmulRelu", pb.MatmulReluRequest(a=t32([1, 1], 4), b=b)))
        elif which == 3:
            self.expect_refused("bad_scalar_softmax", inv, call("Softmax", pb.SoftmaxRequest(input=t32([], 4))))
        elif which == 4:
            self.expect_refused("bad_inner_dims", inv,
                                call("MatmulRelu", pb.MatmulReluRequest(a=t32([2, 3], 24), b=t32([4, 2], 32))))
        elif which == 5:
            def short_upload():
                msgs = iter([pb.UploadRequest(dtype=pb.FLOAT32, shape=[4], data=b"\0" * 8)])
                stub.Upload(msgs, timeout=30, metadata=md)
            self.expect_refused("bad_short_upload", inv, short_upload)
        elif which == 6:
            self.expect_refused("bad_unknown_handle", {C.NOT_FOUND},
                                call("RowSum", pb.RowSumRequest(input=pb.TensorRef(handle="t" + "0" * 32))))
        elif which == 7:
            self.expect_refused("bad_token", {C.UNAUTHENTICATED},
                                lambda: self.bad.gelu(np.ones(3, np.float32)))
        else:
            # INVALID_ARGUMENT; gRPC 1.51's own answer is UNIMPLEMENTED (issue 30, finding 11).
            self.expect_refused("bad_unparseable", {C.INVALID_ARGUMENT, C.UNIMPLEMENTED},
                                lambda: self.c.channel.unary_unary("/fusebox.v1.KernelService/Gelu")(
                                    b"\xff\xff\xff", timeout=30, metadata=md))
        return None

    ACTIONS = [(op_inline, 40), (tensors, 20), (deadline, 8), (cancel_unary, 6), (cancel_upload, 4),
               (bad, 22)]

    def run(self, stop_at):
        fns, weights = zip(*self.ACTIONS)
        p = np.array(weights, dtype=np.float64)
        p /= p.sum()
        while time.monotonic() < stop_at:
            fn = fns[int(self.rng.choice(len(fns), p=p))]
            try:
                name = fn(self)
                if name:
                    STATS.ok(name)
            except Wrong as e:
                STATS.fail(fn.__name__, f"wrong result: {e}")
            except Exception as e:  # noqa: BLE001
                code = code_of(e)
                STATS.fail(fn.__name__, f"unexpected {code.name if code else type(e).__name__}: {e}")
        # Leave nothing behind.
        for h in list(self.mine):
            try:
                self.release(h)
            except Exception as e:  # noqa: BLE001
                STATS.fail("cleanup", f"FreeTensor {h}: {e}")


# --- the server and its resources -------------------------------------------------------------

def start_server(token_file):
    binary = ARGS.server_bin or str(Path(ARGS.build_dir) / "server" / "fusebox-server")
    cmd = [binary, "--address=127.0.0.1:0", f"--token_file={token_file}", *ARGS.server_arg]
    if not any(a.startswith("--backend") for a in ARGS.server_arg):
        cmd.append("--backend=auto")
    log = open(f"{ARGS.out}.server.log", "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    m = re.search(rb"listening on (\S+):(\d+)", line[0]) if line and line[0] else None
    if not m:
        proc.kill()
        sys.exit(f"soak: {binary} did not start (see {ARGS.out}.server.log)")
    threading.Thread(target=lambda: proc.stdout.read(), daemon=True).start()
    print(f"soak: {line[0].decode().strip()}", flush=True)
    return proc, f"127.0.0.1:{int(m.group(2))}"


def device_mib(pid):
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout
        for row in out.splitlines():
            parts = [s.strip() for s in row.split(",")]
            if len(parts) == 2 and parts[0] == str(pid):
                return float(parts[1])
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return float(out.split()[0]) if out.split() else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def sample(pid):
    s = {"t_s": round(time.monotonic() - T0, 1), "calls": STATS.total(),
         "failures": STATS.failure_count}
    if pid:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            s["rss_mib"] = round(int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024, 2)
            s["threads"] = int(re.search(r"Threads:\s+(\d+)", status).group(1))
            s["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, AttributeError):
            s["rss_mib"] = s["threads"] = s["fds"] = None
        s["device_mib"] = device_mib(pid)
    return s


def growth(samples, key, t_from):
    pts = [(s["t_s"], s[key]) for s in samples if s.get(key) is not None and s["t_s"] >= t_from]
    if len(pts) < 3:
        return None, None
    t = np.array([p[0] for p in pts])
    v = np.array([p[1] for p in pts], dtype=np.float64)
    slope = np.polyfit(t, v, 1)[0]  # per second
    return slope, slope * (t[-1] - t[0])


def main():
    seed = ARGS.seed if ARGS.seed is not None else int.from_bytes(os.urandom(4), "little")
    tmp = tempfile.TemporaryDirectory(prefix="fusebox-soak-")
    proc = None
    if ARGS.address:
        address, pid = ARGS.address, ARGS.pid
        tokens = []
        if ARGS.token_file:
            for line in Path(ARGS.token_file).read_text().splitlines():
                line = line.split("#")[0].split()
                if len(line) == 2:
                    tokens.append((line[0], line[1]))
        if not tokens:
            tokens = [(None, "anonymous")]
    else:
        tokens = [(f"soak-token-{i}-{os.urandom(8).hex()}", f"tenant{i}") for i in range(ARGS.tenants)]
        token_file = Path(tmp.name) / "tokens"
        token_file.write_text("".join(f"{t} {n}\n" for t, n in tokens))
        proc, address = start_server(token_file)
        pid = proc.pid

        def stop(signum, _frame):  # a soak stopped from outside takes its server with it
            proc.kill()
            sys.exit(128 + signum)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    clients = [Client(address, timeout=60, token=t) for t, _ in tokens]
    for c in clients:
        if not c.wait_for_ready(30):
            sys.exit(f"soak: cannot reach {address}")
    bad_client = Client(address, timeout=60, token="not-a-token-" + os.urandom(4).hex())
    print(f"soak: {ARGS.duration:.0f} s, {ARGS.workers} workers, {len(tokens)} tenants, seed {seed}, "
          f"sampling every {ARGS.sample_every:g} s", flush=True)

    global T0
    T0 = time.monotonic()
    stop_at = T0 + ARGS.duration
    workers = [Worker(i, clients[i % len(clients)], tokens[i % len(tokens)][1],
                      np.random.default_rng([seed, i]), bad_client) for i in range(ARGS.workers)]
    threads = [threading.Thread(target=w.run, args=(stop_at,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    samples = []
    csv = open(f"{ARGS.out}.csv", "w")
    cols = ["t_s", "calls", "failures", "rss_mib", "threads", "fds", "device_mib"]
    csv.write(",".join(cols) + "\n")
    died = False
    next_sample = time.monotonic()
    while any(t.is_alive() for t in threads):
        if time.monotonic() >= next_sample:
            s = sample(pid)
            samples.append(s)
            csv.write(",".join("" if s.get(c) is None else str(s[c]) for c in cols) + "\n")
            csv.flush()
            try:
                if clients[0].health() != "SERVING":
                    STATS.fail("health", "the server is not SERVING")
                else:
                    STATS.ok("health")
            except FuseboxError as e:
                STATS.fail("health", str(e))
            if len(samples) % 12 == 1:
                print(f"soak: t={s['t_s']:.0f}s calls={s['calls']} failures={s['failures']} "
                      f"rss={s.get('rss_mib')} MiB threads={s.get('threads')} fds={s.get('fds')}"
                      + (f" device={s['device_mib']} MiB" if s.get("device_mib") is not None else ""),
                      flush=True)
            next_sample += ARGS.sample_every
        if proc is not None and proc.poll() is not None:
            died = True
            break
        time.sleep(0.2)
    for t in threads:
        t.join(60)
    if not died:
        s = sample(pid)
        samples.append(s)
        csv.write(",".join("" if s.get(c) is None else str(s[c]) for c in cols) + "\n")
    csv.close()
    elapsed = time.monotonic() - T0

    # Every tenant's tensors were freed by the workers: nothing may be left.
    # Uploads whose cancel raced their reply may have left their tensor (see
    # CANCELLED_UPLOAD_SHAPE): counted, then freed; anything else left is a failure.
    left, orphans = {}, 0
    if not died:
        for (_, name), c in zip(tokens, clients):
            try:
                held, used, _ = c.list_tensors()
                for t in held:
                    if t.shape == CANCELLED_UPLOAD_SHAPE and t.dtype == "float32":
                        orphans += 1
                        c.free(t.handle)
                    else:
                        left.setdefault(name, []).append(f"{t.dtype}{list(t.shape)}")
                if not held and used:
                    left.setdefault(name, []).append(f"{used} bytes held in no tensor")
            except FuseboxError as e:
                STATS.fail("final_list", str(e))
        if left:
            STATS.fail("final_list", f"tensors left behind: {left}")
        if orphans and ARGS.strict_orphans:
            STATS.fail("final_list", f"{orphans} cancelled uploads left their tensor")

    half = elapsed / 2
    limits = {"rss_mib": ARGS.rss_growth_mib, "threads": ARGS.thread_growth, "fds": ARGS.fd_growth,
              "device_mib": ARGS.device_growth_mib}
    growths, over = {}, []
    for key, limit in limits.items():
        slope, g = growth(samples, key, half)
        if slope is None:
            continue
        growths[key] = {"slope_per_min": round(slope * 60, 4), "second_half_growth": round(g, 3),
                        "limit": limit, "first": samples[0].get(key), "last": samples[-1].get(key),
                        "max": max(s[key] for s in samples if s.get(key) is not None)}
        if g > limit:
            over.append(f"{key} grew {g:.2f} over the second half (limit {limit:g})")

    exit_status = None
    if proc is not None and not died:
        proc.send_signal(signal.SIGTERM)
        try:
            exit_status = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            exit_status = "hung at SIGTERM"
        if exit_status != 0:
            STATS.fail("shutdown", f"the server exited {exit_status} after SIGTERM")
    elif died:
        exit_status = proc.returncode

    summary = {
        "seed": seed, "duration_s": round(elapsed, 1), "workers": ARGS.workers,
        "tenants": len(tokens), "address": address, "server_args": ARGS.server_arg,
        "results_checked": dict(STATS.calls), "calls_total": STATS.total(),
        "calls_per_s": round(STATS.total() / elapsed, 1), "refusals_expected": dict(STATS.expected),
        "failures": STATS.failure_count, "failure_examples": STATS.failures[:50],
        "tensors_left": left, "cancelled_uploads_left_held": orphans,
        "growth_second_half": growths, "over_tolerance": over,
        "server_died": died, "server_exit": exit_status, "samples": len(samples),
    }
    Path(f"{ARGS.out}.json").write_text(json.dumps(summary, indent=2) + "\n")

    print(f"soak: {summary['calls_total']} actions in {elapsed:.0f} s ({summary['calls_per_s']}/s): "
          f"{sum(STATS.calls.values())} results checked, {sum(STATS.expected.values())} refusals "
          f"as asked, {STATS.failure_count} failures")
    print("soak: results checked: " + ", ".join(f"{k} {v}" for k, v in sorted(STATS.calls.items())))
    print("soak: refusals as asked: " + ", ".join(f"{k} {v}" for k, v in sorted(STATS.expected.items())))
    print(f"soak: {orphans} cancelled uploads were held after all (their cancel came after the "
          f"reply went out; freed now)")
    for key, g in growths.items():
        print(f"soak: {key}: first {g['first']}, last {g['last']}, max {g['max']}; second half "
              f"slope {g['slope_per_min']:+.3f}/min, growth {g['second_half_growth']:+.2f} "
              f"(limit {g['limit']:g})")
    print(f"soak: wrote {ARGS.out}.csv, {ARGS.out}.json")
    if died:
        print(f"soak: FAIL: the server died (exit {exit_status})")
        return 3
    if STATS.failure_count:
        print(f"soak: FAIL: {STATS.failure_count} wrong results or unexpected errors")
        return 1
    if over:
        print("soak: FAIL: " + "; ".join(over))
        return 2
    print("soak: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
