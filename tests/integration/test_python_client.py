"""End to end through Python: a real fusebox-server (CPU backend, free port) called
from the fusebox_client package and from the `fusebox` CLI on .npy files.

Needs PYTHONPATH=<build>/python, FUSEBOX_SERVER_BIN and FUSEBOX_CLI_BIN (ctest sets
all three; by default they are looked up under build/).
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# The servers these tests start are forked from this multi-threaded process. grpcio from PyPI
# (1.85 here; not Debian's 1.51) runs fork handlers in such children that abort some of them
# (10 in 300). The children run no gRPC, so the handlers go, before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import grpc
import numpy as np
import pytest

from fusebox_client import (Client, FuseboxError, Handle, bfloat16_bits_to_float,
                            float_to_bfloat16_bits)
from fusebox.v1 import kernel_service_pb2 as pb
from oracle import TOL, as_sent, gelu_ref, rel_err, softmax_ref  # noqa: F401 (test_torch_client)

ROOT = Path(__file__).resolve().parents[2]
SERVER_BIN = os.environ.get("FUSEBOX_SERVER_BIN", str(ROOT / "build/server/fusebox-server"))
CLI_BIN = os.environ.get("FUSEBOX_CLI_BIN", str(ROOT / "build/client/fusebox"))
DTYPES = ["float32", "float16", "bfloat16"]


# Prefixes a command so that it gets SIGKILL when pytest dies (a ctest timeout leaves no
# server): util-linux's setpriv sets PR_SET_PDEATHSIG and execs it. Not a preexec_fn: Python
# code between fork and exec in a multi-threaded process can deadlock on a lock another thread
# held at the fork (seen: the import lock, a server start hung in _execute_child under load).
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]


class Server:
    """A fusebox-server child process; always killed by stop()/kill(), or with pytest.
    ``limits``: prlimit(1) options for it, e.g. "--nofile=256:256"."""

    def __init__(self, *flags, limits=(), stderr=None):
        prefix = DIE_WITH_PARENT + (["prlimit", *limits, "--"] if limits else [])
        self.proc = subprocess.Popen(
            prefix + [SERVER_BIN, "--address=127.0.0.1:0", "--backend=cpu", *flags],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=stderr)
        line = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        if not line or not line[0]:
            self.kill()
            raise RuntimeError(f"{SERVER_BIN} did not announce its address")
        self.first_line = line[0].decode()
        m = re.search(r"listening on (\S+):(\d+)", self.first_line)
        if not m:
            self.kill()
            raise RuntimeError(f"cannot parse server line: {self.first_line!r}")
        self.port = int(m.group(2))
        self.address = f"127.0.0.1:{self.port}"
        # Keep draining stdout so the server never blocks writing to it.
        threading.Thread(target=lambda: self.proc.stdout.read(), daemon=True).start()

    def stop(self, timeout=30):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()
    s.kill()


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address, timeout=30) as c:
        assert c.wait_for_ready(10)
        yield c


def fresh_rng():
    seed = int.from_bytes(os.urandom(8), "little")
    return seed, np.random.default_rng(seed)










def expect_still_serving(client):
    y = client.gelu(np.array([1.0, -1.0], dtype=np.float32))
    np.testing.assert_allclose(y, [0.841192, -0.158808], rtol=1e-5)


# --- the ops -----------------------------------------------------------------------------

def test_health_reports_serving(client):
    assert client.health() == "SERVING"


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_matches_numpy_reference(client, dtype):
    for shape in [(1,), (3, 7), (2, 3, 1000), (65537,)]:
        seed, rng = fresh_rng()
        x = rng.uniform(-4, 4, shape).astype(np.float32)
        if dtype == "float16":
            x = x.astype(np.float16)
        y = client.gelu(x, dtype=dtype)
        assert y.shape == shape
        assert y.dtype == (np.float16 if dtype == "float16" else np.float32)
        assert rel_err(y, gelu_ref(as_sent(x, dtype))) < TOL[dtype], f"seed {seed} shape {shape}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_numpy_reference(client, dtype):
    for shape in [(1,), (1, 3), (5, 1000), (2, 2, 33), (2, 65537)]:
        seed, rng = fresh_rng()
        x = rng.uniform(-4, 4, shape).astype(np.float32)
        y = client.softmax(x, dtype=dtype)
        assert y.shape == shape
        assert rel_err(y, softmax_ref(as_sent(x, dtype))) < TOL[dtype], f"seed {seed} shape {shape}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_rowsum_matches_numpy_reference_in_float32(client, dtype):
    for shape in [(7,), (1, 1), (3, 1000), (2, 3, 4097)]:
        seed, rng = fresh_rng()
        x = rng.uniform(-4, 4, shape).astype(np.float32)
        y = client.rowsum(x, dtype=dtype)
        assert y.dtype == np.float32
        assert y.shape == shape[:-1]
        sent = as_sent(x, dtype)
        np.testing.assert_allclose(y, sent.sum(-1), rtol=0,
                                   atol=1e-5 * np.abs(sent).sum(-1).max() + 1e-6,
                                   err_msg=f"seed {seed} shape {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_relu_matches_numpy_reference(client, dtype):
    for m, k, n, with_bias in [(1, 1, 1, False), (17, 33, 9, True), (64, 128, 32, False)]:
        seed, rng = fresh_rng()
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        bias = rng.uniform(-1, 1, n).astype(np.float32) if with_bias else None
        y = client.matmul_relu(a, b, bias, dtype=dtype)
        assert y.shape == (m, n)
        want = as_sent(a, dtype) @ as_sent(b, dtype)
        if with_bias:
            want = want + as_sent(bias, dtype)
        assert rel_err(y, np.maximum(want, 0)) < TOL[dtype], f"seed {seed} {m}x{k}x{n}"


def test_float16_arrays_map_directly(client):
    x = np.linspace(-3, 3, 64, dtype=np.float16).reshape(8, 8)
    y = client.softmax(x)
    assert y.dtype == np.float16
    assert rel_err(y, softmax_ref(x.astype(np.float64))) < TOL["float16"]


def test_bfloat16_output_as_bits_and_uint16_input_as_bits(client):
    x = np.array([[0.5, -1.25, 3.0]], dtype=np.float32)  # exact in bfloat16
    bits = float_to_bfloat16_bits(x)
    y_bits = client.gelu(bits, dtype="bfloat16", bf16_output="bits")
    assert y_bits.dtype == np.uint16 and y_bits.shape == (1, 3)
    y = client.gelu(x, dtype="bfloat16")
    np.testing.assert_array_equal(bfloat16_bits_to_float(y_bits), y)
    with pytest.raises(TypeError):
        client.gelu(bits)  # uint16 without dtype='bfloat16' is ambiguous


def test_bfloat16_conversion_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.0, np.inf, np.nan], dtype=np.float32)
    back = bfloat16_bits_to_float(float_to_bfloat16_bits(x))
    np.testing.assert_array_equal(back[:5], [1.0, 1.0, 1.015625, -2.0, np.inf])
    assert np.isnan(back[5])


def test_bfloat16_conversion_of_float64_rounds_once():
    e8, e30 = 2.0 ** -8, 2.0 ** -30
    x = np.array([1 + e8 + e30, -(1 + e8 + e30), 1 + e8, 1 + 3 * e8, 1 + e8 - e30, 1e300, -1e300, 1e-300,
                  np.nan], dtype=np.float64)
    bits = float_to_bfloat16_bits(x)
    assert [hex(b) for b in bits[:8]] == ["0x3f81", "0xbf81", "0x3f80", "0x3f82", "0x3f80", "0x7f80", "0xff80",
                                          "0x0"]
    assert np.isnan(bfloat16_bits_to_float(bits[8:]))[0]


def test_big_endian_input_is_the_same_values(client):
    x = np.linspace(-2, 2, 9).astype(">f4")
    np.testing.assert_allclose(client.gelu(x), gelu_ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_upload_refuses_a_chunk_size_below_one(client):
    for bad in (0, -4):
        with pytest.raises(ValueError, match="chunk_bytes must be > 0"):
            client.upload(np.ones(4, np.float32), chunk_bytes=bad)


def test_timing_is_reported(client):
    _, t = client.gelu(np.ones(1000, dtype=np.float32), return_timing=True)
    assert t.backend == "cpu"
    assert t.total_us > 0 and t.rpc_us > 0
    # No copies and no GPU launch on the CPU backend; launch_us is still there.
    assert t.copy_in_us == 0 and t.launch_us == 0 and t.copy_out_us == 0


def test_empty_tensor_gives_empty_output(client):
    y = client.gelu(np.zeros((0, 5), dtype=np.float32))
    assert y.shape == (0, 5)


# --- tensors held by the server ---------------------------------------------------------

def test_upload_keep_download_and_free(client):
    seed, rng = fresh_rng()
    x = rng.uniform(-4, 4, (300, 1000)).astype(np.float16)  # 600 kB, 3 chunks of 256 KiB
    h = client.upload(x, chunk_bytes=256 << 10)
    assert isinstance(h, Handle)
    np.testing.assert_array_equal(client.download(h), x)
    kept = client.gelu(h, keep=True)
    assert isinstance(kept, Handle)
    y = client.download(kept)
    assert y.dtype == np.float16 and y.shape == x.shape
    assert rel_err(y, gelu_ref(x.astype(np.float64))) < TOL["float16"], f"seed {seed}"
    sums = client.rowsum(kept)
    np.testing.assert_allclose(sums, y.astype(np.float64).sum(-1), rtol=1e-3, atol=1e-2)
    held = {t.handle for t in client.list_tensors()[0]}
    assert {h, kept} <= held
    assert client.free(h) == x.nbytes
    client.free(kept)
    with pytest.raises(FuseboxError) as e:
        client.download(h)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_matmul_relu_mixes_handles_and_arrays(client):
    seed, rng = fresh_rng()
    a = rng.uniform(-1, 1, (6, 5)).astype(np.float32)
    b = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    hb = client.upload(b)
    y = client.matmul_relu(a, hb, np.zeros(3, np.float32))
    assert rel_err(y, np.maximum(a.astype(np.float64) @ b, 0)) < 1e-5, f"seed {seed}"
    client.free(hb)


# --- bad input ---------------------------------------------------------------------------

def raw_call(client, method, req):
    from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc
    with pytest.raises(grpc.RpcError) as e:
        getattr(pb_grpc.KernelServiceStub(client.channel), method)(req, timeout=10)
    return e.value.code()


def test_wrong_byte_length_is_invalid_argument(client):
    req = pb.GeluRequest(input=pb.TensorRef(tensor=pb.Tensor(dtype=pb.FLOAT32, shape=[2, 3], data=b"\0" * 20)))
    assert raw_call(client, "Gelu", req) == grpc.StatusCode.INVALID_ARGUMENT
    expect_still_serving(client)


def test_unspecified_dtype_is_invalid_argument(client):
    req = pb.SoftmaxRequest(input=pb.TensorRef(tensor=pb.Tensor(shape=[2], data=b"\0" * 8)))
    assert raw_call(client, "Softmax", req) == grpc.StatusCode.INVALID_ARGUMENT
    expect_still_serving(client)


def test_mixed_dtypes_are_invalid_argument(client):
    a = pb.Tensor(dtype=pb.FLOAT32, shape=[1, 1], data=b"\0" * 4)
    b = pb.Tensor(dtype=pb.FLOAT16, shape=[1, 1], data=b"\0" * 2)
    req = pb.MatmulReluRequest(a=pb.TensorRef(tensor=a), b=pb.TensorRef(tensor=b))
    assert raw_call(client, "MatmulRelu", req) == grpc.StatusCode.INVALID_ARGUMENT
    expect_still_serving(client)


def test_inner_dims_that_differ_raise_fusebox_error(client):
    with pytest.raises(FuseboxError) as e:
        client.matmul_relu(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details
    expect_still_serving(client)


def test_rank_zero_softmax_raises_invalid_argument(client):
    with pytest.raises(FuseboxError) as e:
        client.softmax(np.float32(1.0))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    expect_still_serving(client)


# --- the CLI -----------------------------------------------------------------------------

def cli(*args, timeout=60):
    return subprocess.run([CLI_BIN, *args], capture_output=True, text=True, timeout=timeout)


def test_cli_gelu_round_trips_npy_and_prints_timing(server, tmp_path):
    seed, rng = fresh_rng()
    x = rng.uniform(-4, 4, (16, 33)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("--server", server.address, "gelu", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"))
    assert r.returncode == 0, r.stderr
    assert "kernel" in r.stdout and "round trip" in r.stdout
    assert re.search(r"copy_in [\d.]+  launch 0\.0  kernel [\d.]+  copy_out", r.stdout), r.stdout
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float32 and y.shape == x.shape
    assert rel_err(y, gelu_ref(x.astype(np.float64))) < TOL["float32"], f"seed {seed}"


def test_cli_float16_softmax_and_rowsum(server, tmp_path):
    seed, rng = fresh_rng()
    x = rng.uniform(-4, 4, (5, 100)).astype(np.float16)
    np.save(tmp_path / "x.npy", x)
    r = cli("--server", server.address, "softmax", str(tmp_path / "x.npy"), "-o", str(tmp_path / "s.npy"))
    assert r.returncode == 0, r.stderr
    s = np.load(tmp_path / "s.npy")
    assert s.dtype == np.float16
    assert rel_err(s, softmax_ref(x.astype(np.float64))) < TOL["float16"], f"seed {seed}"
    r = cli("--server", server.address, "rowsum", str(tmp_path / "x.npy"), "-o", str(tmp_path / "r.npy"), "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    rs = np.load(tmp_path / "r.npy")
    assert rs.dtype == np.float32 and rs.shape == (5,)
    np.testing.assert_allclose(rs, x.astype(np.float64).sum(-1), atol=1e-3)


def test_cli_matmul_relu_bfloat16_with_bias(server, tmp_path):
    seed, rng = fresh_rng()
    a = rng.uniform(-1, 1, (9, 20)).astype(np.float32)
    b = rng.uniform(-1, 1, (20, 7)).astype(np.float64)  # float64 files are accepted too
    bias = rng.uniform(-1, 1, 7).astype(np.float32)
    for name, arr in [("a", a), ("b", b), ("bias", bias)]:
        np.save(tmp_path / f"{name}.npy", arr)
    out = tmp_path / "y.npy"
    r = cli("--server", server.address, "matmul_relu", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
            str(tmp_path / "bias.npy"), "-o", str(out), "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    y = np.load(out)
    assert y.dtype == np.float32 and y.shape == (9, 7)  # bf16 result widened to float32
    want = np.maximum(as_sent(a, "bfloat16") @ as_sent(b.astype(np.float32), "bfloat16")
                      + as_sent(bias, "bfloat16"), 0)
    assert rel_err(y, want) < TOL["bfloat16"], f"seed {seed}"
    r = cli("--server", server.address, "matmul_relu", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
            "-o", str(out), "--dtype", "bfloat16", "--bf16_bits", "-q")
    assert r.returncode == 0, r.stderr
    assert np.load(out).dtype == np.uint16


def test_cli_reports_server_errors_and_usage_errors(server, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((2, 3), np.float32))
    np.save(tmp_path / "b.npy", np.ones((4, 2), np.float32))
    r = cli("--server", server.address, "matmul_relu", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
            "-o", str(tmp_path / "y.npy"))
    assert r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr
    r = cli("--server", server.address, "gelu", str(tmp_path / "missing.npy"), "-o", str(tmp_path / "y.npy"))
    assert r.returncode == 1 and "missing.npy" in r.stderr
    assert cli("--server", server.address, "gelu", str(tmp_path / "a.npy")).returncode == 2  # no -o
    assert cli("frobnicate").returncode == 2
    h = cli("--help")
    assert h.returncode == 0 and "matmul_relu" in h.stdout and "bfloat16" in h.stdout


def test_cli_upload_keep_download_free_list(server, tmp_path):
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    np.save(tmp_path / "x.npy", x)
    r = cli("--server", server.address, "upload", str(tmp_path / "x.npy"))
    assert r.returncode == 0, r.stderr
    h = r.stdout.split()[0]
    r = cli("--server", server.address, "softmax", "@" + h, "--keep", "-q")
    assert r.returncode == 0, r.stderr
    kept = r.stdout.strip()
    r = cli("--server", server.address, "download", kept, "-o", str(tmp_path / "s.npy"))
    assert r.returncode == 0, r.stderr
    assert rel_err(np.load(tmp_path / "s.npy"), softmax_ref(x.astype(np.float64))) < 1e-5
    r = cli("--server", server.address, "list")
    assert r.returncode == 0 and h in r.stdout and kept in r.stdout
    assert cli("--server", server.address, "free", h, kept).returncode == 0
    r = cli("--server", server.address, "download", h, "-o", str(tmp_path / "gone.npy"))
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr


def test_cli_on_off_flags_take_true_or_false(server, tmp_path):
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    before = cli("--server", server.address, "list").stdout
    r = cli("--server", server.address, "gelu", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
            "--keep=false", "--quiet=0")
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "y.npy").shape == (8,)  # written, not kept
    assert cli("--server", server.address, "list").stdout == before
    r = cli("--server", server.address, "gelu", str(tmp_path / "x.npy"), "--keep=true", "-q")
    assert r.returncode == 0, r.stderr
    handle = r.stdout.strip()
    assert handle in cli("--server", server.address, "list").stdout
    assert cli("--server", server.address, "free", handle).returncode == 0
    r = cli("--server", server.address, "gelu", str(tmp_path / "x.npy"), "--keep=maybe")
    assert r.returncode == 2 and "--keep" in r.stderr


# "(commit abc1234, Release build)"; a sanitizer build says so: "(commit ..., RelWithDebInfo,
# sanitizers address,undefined build)".
VERSION_TAIL = r"\(commit [0-9a-f]{7,}(-dirty)?, \w+(, sanitizers [\w,]+)? build\)\n"


def test_cli_version_names_the_version_commit_and_build_type():
    r = cli("--version")
    assert r.returncode == 0
    assert re.fullmatch(r"fusebox \d+\.\d+\.\d+ " + VERSION_TAIL, r.stdout), r.stdout


def test_server_version_names_this_build_not_abseils():
    r = subprocess.run([SERVER_BIN, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert re.fullmatch(r"fusebox-server \d+\.\d+\.\d+ " + VERSION_TAIL, r.stdout), r.stdout
    assert "NDEBUG" not in r.stdout


def test_cli_subcommands_have_their_own_help():
    def options(*args):
        r = cli(*args, "--help")
        assert r.returncode == 0, r.stderr
        return {w.split(",")[-1] for w in (line.split()[0] for line in r.stdout.splitlines()
                                           if line.startswith("  -"))}
    assert {"--allow_tf32", "--impl", "--output"} <= options("matmul_relu")
    assert "--chunk_mib" not in options("matmul_relu")
    assert "--chunk_mib" in options("upload") and "--allow_tf32" not in options("upload")
    assert "--server" in options()


def test_cli_dash_reads_standard_input_and_writes_standard_output(server, tmp_path):
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([CLI_BIN, "--server", server.address, "gelu", "-", "-o", "-"],
                       stdin=open(tmp_path / "x.npy", "rb"), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    import io
    np.testing.assert_allclose(np.load(io.BytesIO(r.stdout)), gelu_ref(x.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)
    assert b"server timing" in r.stderr  # the text moved out of the way of the data
    # A pipe, not a file: read whole instead of mapped.
    r = subprocess.run([CLI_BIN, "--server", server.address, "rowsum", "-", "-o", "-", "-q"],
                       input=(tmp_path / "x.npy").read_bytes(), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(io.BytesIO(r.stdout)), x.sum(-1), rtol=1e-6)
    assert not (Path.cwd() / "-").exists()


def test_cli_progress_line_on_upload_and_download(server, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros(3 << 18, np.float32))  # 3 MiB
    r = cli("--server", server.address, "upload", str(tmp_path / "x.npy"), "--chunk_mib", "1",
            "--progress")
    assert r.returncode == 0, r.stderr
    assert "upload: 3.0 of 3.0 MiB (100%)" in r.stderr
    h = r.stdout.split()[0]
    r = cli("--server", server.address, "download", h, "-o", str(tmp_path / "y.npy"), "--progress")
    assert r.returncode == 0 and "download: 3.0 of 3.0 MiB (100%)" in r.stderr, r.stderr
    assert cli("--server", server.address, "free", h).returncode == 0


@pytest.mark.skipif(bool(os.environ.get("FUSEBOX_SANITIZE")),
                    reason="a sanitizer's shadow memory and quarantine are part of the RSS")
def test_cli_holds_an_uploaded_npy_in_memory_about_once(server, tmp_path):
    n = 128 << 20
    np.save(tmp_path / "big.npy", np.ones(n // 4, np.float32))
    # A fresh interpreter whose only child is the CLI: its children's peak RSS is the CLI's.
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", probe, CLI_BIN, "--server", server.address, "-q",
                        "upload", str(tmp_path / "big.npy")],
                       capture_output=True, text=True, timeout=120)
    rc, peak_kib = r.stdout.split()[-2:]
    assert rc == "0", r.stderr
    # The data once, as np.load holds it, plus the process (17 MB): not a stream buffer, a copy
    # of the file and the tensor on top, nor the mapped file's pages.
    assert int(peak_kib) * 1024 < n + (48 << 20), f"peak RSS {peak_kib} KiB for {n} bytes"
    h = r.stdout.split()[0]
    assert cli("--server", server.address, "free", h).returncode == 0


def test_cli_health_prints_serving(server):
    r = cli("--server", server.address, "health")
    assert r.returncode == 0 and r.stdout.strip() == "SERVING"


def test_example_script_runs(server):
    r = subprocess.run([sys.executable, str(ROOT / "client/python/example.py"), server.address],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "health: SERVING" in r.stdout


# --- lifecycle (own server) --------------------------------------------------------------

def test_sigterm_makes_server_exit_zero():
    s = Server()
    try:
        with Client(s.address) as c:
            assert c.wait_for_ready(10)
            c.gelu(np.ones(10, np.float32))
        t0 = time.monotonic()
        assert s.stop(30) == 0
        assert time.monotonic() - t0 < 30
    finally:
        s.kill()


def _proc_status(pid, key):
    """A number from /proc/PID/status: VmRSS in KiB, Threads, ..."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key + ":"))


def _h2_connect(port, timeout=None):
    """A raw HTTP/2 client connection to a server on loopback: (socket, h2 connection)."""
    import socket

    import h2.config
    import h2.connection
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    return sock, conn


def _grpc_headers(path):
    return [(":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]


def _push_unfinished_requests(port, streams, request_bytes, seconds):
    """Opens `streams` Gelu calls on one raw HTTP/2 connection and sends each all but the last
    byte of a `request_bytes` message, as fast as flow control lets, for `seconds`; yields,
    after every round, the ids of the streams the server reset (all, once it closes the
    connection) and the bytes it took."""
    import select

    import h2.events
    import h2.exceptions
    sock, conn = _h2_connect(port)
    left, reset = {}, set()
    for _ in range(streams):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, _grpc_headers("/fusebox.v1.KernelService/Gelu"))
        conn.send_data(sid, b"\0" + request_bytes.to_bytes(4, "big"))  # gRPC's message prefix
        left[sid] = request_bytes - 1
    chunk = bytes(16384)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for sid in left:
            while sid not in reset and left[sid] > 0:
                n = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size,
                        left[sid], len(chunk))
                if n <= 0:
                    break
                conn.send_data(sid, chunk[:n])
                left[sid] -= n
        try:
            sock.sendall(conn.data_to_send())
            data = sock.recv(1 << 20) if select.select([sock], [], [], 0.005)[0] else None
        except OSError:  # closed before its GOAWAY was read
            reset.update(left)
            yield reset, sum(request_bytes - 1 - v for v in left.values())
            break
        if data is not None:
            if not data:
                break
            try:
                events = conn.receive_data(data)
            except h2.exceptions.ProtocolError:  # frames after a GOAWAY in the same read
                if conn.state_machine.state != h2.connection.ConnectionState.CLOSED:
                    raise
                events = [h2.events.ConnectionTerminated()]
            closed = False
            for ev in events:
                if isinstance(ev, h2.events.StreamReset):
                    reset.add(ev.stream_id)
                elif isinstance(ev, h2.events.ConnectionTerminated):  # GOAWAY: all of them
                    reset.update(left)
                    closed = True
            if closed:
                yield reset, sum(request_bytes - 1 - v for v in left.values())
                break
        yield reset, sum(request_bytes - 1 - v for v in left.values())
    sock.close()


def test_requests_left_unfinished_are_refused_not_buffered():
    # 32 requests of 15 MiB, each sent but for its last byte: 480 MiB that gRPC would hold
    # until the connection ends. Its memory quota (here 2 x 16 MiB) resets them instead.
    pytest.importorskip("h2")
    s = Server("--max_message_bytes=16777216", "--inflight_mib=16", "--malloc_retain_mib=0")
    try:
        idle = peak = _proc_status(s.proc.pid, "VmRSS") // 1024
        reset, took = set(), 0
        for reset, took in _push_unfinished_requests(s.port, 32, 15 << 20, 4):
            peak = max(peak, _proc_status(s.proc.pid, "VmRSS") // 1024)
        assert len(reset) >= 24, (len(reset), took >> 20)
        assert peak - idle < 200, f"the server grew {peak - idle} MiB for {took >> 20} MiB sent"
        # gRPC frees the reset connection's buffers asynchronously; until then its memory quota
        # is still under pressure and may GOAWAY the next connection (UNAVAILABLE, which a
        # client retries). What must hold is that the server serves again, not at once.
        deadline = time.monotonic() + 10
        while True:
            with Client(s.address) as c:
                try:
                    expect_still_serving(c)
                    break
                except FuseboxError as e:
                    if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
            time.sleep(0.2)
    finally:
        s.kill()


def _closed_by_server(sock):
    """Whether the server has closed this connection (what it sent is read and dropped)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _idle_connections(port, n, timeout=5):
    """Up to n TCP connections to the server that send nothing (those that fail to connect in
    `timeout` are left out)."""
    import socket
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        except OSError:
            pass
    return socks


def test_a_flood_of_idle_connections_past_the_descriptor_limit_loses_nothing():
    # gRPC 1.51 accepts no connection ever again after an accept fails for want of descriptors
    # (here the server is held to 256). The connection limit keeps it below that (93 here):
    # the flood's surplus is closed at once, the server stays up with its tensors, and serves
    # once the flood ends.
    s = Server(limits=["--nofile=256:256"])
    socks = []
    try:
        with Client(s.address) as c:  # kept past this client: another downloads it
            h = c.upload(np.arange(1000, dtype=np.float32)).release()
        socks = _idle_connections(s.port, 400, timeout=0.5)
        time.sleep(1)
        assert s.proc.poll() is None, "the server exited"
        held = len(socks) - sum(_closed_by_server(k) for k in socks)
        assert held <= 128, f"{held} of {len(socks)} connections held"
        for k in socks:
            k.close()
        with Client(s.address, timeout=10) as c:
            assert c.wait_for_ready(10)
            np.testing.assert_array_equal(c.download(h), np.arange(1000, dtype=np.float32))
        assert s.stop(30) == 0
    finally:
        for k in socks:
            k.close()
        s.kill()


def test_connections_past_the_limit_are_closed_at_once_and_silent_ones_after_the_handshake():
    s = Server("--max_connections=20", "--handshake_timeout_s=1")
    socks = []
    try:
        socks = _idle_connections(s.port, 60)
        time.sleep(0.5)
        assert sum(_closed_by_server(k) for k in socks) == 40
        with Client(s.address, timeout=5) as c:  # the limit is full
            with pytest.raises(FuseboxError) as e:
                c.gelu(np.ones(4, np.float32))
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
        time.sleep(1.5)  # past the handshake timeout: the silent ones are gone too
        assert sum(_closed_by_server(k) for k in socks) == 60
        with Client(s.address) as c:
            expect_still_serving(c)
    finally:
        for k in socks:
            k.close()
        s.kill()


def test_a_connection_may_open_at_most_100_streams_at_once():
    # Streams whose requests never finish cost gRPC memory until their connection ends.
    pytest.importorskip("h2")
    import h2.events
    s = Server()
    try:
        sock, conn = _h2_connect(s.port, timeout=10)
        sock.sendall(conn.data_to_send())
        settings = None
        while settings is None:
            for ev in conn.receive_data(sock.recv(65536)):
                if isinstance(ev, h2.events.RemoteSettingsChanged):
                    settings = ev
        assert conn.remote_settings.max_concurrent_streams == 100
        sock.close()
    finally:
        s.kill()


def test_requests_that_never_finish_arriving_lose_their_connection_after_the_arrival_timeout():
    # gRPC runs no handler before a request is whole and gives it no deadline to arrive in:
    # 10 connections of 100 streams, each sent its headers and 512 bytes of a 1 MiB body, would
    # be held for ever. A connection with no call being served that receives less than 1 MiB/s
    # is closed after --arrival_timeout_s.
    pytest.importorskip("h2")
    import h2.events
    s = Server("--arrival_timeout_s=1")
    conns = []
    try:
        idle = _proc_status(s.proc.pid, "VmRSS")
        for _ in range(10):
            sock, conn = _h2_connect(s.port, timeout=10)
            for _ in range(100):
                sid = conn.get_next_available_stream_id()
                conn.send_headers(sid, _grpc_headers("/fusebox.v1.KernelService/Gelu"))
                conn.send_data(sid, b"\0" + (1 << 20).to_bytes(4, "big") + bytes(512))
            sock.sendall(conn.data_to_send())
            conns.append((sock, conn))
        t0 = time.monotonic()
        time.sleep(0.5)
        held = _proc_status(s.proc.pid, "VmRSS") - idle
        closed = set()
        while len(closed) < len(conns) and time.monotonic() - t0 < 10:
            for i, (sock, conn) in enumerate(conns):
                if i not in closed and _closed_by_server(sock):
                    closed.add(i)
            time.sleep(0.05)
        took = time.monotonic() - t0
        assert len(closed) == len(conns), f"{len(conns) - len(closed)} connections still held"
        assert took < 4, f"closed after {took:.1f} s"
        print(f"1000 unfinished requests held {held} KiB for {took:.1f} s")
        with Client(s.address) as c:
            expect_still_serving(c)
    finally:
        for sock, _ in conns:
            sock.close()
        s.kill()


def test_open_reflection_streams_take_a_bounded_number_of_threads():
    # Reflection is a synchronous service: each open stream holds a thread. 200 streams left
    # open on one connection take at most the quota's 32, and the server keeps serving.
    pytest.importorskip("h2")
    s = Server()
    try:
        before = _proc_status(s.proc.pid, "Threads")
        sock, conn = _h2_connect(s.port)
        for _ in range(200):
            conn.send_headers(conn.get_next_available_stream_id(), _grpc_headers(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"))
        sock.sendall(conn.data_to_send())
        time.sleep(2)
        grew = _proc_status(s.proc.pid, "Threads") - before
        assert grew <= 40, f"{grew} more threads for 200 open reflection streams"
        with Client(s.address) as c:
            expect_still_serving(c)
        sock.close()
    finally:
        s.kill()


@pytest.mark.parametrize("flag, says", [
    ("--queue_capacity=-1", "--queue_capacity must be >= 1"),
    ("--workers=0", "--workers must be >= 1"),
    ("--streams=65", "--streams must be in 1..64"),
    ("--cuda_device=-1", "--cuda_device must be >= 0"),
    ("--staging_mib=-1", "--staging_mib must be in 0..1048576"),
    ("--copy_threads=-1", "--copy_threads must be in 0..64"),
    ("--copy_threads=65", "--copy_threads must be in 0..64"),
    ("--batch_wait_us=-1", "--batch_wait_us must be in 0..1000000"),
    ("--batch_wait_us=1000001", "--batch_wait_us must be in 0..1000000"),
    ("--store_budget_mib=17592186044416", "must be in 0..8796093022207"),  # 2^44 MiB: past int64 bytes
    ("--max_tensor_mib=-1", "must be in 0..8796093022207"),
    ("--inflight_mib=-1", "--inflight_mib must be in 0..8796093022207"),
    ("--max_tensors=0", "--max_tensors must be >= 1"),
    ("--max_tensors_per_tenant=-1", "--max_tensors_per_tenant must be >= 0"),
    ("--tenant_inflight_share=1.5", "--tenant_inflight_share must be in 0..1"),
    ("--tenant_inflight_share=nan", "--tenant_inflight_share must be in 0..1"),
    ("--max_connections=0", "--max_connections must be in 1..1048576"),
    ("--handshake_timeout_s=0", "--handshake_timeout_s must be in (0, 3600]"),
    ("--arrival_timeout_s=-1", "--arrival_timeout_s must be in 0..86400"),
    ("--max_streams_per_connection=0", "--max_streams_per_connection must be in 1..100000"),
    ("--matmul_impl=fast", "--matmul_impl must be cublaslt or tiled"),
    ("--malloc_retain_mib=17592186044416", "--malloc_retain_mib must be in 0..8796093022207"),
    ("--malloc_arenas=-1", "--malloc_arenas must be in 0..1024"),
    ("--drain_seconds=nan", "--stall_timeout_s must be in 0..86400"),
    ("--shutdown_notice_s=inf", "--stall_timeout_s must be in 0..86400"),
    ("--stall_timeout_s=-1", "--stall_timeout_s must be in 0..86400"),
    ("--idle_expiry_s=nan", "--idle_expiry_s must be in 0..315360000"),
    ("--idle_expiry_s=1e12", "--idle_expiry_s must be in 0..315360000"),
    ("--max_message_bytes=0", "--max_message_bytes must be in 65536..2147483647"),
    ("--max_message_bytes=200", "--max_message_bytes must be in 65536..2147483647"),
    ("--address=127.0.0.1:99999", "the port must be a number in 0..65535"),
    ("--address=localhost", "HOST:PORT needs the port"),
    ("--address=::1", "an IPv6 address takes the form [V6]:PORT"),
    ("--backend=bogus", "--backend=bogus is unknown"),
])
def test_server_refuses_out_of_range_flags_before_starting(flag, says):
    r = subprocess.run([SERVER_BIN, "--address=127.0.0.1:0", flag], capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert says in r.stderr
    assert "listening" not in r.stdout


def test_a_unix_socket_address_is_served_and_announced_as_given(tmp_path):
    path = tmp_path / "fusebox.sock"
    proc = subprocess.Popen(DIE_WITH_PARENT + [SERVER_BIN, f"--address=unix:{path}", "--backend=cpu"],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline().decode()
        assert f"listening on unix:{path} " in line, line
        with Client(f"unix:{path}", timeout=30) as c:
            expect_still_serving(c)
        from fusebox_client import _native
        if _native.library() is not None:  # a large call: the native transport, same socket
            x = np.linspace(-4, 4, 1 << 19, dtype=np.float32)
            with Client(f"unix:{path}", timeout=30, native=True) as c:
                np.testing.assert_allclose(c.gelu(x), gelu_ref(x), rtol=1e-5, atol=1e-6)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cuda_only_flags_do_not_stop_a_cpu_server():
    s = Server("--streams=100", "--staging_mib=4096")
    try:
        assert "backend=cpu" in s.first_line
        assert s.stop(30) == 0
    finally:
        s.kill()


def test_sigterm_right_after_start_drains_and_exits_zero_every_time():
    # OpenBLAS starts a thread before main; a signal it took used to kill the server (-15).
    for _ in range(25):
        s = Server()
        try:
            assert s.stop(30) == 0
        finally:
            s.kill()


def _throttling_proxy(port, bytes_per_second):
    """A loopback TCP proxy to the server that passes what clients send at a set rate (a slow
    link) and the server's bytes as they come; returns its port."""
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def pump(src, dst, rate):
        try:
            while True:
                data = src.recv(16384)
                if not data:
                    break
                dst.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        for k in (src, dst):
            try:
                k.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def accept():
        while True:
            client, _ = listener.accept()
            server = socket.create_connection(("127.0.0.1", port))
            for src, dst, rate in ((client, server, bytes_per_second), (server, client, 0)):
                threading.Thread(target=pump, args=(src, dst, rate), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def test_sigterm_refuses_a_request_still_arriving_at_once_and_lets_calls_in_flight_finish():
    # A Gelu request of 18 MiB has sent its first 60 KiB when SIGTERM comes. gRPC takes no new
    # call once shutdown has begun, so it can never complete: its connection closes at once
    # (UNAVAILABLE to a client), instead of once the request has all arrived or the drain has
    # run out. An Upload under way (8 MiB over an 8 MB/s link) finishes.
    pytest.importorskip("h2")
    s = Server()
    try:
        uploader = Client(f"127.0.0.1:{_throttling_proxy(s.port, 8e6)}", timeout=60)
        assert uploader.wait_for_ready(10)
        sock, conn = _h2_connect(s.port, timeout=30)
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, _grpc_headers("/fusebox.v1.KernelService/Gelu"))
        conn.send_data(sid, b"\0" + (18 << 20).to_bytes(4, "big"))
        for _ in range(4):  # within the stream's first window
            conn.send_data(sid, bytes(15 << 10))
        sock.sendall(conn.data_to_send())
        result = {}

        def upload():
            result["handle"] = uploader.upload(np.ones(2 << 20, np.float32), chunk_bytes=1 << 20)

        uploading = threading.Thread(target=upload)
        uploading.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        while sock.recv(65536):  # GOAWAY, then the end
            pass
        closed = time.monotonic() - t0
        assert closed < 1, f"the connection of a request still arriving closed {closed:.1f} s " \
                           "after SIGTERM"
        uploading.join(60)
        assert "handle" in result, "the upload under way did not finish"
        assert s.proc.wait(30) == 0
        sock.close()
        uploader.close()
    finally:
        s.kill()


def test_a_second_signal_during_the_notice_is_absorbed():
    s = Server("--shutdown_notice_s=1")
    try:
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert s.stop(30) == 0  # a second SIGTERM
    finally:
        s.kill()


# scripts/sanitize.sh sets FUSEBOX_SANITIZE to the sanitizers the server was built with. Under
# ASan and TSan, operator new reports an allocation that fails and aborts: it never throws
# std::bad_alloc, the path this test is about (and the address-space limit it sets would
# count their shadow memory). The plain build runs it.
@pytest.mark.skipif(bool(os.environ.get("FUSEBOX_SANITIZE")),
                    reason="a sanitizer's operator new aborts instead of throwing std::bad_alloc")
def test_an_output_the_host_cannot_allocate_is_resource_exhausted_and_serving_goes_on():
    from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc
    probe = Server()
    try:
        status = Path(f"/proc/{probe.proc.pid}/status").read_text()
        vm = int(re.search(r"VmSize:\s+(\d+) kB", status).group(1)) << 10
    finally:
        probe.stop()
    limit = vm + (512 << 20)  # the server's address space at rest, and 512 MiB more
    s = Server(limits=[f"--as={limit}:{limit}"])
    try:
        # An outer product of [16384, 1] and [1, 16384]: 128 KiB in, 1 GiB out, inline.
        n = 1 << 14
        col = pb.Tensor(dtype=pb.FLOAT32, shape=[n, 1], data=bytes(4 * n))
        row = pb.Tensor(dtype=pb.FLOAT32, shape=[1, n], data=bytes(4 * n))
        req = pb.MatmulReluRequest(a=pb.TensorRef(tensor=col), b=pb.TensorRef(tensor=row))
        with grpc.insecure_channel(s.address) as ch:
            stub = pb_grpc.KernelServiceStub(ch)
            for _ in range(2):
                with pytest.raises(grpc.RpcError) as e:
                    stub.MatmulRelu(req, timeout=60)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
                assert "out of host memory" in e.value.details()
        with Client(s.address) as c:
            expect_still_serving(c)
        assert s.stop(30) == 0
    finally:
        s.kill()


def test_download_default_chunks_fit_a_stock_grpc_client(client, server):
    from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc
    x = np.arange(3 << 20, dtype=np.float32)  # 12 MiB: three default chunks and a bit
    h = client.upload(x)
    try:
        with grpc.insecure_channel(server.address) as ch:  # gRPC's default 4 MiB receive limit
            stub = pb_grpc.KernelServiceStub(ch)
            parts = [m.data for m in stub.Download(pb.DownloadRequest(handle=h.id), timeout=30)]
        assert np.array_equal(np.frombuffer(b"".join(parts), np.float32), x)
    finally:
        client.free(h)


# --- requests the server parses itself ----------------------------------------------------

def _varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _len_field(number, *body):
    size = sum(len(b) for b in body)
    return b"".join([_varint(number << 3 | 2), _varint(size), *body])


def _peak_rss_kib_during(pid, action):
    """Runs action(); returns its result and the server's peak VmRSS meanwhile, in KiB, and its
    VmRSS before."""
    clear = Path(f"/proc/{pid}/clear_refs")
    clear.write_text("5")  # resets VmHWM to the current VmRSS
    before = _proc_status(pid, "VmRSS")
    result = action()
    return result, _proc_status(pid, "VmHWM"), before


@pytest.mark.parametrize("what", ["shape", "unknown fields"])
def test_a_request_that_would_swell_in_parsing_is_refused_before_it_is(what):
    # Parsing turns each one-byte packed shape value into 8 bytes of a field grown by doubling
    # (95 MB became 1.14 GB), and each 3-byte field the schema does not know into an entry of
    # the unknown-field set. The server checks the wire bytes first, before the token too.
    s = Server("--malloc_retain_mib=0")
    try:
        n = 95_000_000
        if what == "shape":
            body = _len_field(1, _len_field(1, b"\x08\x01", _len_field(2, b"\x01" * n)))
            says = "fusebox.v1.Tensor.shape has more than 64 values"
        else:
            body = b"\xa0\x01\x00" * (n // 3)  # field 20, empty, again and again
            says = "fields this server does not know"
        with grpc.insecure_channel(s.address) as ch:
            gelu = ch.unary_unary("/fusebox.v1.KernelService/Gelu")  # bytes in, bytes out
            grpc.channel_ready_future(ch).result(timeout=10)

            def call():
                with pytest.raises(grpc.RpcError) as e:
                    gelu(body, timeout=60)
                return e.value
            err, peak, before = _peak_rss_kib_during(s.proc.pid, call)
        grew = (peak - before) << 10
        print(f"{what}: a {len(body) >> 20} MiB request raised the server's RSS by "
              f"{grew >> 20} MiB at its peak")
        assert grew < 2 * len(body), f"{grew >> 20} MiB for a {len(body) >> 20} MiB request"
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert says in err.details()
        with Client(s.address) as c:
            expect_still_serving(c)
    finally:
        s.kill()


def _free_port():
    import socket
    with socket.socket() as k:
        k.bind(("127.0.0.1", 0))
        return k.getsockname()[1]


def test_bodies_that_do_not_parse_are_invalid_argument_counted_and_logged_at_most_a_little(
        tmp_path):
    import urllib.request
    metrics_port = _free_port()
    log = tmp_path / "stderr"
    with open(log, "wb") as err:
        s = Server(f"--metrics_address=127.0.0.1:{metrics_port}", stderr=err)
    try:
        methods = ["Gelu", "Softmax", "RowSum", "MatmulRelu", "Upload", "Download", "FreeTensor",
                   "ListTensors"]
        with grpc.insecure_channel(s.address) as ch:
            for m in methods:  # not protobuf at all
                with pytest.raises(grpc.RpcError) as e:
                    ch.unary_unary(f"/fusebox.v1.KernelService/{m}")(b"\xff\xff\xff", timeout=30)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (m, e.value)
                assert "not a well-formed protobuf message" in e.value.details(), m
            free = ch.unary_unary("/fusebox.v1.KernelService/FreeTensor")
            for _ in range(200):  # a handle that is not UTF-8: protobuf would log each
                with pytest.raises(grpc.RpcError) as e:
                    free(_len_field(1, b"\xc3\x28"), timeout=30)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
                assert "is not valid UTF-8" in e.value.details()
            # Reflection is parsed by protobuf, which logs such a string: a few lines at most.
            reflect = ch.stream_stream(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
            for _ in range(100):
                try:
                    list(reflect(iter([_len_field(3, b"\xc3\x28")]), timeout=30))
                except grpc.RpcError:
                    pass
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                      timeout=10).read().decode()
        for m in methods:
            counted = [float(l.split()[-1]) for l in text.splitlines()
                       if l.startswith("fusebox_calls_total{") and f'method="{m}"' in l
                       and 'code="INVALID_ARGUMENT"' in l]
            assert counted == [201 if m == "FreeTensor" else 1], (m, counted)
        with Client(s.address) as c:
            expect_still_serving(c)
        assert s.stop(30) == 0
        lines = [l for l in log.read_text(errors="replace").splitlines() if "UTF-8" in l]
        assert 1 <= len(lines) <= 10, lines[:3] + [f"... {len(lines)} lines"]
    finally:
        s.kill()


def test_cli_splits_large_transfers_over_its_connections(server, tmp_path):
    # 64 MiB and 12 bytes of float32: at the split threshold, so ranges on --connections.
    x = np.random.default_rng(3).standard_normal((16 << 20) + 3).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("--server", server.address, "--connections", "3", "upload", str(tmp_path / "x.npy"),
            "-q", timeout=120)
    assert r.returncode == 0, r.stderr
    h = r.stdout.split()[0]
    r = cli("--server", server.address, "--connections", "3", "download", h, "-o",
            str(tmp_path / "y.npy"), "-q", timeout=120)
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "y.npy").tobytes() == x.tobytes()
    assert cli("--server", server.address, "free", h).returncode == 0
    r = cli("--server", server.address, "--connections", "0", "list")
    assert r.returncode == 2 and "connections" in r.stderr


# --- Execute: op calls on one stream -------------------------------------------------------

def test_execute_many_answers_every_call_and_a_bad_one_alone(client):
    from fusebox_client import StreamCall
    seed, rng = fresh_rng()
    xs = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(40)]
    calls = [StreamCall("gelu", (x,)) for x in xs]
    calls[17] = StreamCall("softmax", (np.float32(1.0),))  # rank 0: its own error
    calls[30] = StreamCall("matmul_relu", (xs[30], xs[30].T.copy()))
    results = list(client.execute_many(calls, window=6))
    assert sorted(r.index for r in results) == list(range(40)), seed
    by_index = {r.index: r for r in results}
    assert by_index[17].error is not None and by_index[17].value is None
    assert by_index[17].error.code == grpc.StatusCode.INVALID_ARGUMENT
    for i in set(range(40)) - {17, 30}:
        assert by_index[i].error is None
        np.testing.assert_allclose(by_index[i].value, gelu_ref(xs[i].astype(np.float64)),
                                   rtol=1e-5, atol=1e-6)
        assert by_index[i].timing.backend == "cpu" and by_index[i].timing.rpc_us > 0
    want = np.maximum(xs[30].astype(np.float64) @ xs[30].T.astype(np.float64), 0)
    np.testing.assert_allclose(by_index[30].value, want, rtol=1e-4, atol=1e-5)


def test_execute_many_keeps_outputs_on_the_server(client):
    from fusebox_client import StreamCall
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 4
    with client.upload(x) as h:
        (kept,) = list(client.execute_many([StreamCall("gelu", (h,), keep=True)]))
        assert isinstance(kept.value, Handle)
        with kept.value as g:
            (sums,) = list(client.execute_many([StreamCall("rowsum", (g,))]))
            np.testing.assert_allclose(sums.value, gelu_ref(x.astype(np.float64)).sum(-1),
                                       rtol=1e-5)


def test_execute_many_refuses_an_unknown_op_before_sending_it(client):
    from fusebox_client import StreamCall
    with pytest.raises(ValueError, match="unknown op"):
        list(client.execute_many([StreamCall("cube", (np.ones(2, np.float32),))]))
    expect_still_serving(client)


def test_both_clients_stub_makes_raw_calls_that_carry_the_clients_token(tmp_path):
    import asyncio
    from fusebox_client.aio import AsyncClient
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-a alice\n")
    s = Server(f"--token_file={tokens}")
    req = pb.RowSumRequest(input=pb.TensorRef(tensor=pb.Tensor(
        dtype=pb.FLOAT32, shape=[1, 3], data=np.ones(3, np.float32).tobytes())))

    async def run_async():
        async with AsyncClient(s.address, timeout=30, token="secret-a") as c:
            return await c.stub.RowSum(req, metadata=c.metadata, timeout=30)

    try:
        with Client(s.address, timeout=30, token="secret-a") as c:
            assert c.metadata == (("authorization", "Bearer secret-a"),)
            out = c.stub.RowSum(req, metadata=c.metadata, timeout=30).output.tensor
            assert np.frombuffer(out.data, np.float32).tolist() == [3.0]
            with pytest.raises(grpc.RpcError) as e:
                c.stub.RowSum(req, timeout=30)  # no token
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        out = asyncio.run(run_async()).output.tensor
        assert np.frombuffer(out.data, np.float32).tolist() == [3.0]
    finally:
        s.stop()
        s.kill()


def test_execute_many_without_a_token_is_unauthenticated(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-a alice\n")
    s = Server(f"--token_file={tokens}")
    try:
        from fusebox_client import StreamCall
        with Client(s.address, timeout=30) as c:
            with pytest.raises(FuseboxError) as e:
                list(c.execute_many([StreamCall("gelu", (np.ones(2, np.float32),))]))
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        with Client(s.address, timeout=30, token="secret-a") as c:
            (r,) = list(c.execute_many([StreamCall("gelu", (np.ones(2, np.float32),))]))
            assert r.error is None
    finally:
        s.stop()
        s.kill()


def test_async_execute_many_answers_every_call(server):
    import asyncio
    from fusebox_client import StreamCall
    from fusebox_client.aio import AsyncClient

    async def run(calls):
        async with AsyncClient(server.address, timeout=30) as c:
            return [r async for r in c.execute_many(calls, window=4)]

    calls = [StreamCall("rowsum", (np.full((2, 3), i, np.float32),)) for i in range(25)]
    calls[7] = StreamCall("rowsum", (np.float32(2.0),))  # rank 0: its own error
    results = asyncio.run(run(calls))
    assert sorted(r.index for r in results) == list(range(25))
    for r in results:
        if r.index == 7:
            assert r.error.code == grpc.StatusCode.INVALID_ARGUMENT
        else:
            np.testing.assert_allclose(r.value, [3.0 * r.index] * 2)
    # A call the client cannot encode raises, and ends the stream.
    with pytest.raises(ValueError, match="unknown op"):
        asyncio.run(run([StreamCall("cube", (np.ones(2, np.float32),))]))


def _heap_setting_in_a_fresh_process(env_value, make_client):
    """What keep_freed_memory reports in a new interpreter (the setting is process-wide and once),
    with $FUSEBOX_KEEP_FREED_MEMORY set to env_value (None: unset)."""
    env = dict(os.environ)
    env.pop("FUSEBOX_KEEP_FREED_MEMORY", None)
    if env_value is not None:
        env["FUSEBOX_KEEP_FREED_MEMORY"] = env_value
    code = ("import fusebox_client as f\n"
            + ("f.Client('localhost:1', keep_freed_memory=False)\n" if make_client == "off" else "")
            + ("f.Client('localhost:1')\n" if make_client == "on" else "")
            + "print(f._common._heap_kept, f.keep_freed_memory())\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.split()


def test_a_client_keeps_freed_memory_for_large_calls_unless_told_not_to():
    # glibc (the test machines): a Client turns it on; keep_freed_memory=False or the variable
    # leaves malloc as it was (nothing set before the explicit call that follows).
    assert _heap_setting_in_a_fresh_process(None, "on") == ["True", "True"]
    assert _heap_setting_in_a_fresh_process(None, "off") == ["None", "True"]
    assert _heap_setting_in_a_fresh_process("0", "on") == ["False", "False"]


# --- the native transport (libfusebox_native: the C++ client under this one) ----------------

def _native_or_skip():
    from fusebox_client import _native
    if _native.library() is None:
        pytest.skip("libfusebox_native is not built next to fusebox_client")


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_native_transport_answers_every_op_as_grpcio_does(server, dtype):
    _native_or_skip()
    seed, rng = fresh_rng()
    shapes = [(1,), (3, 5), (257, 1031), (2, 3, 70001)]  # tiny, odd, and past 1 MiB
    with Client(server.address, timeout=30, native=False) as g, \
            Client(server.address, timeout=30, native=True, native_min_bytes=0) as n:
        for shape in shapes:
            x = rng.standard_normal(shape).astype(np.float32)
            for op in ("gelu", "softmax", "rowsum"):
                want, tw = getattr(g, op)(x, dtype=dtype, return_timing=True)
                got, tn = getattr(n, op)(x, dtype=dtype, return_timing=True)
                assert got.dtype == want.dtype and got.shape == want.shape, (seed, op, shape)
                assert np.array_equal(got, want, equal_nan=True), (seed, op, shape)
                assert tn.backend == tw.backend and tn.total_us > 0 and tn.rpc_us > 0
        a = rng.standard_normal((67, 129)).astype(np.float32)
        b = rng.standard_normal((129, 33)).astype(np.float32)
        bias = rng.standard_normal(33).astype(np.float32)
        assert np.array_equal(n.matmul_relu(a, b, bias, dtype=dtype),
                              g.matmul_relu(a, b, bias, dtype=dtype)), seed


def test_a_native_result_is_writable_aligned_and_owned_by_the_caller(server):
    _native_or_skip()
    x = np.linspace(-3, 3, 1 << 20, dtype=np.float32)  # 4 MiB: past native_min_bytes
    with Client(server.address, timeout=30, native=True) as c:
        y = c.gelu(x)
        z = c.gelu(x)
    assert y.flags.writeable and y.flags.c_contiguous and y.ctypes.data % 64 == 0
    assert not np.shares_memory(y, z)
    before = z.copy()
    y[:] = 0  # the caller's own memory: writing it changes no other result
    assert np.array_equal(z, before)


def test_the_native_transport_gives_the_same_errors_as_grpcio(server, tmp_path):
    _native_or_skip()
    big = np.ones((2, 1 << 18), np.float32)  # 2 MiB
    with Client(server.address, timeout=30, native=False) as g, \
            Client(server.address, timeout=30, native=True) as n:
        for c in (g, n):
            with pytest.raises(FuseboxError) as e:
                c.matmul_relu(big, np.ones((3, 2), np.float32))
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(FuseboxError) as e:
                c.matmul_relu(big.reshape(1 << 18, 2), "no-such-handle")
            assert e.value.code == grpc.StatusCode.NOT_FOUND
            with pytest.raises(FuseboxError) as e:
                c.gelu(np.ones(64 << 20, np.uint8).view(np.float32), timeout=0.001)
            assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        expect_still_serving(n)
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-a alice\n")
    s = Server(f"--token_file={tokens}")
    try:
        with Client(s.address, timeout=30, native=True) as c:
            with pytest.raises(FuseboxError) as e:
                c.gelu(big)
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        with Client(s.address, timeout=30, native=True, token="secret-a") as c:
            np.testing.assert_allclose(c.rowsum(big), np.full(2, float(1 << 18)))
    finally:
        s.stop()
        s.kill()
    with Client("127.0.0.1:1", timeout=5, native=True) as c:  # nothing listens there
        with pytest.raises(FuseboxError) as e:
            c.gelu(big)
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_native_true_without_the_library_is_refused_and_native_0_turns_it_off():
    code = ("import fusebox_client as f\n"
            "try:\n    f.Client('localhost:1', native=True)\nexcept ValueError as e:\n"
            "    print('refused', 'libfusebox_native' in str(e))\n"
            "print(f.Client('localhost:1')._native is None)\n")
    env = dict(os.environ, FUSEBOX_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == ["refused", "True", "True"]


def test_the_async_client_takes_the_native_transport_too(server):
    _native_or_skip()
    import asyncio
    from fusebox_client.aio import AsyncClient
    x = np.linspace(-2, 2, 3 << 18, dtype=np.float32).reshape(3, -1)  # 3 MiB

    async def run():
        async with AsyncClient(server.address, timeout=30, native=True) as c:
            assert c._native is not None
            return await asyncio.gather(c.softmax(x), c.rowsum(x))

    with Client(server.address, timeout=30, native=False) as g:
        soft, rows = asyncio.run(run())
        assert np.array_equal(soft, g.softmax(x)) and np.array_equal(rows, g.rowsum(x))


def test_a_native_library_that_cannot_load_is_warned_about_and_grpcio_used(tmp_path):
    import fusebox_client
    pkg = Path(fusebox_client.__file__).resolve().parent
    copy = tmp_path / "fusebox_client"
    subprocess.run(["cp", "-r", str(pkg), str(copy)], check=True)
    (copy / "libfusebox_native.so").write_bytes(b"not a library")  # a build copied without its libs
    code = ("import warnings, fusebox_client as f\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    c = f.Client('localhost:1')\n"
            "print(c._native is None, any('op calls use grpcio' in str(x.message) for x in w))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] +
                                                      os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    env.pop("FUSEBOX_NATIVE_LIB", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == ["True", "True"], out.stderr
