"""Shared memory end to end: the real fusebox-server (CPU backend, free port) with
--allow_shared_memory, POSIX shared memory made by the Python client (fusebox_client.shm),
ops reading and writing regions, Upload from a region, every range check, tenants, a region
unregistered or truncated under a call, idle expiry, and CUDA IPC refused on the CPU backend.

Needs PYTHONPATH=<build>/python and FUSEBOX_SERVER_BIN (ctest sets both).
"""
import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import grpc
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_python_client import SERVER_BIN, Server  # noqa: E402

from fusebox_client import (Client, FuseboxError, SharedMemoryRegion,  # noqa: E402
                            SharedOutput, SharedTensor)
from fusebox_client.aio import AsyncClient  # noqa: E402


def gelu_ref(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def mapped(server, key):
    """Whether the server process maps the shared-memory object `key` ("/name")."""
    with open(f"/proc/{server.proc.pid}/maps") as f:
        return any(line.rstrip().endswith("/dev/shm" + key) or
                   line.rstrip().endswith("/dev/shm" + key + " (deleted)") for line in f)


@pytest.fixture(scope="module")
def server():
    s = Server("--allow_shared_memory")
    yield s
    s.kill()


@pytest.fixture
def client(server):
    with Client(server.address) as c:
        yield c


@pytest.fixture
def shm():
    regions = []

    def make(size):
        r = SharedMemoryRegion.create(size)
        regions.append(r)
        return r
    yield make
    for r in regions:
        r.close()


def test_shared_memory_is_off_by_default(shm):
    s = Server()
    try:
        with Client(s.address) as c:
            region = shm(4096)
            with pytest.raises(FuseboxError) as e:
                c.register_shared_memory("r", region)
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "--allow_shared_memory" in e.value.details
            with pytest.raises(FuseboxError) as e:
                c.gelu(SharedTensor("r", 0, "float32", (4,)))
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "--allow_shared_memory" in e.value.details
            with pytest.raises(FuseboxError) as e:
                c.list_shared_memory()
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        s.kill()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gelu_reads_from_a_region_and_writes_into_a_region(client, shm, dtype):
    n = 100_003
    x = np.random.default_rng(1).standard_normal(n).astype(dtype)
    esize = x.itemsize
    region = shm(2 * n * esize + 64)
    with client.shared_memory("io", region) as io:
        region.ndarray(dtype, (n,), offset=16)[:] = x
        out, timing = client.run_shared("Gelu", io.tensor(dtype, (n,), offset=16),
                                        out=io.output(32 + n * esize))
        assert out == SharedTensor("io", 32 + n * esize, dtype, (n,))
        assert timing.backend == "cpu"
        got = region.ndarray(dtype, (n,), offset=32 + n * esize).copy()
        # The same kernel as an inline call: the very same bits.
        np.testing.assert_array_equal(got, client.gelu(x))
        tol = 1e-5 if dtype == "float32" else 2e-3
        np.testing.assert_allclose(got.astype(np.float64), gelu_ref(x), rtol=tol, atol=tol)
        # A region input with an inline output works too.
        np.testing.assert_array_equal(client.gelu(io.tensor(dtype, (n,), offset=16)), got)


def test_matmul_reads_every_operand_from_a_region(client, shm):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((32, 48)).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    region = shm(1 << 20)
    with client.shared_memory("mm", region) as io:
        region.ndarray("float32", a.shape, 0)[:] = a
        region.ndarray("float32", b.shape, 8192)[:] = b
        region.ndarray("float32", bias.shape, 16384)[:] = bias
        client.run_shared("MatmulRelu", io.tensor("float32", a.shape, 0),
                          io.tensor("float32", b.shape, 8192),
                          io.tensor("float32", bias.shape, 16384), out=io.output(32768))
        got = region.ndarray("float32", (64, 48), 32768)
        np.testing.assert_allclose(got, np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-4)


def test_upload_from_a_region(client, shm):
    x = np.arange(1000, dtype=np.float32).reshape(10, 100)
    region = shm(8192)
    with client.shared_memory("up", region) as io:
        region.ndarray("float32", x.shape, 4096)[:] = x
        with client.upload(io.tensor("float32", x.shape, 4096)) as h:
            np.testing.assert_array_equal(client.download(h), x)
            np.testing.assert_array_equal(client.rowsum(h), x.sum(axis=1))
        with pytest.raises(FuseboxError) as e:  # past the region's end
            client.upload(io.tensor("float32", (2000,), 4096))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert client.list_tensors()[0] == []


def test_out_of_range_offset_size_dtype_and_overflow_are_invalid_and_change_nothing(client, shm):
    region = shm(4096)
    sentinel = np.full(4096, 0xAB, dtype=np.uint8)
    with client.shared_memory("r", region) as io:
        view = region.ndarray("float32", (1024,), 0)
        view.view(np.uint8)[:] = sentinel
        bad_inputs = [
            io.tensor("float32", (1024,), 4),           # one element past the end
            io.tensor("float32", (1,), 4096),           # starts at the end
            io.tensor("float32", (1,), -4),             # negative offset
            io.tensor("float32", (1,), 1 << 62),        # offset far past the end
            io.tensor("float32", (1 << 61, 4)),         # bytes overflow 64 bits
            io.tensor("float32", (1 << 40, 1 << 40)),   # elements overflow
            io.tensor("float32", (-1,)),                # negative dim
            io.tensor("float32", (1025,)),              # 4100 bytes: the dtype's size counts
        ]
        for ref in bad_inputs:
            with pytest.raises(FuseboxError) as e:
                client.run_shared("Gelu", ref, out=io.output(0))
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, (ref, e.value.details)
        # float16 of the same shape fits: 2050 bytes.
        small = np.ones(1025, dtype=np.float16)
        for out_offset in (4096 - 2048, 1 << 62, -2):  # outputs past the end
            with pytest.raises(FuseboxError) as e:
                client.run_shared("Gelu", small, out=io.output(out_offset))
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value.details
        with pytest.raises(FuseboxError) as e:  # an output over its own input
            client.run_shared("Gelu", io.tensor("float32", (16,), 0), out=io.output(32))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "overlap" in e.value.details
        with pytest.raises(FuseboxError) as e:  # an unspecified dtype
            client._op(_unspecified_dtype_request(), None, "numpy", "float32", False)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        np.testing.assert_array_equal(view.view(np.uint8), sentinel)  # nothing written
        assert client.list_tensors()[0] == []
        infos, used, _ = client.list_shared_memory()
        assert [i.name for i in infos] == ["r"] and used == 4096


def _unspecified_dtype_request():
    from fusebox.v1 import kernel_service_pb2 as pb
    from fusebox_client._common import Request
    return Request("Gelu", pb.GeluRequest(input=pb.TensorRef(
        shared=pb.SharedTensor(region="r", offset=0, shape=[4]))))


def test_register_checks_its_arguments(client, shm):
    region = shm(4096)
    cases = [
        (dict(offset=0, size=4097), grpc.StatusCode.INVALID_ARGUMENT),  # past the object's end
        (dict(offset=-1, size=10), grpc.StatusCode.INVALID_ARGUMENT),
        (dict(offset=0, size=0), grpc.StatusCode.INVALID_ARGUMENT),
        (dict(offset=(1 << 63) - 8, size=16), grpc.StatusCode.INVALID_ARGUMENT),  # overflow
    ]
    for kw, code in cases:
        with pytest.raises(FuseboxError) as e:
            client.register_shared_memory("x", region, **kw)
        assert e.value.code == code, (kw, e.value.details)
    for key in ("/no-such-fusebox-object", "no-slash", "/a/b", "/.."):
        with pytest.raises(FuseboxError) as e:
            client.register_shared_memory("x", key, size=16)
        assert e.value.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
    client.register_shared_memory("x", region, offset=100, size=200)
    try:
        with pytest.raises(FuseboxError) as e:
            client.register_shared_memory("x", region)
        assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
        (info,), used, _ = client.list_shared_memory("x")
        assert (info.kind, info.key, info.offset, info.size, used) == ("system", region.key, 100,
                                                                        200, 200)
        # Offsets in a region count from the region's start, not the object's.
        region.ndarray("float32", (4,), 100)[:] = [1, 2, 3, 4]
        np.testing.assert_array_equal(client.rowsum(SharedTensor("x", 0, "float32", (4,))), [10])
    finally:
        client.unregister_shared_memory("x")


def test_another_tenant_cannot_use_or_list_a_region(shm, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-a alice\ntok-b bob\n")
    s = Server("--allow_shared_memory", f"--token_file={tokens}")
    try:
        with Client(s.address, token="tok-a") as alice, Client(s.address, token="tok-b") as bob:
            region = shm(4096)
            alice.register_shared_memory("secret", region)
            region.ndarray("float32", (4,))[:] = 1
            assert [i.name for i in alice.list_shared_memory()[0]] == ["secret"]
            assert bob.list_shared_memory()[0] == []
            details = []
            for name in ("secret", "never-registered"):
                with pytest.raises(FuseboxError) as e:
                    bob.gelu(SharedTensor(name, 0, "float32", (4,)))
                assert e.value.code == grpc.StatusCode.NOT_FOUND
                details.append(e.value.details.replace(name, "NAME"))
            assert details[0] == details[1]  # nothing tells the two apart
            for call in (lambda: bob.list_shared_memory("secret"),
                         lambda: bob.unregister_shared_memory("secret"),
                         lambda: bob.upload(SharedTensor("secret", 0, "float32", (4,))),
                         lambda: bob.run_shared("Gelu", np.ones(4, np.float32),
                                                out=SharedOutput("secret", 0))):
                with pytest.raises(FuseboxError) as e:
                    call()
                assert e.value.code == grpc.StatusCode.NOT_FOUND
            # Names are per tenant: bob's own "secret" is another region.
            bob.register_shared_memory("secret", region, offset=2048)
            assert bob.list_shared_memory("secret")[0][0].offset == 2048
            assert alice.list_shared_memory("secret")[0][0].offset == 0
            np.testing.assert_array_equal(region.ndarray("float32", (4,)), 1)
    finally:
        s.kill()


def test_per_tenant_region_limit(shm):
    s = Server("--allow_shared_memory", "--max_shm_regions_per_tenant=2",
               "--shm_tenant_quota_mib=1")
    try:
        with Client(s.address) as c:
            region = shm(2 << 20)
            c.register_shared_memory("a", region, size=1000)
            with pytest.raises(FuseboxError) as e:  # past the 1 MiB quota
                c.register_shared_memory("big", region, size=(1 << 20))
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            c.register_shared_memory("b", region, size=1000)
            with pytest.raises(FuseboxError) as e:
                c.register_shared_memory("c", region, size=1000)
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max_shm_regions_per_tenant" in e.value.details
            c.unregister_shared_memory("a")
            c.register_shared_memory("c", region, size=1000)
    finally:
        s.kill()


def test_unregister_while_in_use_is_safe(server, client, shm):
    n = 768
    rng = np.random.default_rng(3)
    a = rng.standard_normal((n, n)).astype(np.float32)
    region = shm(3 * n * n * 4)
    client.register_shared_memory("busy", region)
    region.ndarray("float32", (n, n), 0)[:] = a
    region.ndarray("float32", (n, n), n * n * 4)[:] = a
    assert mapped(server, region.key)
    results = []

    def run():
        try:
            for _ in range(3):
                results.append(client.run_shared(
                    "MatmulRelu", SharedTensor("busy", 0, "float32", (n, n)),
                    SharedTensor("busy", n * n * 4, "float32", (n, n)),
                    out=SharedOutput("busy", 2 * n * n * 4)))
        except FuseboxError as e:
            results.append(e)
    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.05)
    client.unregister_shared_memory("busy")  # while a call (or the next) runs
    t.join()
    # The call under way finished on the mapping it held; later ones found no region.
    for r in results:
        if isinstance(r, FuseboxError):
            assert r.code == grpc.StatusCode.NOT_FOUND, r.details
    if results and not isinstance(results[0], FuseboxError):
        np.testing.assert_allclose(region.ndarray("float32", (n, n), 2 * n * n * 4),
                                   np.maximum(a @ a, 0), rtol=1e-3, atol=1e-3)
    deadline = time.time() + 5
    while mapped(server, region.key) and time.time() < deadline:
        time.sleep(0.05)
    assert not mapped(server, region.key)  # the last user let go: unmapped
    assert client.health() == "SERVING"


def test_truncated_region_gives_an_error_and_the_server_survives(server, client, shm):
    n = 8 << 20  # 32 MiB of float32
    region = shm(2 * n * 4)
    client.register_shared_memory("shrinks", region)
    region.ndarray("float32", (n,))[:] = 1.0
    path = "/dev/shm" + region.key
    # Truncated before the call: the size check at use time refuses it.
    os.truncate(path, 4096)
    with pytest.raises(FuseboxError) as e:
        client.run_shared("Gelu", SharedTensor("shrinks", 0, "float32", (n,)),
                          out=SharedOutput("shrinks", n * 4))
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "truncated" in e.value.details
    # Truncated during calls (the SIGBUS case): whichever way each call meets it, an error.
    os.truncate(path, 2 * n * 4)
    client.unregister_shared_memory("shrinks")
    for attempt in range(3):
        name = f"shrinks{attempt}"
        os.truncate(path, 2 * n * 4)
        client.register_shared_memory(name, region.key, size=2 * n * 4)
        errors = []

        def run():
            for _ in range(4):
                try:
                    client.run_shared("Gelu", SharedTensor(name, 0, "float32", (n,)),
                                      out=SharedOutput(name, n * 4))
                except FuseboxError as e:
                    errors.append(e)
        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.01 * attempt)
        os.truncate(path, 0)
        t.join()
        assert errors and all(e.code == grpc.StatusCode.FAILED_PRECONDITION for e in errors), \
            [(e.code, e.details) for e in errors]
        client.unregister_shared_memory(name)
    assert server.proc.poll() is None
    assert client.health() == "SERVING"
    np.testing.assert_allclose(client.gelu(np.ones(4, np.float32)), gelu_ref(np.ones(4)),
                               rtol=1e-6)


def test_a_region_of_a_disconnected_client_is_eventually_released(shm):
    s = Server("--allow_shared_memory", "--shm_idle_expiry_s=1")
    try:
        region = shm(4096)
        # Another process registers the region and goes away without unregistering it.
        code = (f"from fusebox_client import Client\n"
                f"Client({s.address!r}).register_shared_memory('left', {region.key!r}, "
                f"size=4096)\n")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        assert mapped(s, region.key)
        deadline = time.time() + 10
        while mapped(s, region.key) and time.time() < deadline:
            time.sleep(0.1)
        assert not mapped(s, region.key)
        with Client(s.address) as c:
            assert c.list_shared_memory()[0] == []
    finally:
        s.kill()


def test_cuda_ipc_registration_on_the_cpu_backend_is_refused_clearly(client):
    with pytest.raises(FuseboxError) as e:
        client.register_cuda_ipc("gpu", b"\0" * 64, 0, 1 << 20)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "CUDA backend" in e.value.details and "cpu" in e.value.details
    assert client.list_shared_memory()[0] == []


def test_attaching_in_another_process_leaves_the_creators_object(shm):
    region = shm(4096)
    region.ndarray("float32", (4,))[:] = [1, 2, 3, 4]
    code = ("from fusebox_client import SharedMemoryRegion\n"
            f"r = SharedMemoryRegion.attach({region.key!r})\n"
            "print(list(r.ndarray('float32', (4,))))\n"
            "r.close()\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                         capture_output=True, text=True).stdout
    assert out.strip() == "[1.0, 2.0, 3.0, 4.0]"
    assert os.path.exists("/dev/shm" + region.key)  # its exit unlinked nothing


def test_async_client_uses_regions(server, shm):
    x = np.linspace(-3, 3, 4096, dtype=np.float32)
    region = shm(2 * x.nbytes)
    region.ndarray("float32", x.shape)[:] = x

    async def main():
        async with AsyncClient(server.address) as c:
            io = await c.shared_memory("aio", region)
            out, _ = await c.run_shared("Gelu", io.tensor("float32", x.shape),
                                        out=io.output(x.nbytes))
            (info,), _, _ = await c.list_shared_memory("aio")
            await c.unregister_shared_memory("aio")
            return out, info
    out, info = asyncio.run(main())
    assert out.offset == x.nbytes and info.size == 2 * x.nbytes
    np.testing.assert_allclose(region.ndarray("float32", x.shape, x.nbytes), gelu_ref(x),
                               rtol=1e-5, atol=1e-6)
