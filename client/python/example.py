#!/usr/bin/env python3
"""Example: call every fusebox op from Python and check results with numpy.

Run with a server up:  build/server/fusebox-server --address=127.0.0.1:50051 &
                       pip install ./client/python && python3 client/python/example.py
(or, from a C++ build: PYTHONPATH=build/python /usr/bin/python3 client/python/example.py).
The server is the first argument, else $FUSEBOX_SERVER, else localhost:50051.
"""
import sys

import numpy as np

from fusebox_client import Client

target = sys.argv[1] if len(sys.argv) > 1 else None
rng = np.random.default_rng(0)

with Client(target) as c:
    if not c.wait_for_ready(5):
        sys.exit(f"no fusebox server at {c.target}")
    print("health:", c.health())

    x = rng.standard_normal((4, 1000), dtype=np.float32)
    y, t = c.gelu(x, return_timing=True)
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    print(f"gelu   {x.shape} max|err| {np.abs(y - want).max():.2e}  "
          f"kernel {t.kernel_us:.0f} us, round trip {t.rpc_us:.0f} us on {t.backend}")

    print("softmax float16 row sums:", c.softmax(x.astype(np.float16)).astype(np.float32).sum(-1))
    print("rowsum  bfloat16:", c.rowsum(x, dtype="bfloat16"))   # rounded to bf16 on the client

    a = rng.standard_normal((64, 32), dtype=np.float32)
    b = rng.standard_normal((32, 16), dtype=np.float32)
    bias = rng.standard_normal(16, dtype=np.float32)
    out = c.matmul_relu(a, b, bias, dtype="bfloat16")          # result widened to float32
    print("matmul_relu bf16 vs fp32 numpy, max|err|:",
          np.abs(out - np.maximum(a @ b + bias, 0)).max())

    # Tensors can stay on the server between calls (on the GPU with the CUDA backend); each
    # handle frees its tensor when its block ends, even if the code inside raises.
    with c.upload(x) as h, c.gelu(h, keep=True) as g:
        print("softmax(gelu(x)) from handles, row sums:", c.softmax(g).sum(-1))
