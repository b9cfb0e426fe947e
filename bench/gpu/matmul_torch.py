"""Our matmul+ReLU beside its PyTorch peers: same shapes, same tensors, same harness, one process.

torch.relu(a @ b)                     -- what a user writes: GEMM, then a separate ReLU pass
torch._addmm_activation(bias, a, b)   -- cuBLASLt with the RELU_BIAS epilogue (what we should match)
ours (libfusebox_matmul_capi.so via ctypes): cuBLASLt path without / with bias as the server
  runs it, tiled kernel (automatic choice: wgmma where it applies) and tiled forced to mma.sync,
  both with bias.

Timed with triton.testing.do_bench (CUDA events, L2 flushed before every call, median of ~100 ms
of calls), inputs uniform in [-1, 1), fresh per shape and dtype. The variants of one shape and
dtype run back to back, so clock and temperature drift affect them alike. fp32 runs twice:
exact ("highest") and TF32 ("high"). Correctness on the same inputs: ours vs
relu(a @ b + bias) in float64 on the GPU (relative L2 error), and NaN-free.
One JSON object per line. Cost: about 40 s on an H200.

usage: python3 matmul_torch.py --capi PATH/libfusebox_matmul_capi.so [--json FILE] [--quick]
"""
import argparse
import ctypes
import json
import sys

import torch
from triton.testing import do_bench

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4000, 4000, 4000), (16384, 16384, 256),
          (64, 4096, 4096)]
MODES = [("fp32", torch.float32, "highest", 1), ("tf32", torch.float32, "high", 1),
         ("fp16", torch.float16, "highest", 2), ("bf16", torch.bfloat16, "highest", 3)]
TOL = {"fp32": 1e-5, "tf32": 3e-3, "fp16": 3e-3, "bf16": 1e-2}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capi", required=True)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    shapes = [(8192, 8192, 8192)] if args.quick else SHAPES
    out = open(args.json, "w") if args.json else None
    # torch first, so our library binds to the cudart/cuBLASLt torch already loaded (same soname).
    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")
    lib = ctypes.CDLL(args.capi)
    fn = lib.fusebox_bench_matmul
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                   ctypes.c_void_p]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    failures = 0
    for (m, n, k) in shapes:
        for name, dt, precision, code in MODES:
            torch.set_float32_matmul_precision(precision)
            tf32 = int(name == "tf32")
            g = torch.Generator(device="cuda").manual_seed(m + n + k + code)
            a = torch.rand(m, k, device="cuda", dtype=dt, generator=g) * 2 - 1
            b = torch.rand(k, n, device="cuda", dtype=dt, generator=g) * 2 - 1
            bias = torch.rand(n, device="cuda", dtype=dt, generator=g) * 2 - 1
            c = torch.empty(m, n, device="cuda", dtype=dt)
            flops = 2.0 * m * n * k

            def ours(impl, with_bias):
                def run():
                    stream = torch.cuda.current_stream().cuda_stream
                    rc = fn(code, m, n, k, a.data_ptr(), b.data_ptr(),
                            bias.data_ptr() if with_bias else None, c.data_ptr(), tf32, impl, stream)
                    if rc != 0:
                        raise RuntimeError(f"fusebox_bench_matmul rc={rc}")
                return run

            variants = [
                ("torch_relu_matmul", False, lambda: torch.relu(a @ b)),
                ("cublaslt", False, ours(0, False)),
                ("torch_addmm_activation", True, lambda: torch._addmm_activation(bias, a, b)),
                ("cublaslt", True, ours(0, True)),
            ]
            if name != "tf32":
                variants.append(("tiled", True, ours(1, True)))
            if name in ("fp16", "bf16"):
                variants.append(("tiled_mma", True, ours(2, True)))
            ref = torch.relu(a.double() @ b.double() + bias.double()) if m * n * k <= 2**40 else None
            for impl, with_bias, run in variants:
                row = {"impl": impl, "mode": name, "bias": with_bias, "m": m, "n": n, "k": k}
                if ref is not None and impl not in ("torch_relu_matmul",):
                    c.fill_(float("nan"))
                    res = run()
                    res = c if res is None else res
                    torch.cuda.synchronize()
                    r = ref if with_bias else torch.relu(a.double() @ b.double())
                    err = ((res.double() - r).norm() / r.norm()).item()
                    nans = int(torch.isnan(res).sum().item())
                    ok = nans == 0 and err <= TOL[name]
                    row.update(rel_err=err, nans=nans, check="pass" if ok else "FAIL")
                    failures += not ok
                ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                row.update(median_ms=ms, tflops=flops / (ms * 1e9))
                line = json.dumps(row)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
            del a, b, bias, c, ref
            torch.cuda.empty_cache()
    torch.set_float32_matmul_precision("highest")
    print(f"matmul_torch: {failures} correctness failures", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
