"""The Python client with torch: torch tensors of every supported dtype on the CPU and on CUDA as
inputs (bfloat16 included), objects that offer only __dlpack__, and torch outputs that keep the
dtype (bfloat16 without a float32 detour). Skips where torch is not installed (CI); run on a GPU
host with FUSEBOX_SERVER_BIN and PYTHONPATH=<build>/python (FUSEBOX_TEST_BACKEND picks the
server's backend, default cpu). Values are checked against NumPy in float64 on what was sent.
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fusebox_client import Client  # noqa: E402
from test_python_client import (TOL, Server, as_sent, fresh_rng, gelu_ref, rel_err,  # noqa: E402
                                softmax_ref)

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
BACKEND = os.environ.get("FUSEBOX_TEST_BACKEND", "cpu")


@pytest.fixture(scope="module")
def client():
    s = Server(f"--backend={BACKEND}")
    with Client(s.address, timeout=60) as c:
        assert c.wait_for_ready(10)
        yield c
    s.stop()
    s.kill()


def torch_input(shape, dtype, device):
    """A torch tensor of `dtype` on `device` and the float64 values the server receives."""
    seed, rng = fresh_rng()
    x = rng.standard_normal(shape).astype(np.float32)
    t = torch.from_numpy(x).to(TORCH_DTYPES[dtype]).to(device)
    return seed, t, as_sent(x, dtype)


class DLPackOnly:
    """Offers nothing but the DLPack protocol (as JAX, CuPy or TensorFlow arrays do)."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_torch_tensors_of_every_dtype_are_accepted_on_every_device(client, dtype, device):
    seed, t, sent = torch_input((7, 333), dtype, device)
    got = client.gelu(t)
    assert rel_err(got, gelu_ref(sent)) <= TOL[dtype], f"seed {seed}"
    got = client.softmax(t)
    assert rel_err(got, softmax_ref(sent)) <= TOL[dtype], f"seed {seed}"
    got = client.rowsum(t)
    assert got.dtype == np.float32
    assert rel_err(got, sent.sum(axis=-1)) <= TOL[dtype], f"seed {seed}"


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_torch_output_keeps_the_dtype_bfloat16_included(client, dtype):
    seed, t, sent = torch_input((5, 129), dtype, "cpu")
    got = client.gelu(t, output="torch")
    assert isinstance(got, torch.Tensor) and got.dtype == TORCH_DTYPES[dtype]
    assert tuple(got.shape) == (5, 129)
    assert rel_err(got.double().numpy(), gelu_ref(sent)) <= TOL[dtype], f"seed {seed}"
    # The same bits as the numpy result's bfloat16 bit patterns: no lossy detour.
    if dtype == "bfloat16":
        bits = client.gelu(t, bf16_output="bits")
        assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), bits)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_objects_with_only_dlpack_are_accepted(client, dtype, device):
    seed, t, sent = torch_input((3, 1000), dtype, device)
    got = client.softmax(DLPackOnly(t))
    assert rel_err(got, softmax_ref(sent)) <= TOL[dtype], f"seed {seed}"


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_relu_takes_torch_bfloat16_operands(client, device):
    _, a, a64 = torch_input((33, 65), "bfloat16", device)
    _, b, b64 = torch_input((65, 17), "bfloat16", device)
    _, bias, bias64 = torch_input((17,), "bfloat16", device)
    got = client.matmul_relu(a, b, bias, output="torch")
    assert got.dtype == torch.bfloat16
    want = np.maximum(a64 @ b64 + bias64, 0)
    assert rel_err(got.double().numpy(), want) <= TOL["bfloat16"]


def test_kept_output_downloads_as_torch(client):
    seed, t, sent = torch_input((4, 4096), "bfloat16", "cpu")
    with client.gelu(t, keep=True) as h:
        got = client.download(h, output="torch")
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (4, 4096)
    assert rel_err(got.double().numpy(), gelu_ref(sent)) <= TOL["bfloat16"], f"seed {seed}"


def test_non_contiguous_and_grad_tensors_are_read_as_their_values(client):
    seed, t, sent = torch_input((64, 48), "float32", "cpu")
    view = t.t()  # a transposed view: not contiguous
    got = client.gelu(view)
    assert rel_err(got, gelu_ref(sent.T)) <= TOL["float32"], f"seed {seed}"
    g = t.clone().requires_grad_(True)
    assert rel_err(client.gelu(g), gelu_ref(sent)) <= TOL["float32"], f"seed {seed}"


def test_unsupported_torch_dtype_says_which_are_supported(client):
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        client.gelu(torch.arange(6, dtype=torch.int32))
