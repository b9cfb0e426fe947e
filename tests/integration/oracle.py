"""The NumPy oracle the Python tests and tools/soak.py check results against: what the server
receives for an input sent as a dtype, the ops in float64, the relative error, and the
tolerances per dtype."""
import numpy as np

from fusebox_client import bfloat16_bits_to_float, float_to_bfloat16_bits

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def as_sent(x, dtype):
    """The values the server sees for x sent as dtype, in float64."""
    if dtype == "bfloat16":
        return bfloat16_bits_to_float(float_to_bfloat16_bits(x)).astype(np.float64)
    return x.astype(dtype).astype(np.float64)


def gelu_ref(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def softmax_ref(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rel_err(got, want):
    got = np.asarray(got, dtype=np.float64)
    return np.linalg.norm((got - want).ravel()) / max(np.linalg.norm(want.ravel()), 1e-30)
