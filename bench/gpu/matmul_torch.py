"""The PyTorch peers of matmul_bench, on the same shapes and dtypes, in the same run.

torch.relu(a @ b)                     -- what a user writes: GEMM, then a separate ReLU pass
torch._addmm_activation(bias, a, b)   -- cuBLASLt with the RELU_BIAS epilogue (what we should match)

Timed with triton.testing.do_bench (events, L2 flushed before every call, median), inputs
uniform in [-1, 1). fp32 runs twice: exact ("highest") and TF32 ("high"). Also checks that
_addmm_activation equals relu(a @ b + bias) on the same inputs. One JSON object per line.
Cost: about 20 s on an H200.

usage: python3 matmul_torch.py [--json FILE] [--quick]
"""
import argparse
import json
import sys

import torch
from triton.testing import do_bench

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4000, 4000, 4000), (16384, 16384, 256),
          (64, 4096, 4096)]
MODES = [("fp32", torch.float32, "highest"), ("tf32", torch.float32, "high"),
         ("fp16", torch.float16, "highest"), ("bf16", torch.bfloat16, "highest")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    shapes = [(8192, 8192, 8192)] if args.quick else SHAPES
    out = open(args.json, "w") if args.json else None
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    for (m, n, k) in shapes:
        for name, dt, precision in MODES:
            torch.set_float32_matmul_precision(precision)
            g = torch.Generator(device="cuda").manual_seed(m + n + k)
            a = torch.rand(m, k, device="cuda", dtype=dt, generator=g) * 2 - 1
            b = torch.rand(k, n, device="cuda", dtype=dt, generator=g) * 2 - 1
            bias = torch.rand(n, device="cuda", dtype=dt, generator=g) * 2 - 1
            flops = 2.0 * m * n * k
            fused = torch._addmm_activation(bias, a, b)
            plain = torch.relu(a @ b + bias)
            err = ((fused.float() - plain.float()).norm() / plain.float().norm()).item()
            for peer, fn in (("torch_relu_matmul", lambda: torch.relu(a @ b)),
                             ("torch_addmm_activation", lambda: torch._addmm_activation(bias, a, b))):
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                row = {"impl": peer, "mode": name, "bias": peer == "torch_addmm_activation",
                       "m": m, "n": n, "k": k, "median_ms": ms, "tflops": flops / (ms * 1e9),
                       "fused_vs_unfused_rel_err": err}
                line = json.dumps(row)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
            del a, b, bias, fused, plain
            torch.cuda.empty_cache()
    torch.set_float32_matmul_precision("highest")


if __name__ == "__main__":
    main()
