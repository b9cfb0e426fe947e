"""Compiles Triton's one-row softmax program (triton_peers.py's softmax_row_kernel) for
8192 columns on sm_90 without a GPU, for load_hints_probe --set softmax --triton DIR.

Usage: python3 triton_softmax_cubin.py DIR   (needs `pip install triton`; writes
DIR/softmax_fp32.cubin and DIR/softmax_bf16.cubin)
"""
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from triton_peers import softmax_row_kernel  # the peers' program itself


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for dt in ("fp32", "bf16"):
        # As Triton's JIT specialises them: 16-byte aligned pointers, cols a multiple of 16.
        div16 = [["tt.divisibility", 16]]
        src = ASTSource(fn=softmax_row_kernel,
                        signature={"x_ptr": f"*{dt}", "y_ptr": f"*{dt}", "cols": "i32", "BLOCK": "constexpr"},
                        constexprs={"BLOCK": 8192}, attrs={(0,): div16, (1,): div16, (2,): div16})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 16})
        assert k.metadata.shared == 64, k.metadata.shared  # the probe launches with 64 bytes
        with open(os.path.join(out, f"softmax_{dt}.cubin"), "wb") as f:
            f.write(k.asm["cubin"])
        print(f"{dt}: triton {triton.__version__}, 16 warps, shared {k.metadata.shared} B")


if __name__ == "__main__":
    main()
