#!/usr/bin/env python3
"""What a user would run instead of fusebox's memory-bound kernels, timed like ours.

Times, on the issue-3 shapes and float32 / bfloat16: PyTorch eager
(F.gelu(approximate='tanh'), torch.softmax, torch.sum(dim=-1, dtype=float32)), torch.compile of
the same function (default mode, static shapes, one compiled function per shape), and a plain
Triton kernel per op (written the way the Triton tutorials do, not tuned per shape). Also the
bandwidth ceilings: a 1 GiB device copy (bytes read + written) and a 1 GiB torch.sum (read-only).

Method, identical to memory_bound_bench.cc: before every timed call the L2 is flushed by reading a
256 MiB buffer; the call is bracketed by CUDA events; 3 warm-ups; median of --reps (30).
Bytes: inputs read once + outputs written once. Cost: about a minute of compiling on the device.

usage: memory_bound_peers.py --json PATH [--reps N] [--quick]
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SHAPES = [(262144, 128), (65536, 1024), (8192, 8192), (2048, 32768), (128, 1048576)]
GELU_N = 1 << 28
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# ----------------------------------------------------------------------------- Triton kernels
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    # 0.5 x (1 + tanh(u)) == x * sigmoid(2u)
    y = x / (1.0 + tl.exp(-2.0 * u))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def triton_gelu(x, out):
    n = x.numel()
    BLOCK = 1024
    gelu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out


@triton.jit
def softmax_row_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_looped_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    # Long rows: online max / sum over blocks, then a second read that writes.
    row = tl.program_id(0).to(tl.int64)
    base = row * cols
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + offs, mask=offs < cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        s = tl.where(m_new == -float("inf"), 0.0, s)
        m = m_new
    mx = tl.max(m, axis=0)
    total = tl.sum(s * tl.exp(m - mx), axis=0)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + offs, mask=offs < cols, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - mx) / total
        tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty), mask=offs < cols)


def triton_softmax(x, out):
    rows, cols = x.shape
    if cols <= 16384:
        BLOCK = triton.next_power_of_2(cols)
        warps = 4 if BLOCK <= 1024 else 8 if BLOCK <= 4096 else 16
        softmax_row_kernel[(rows,)](x, out, cols, BLOCK=BLOCK, num_warps=warps)
    else:
        softmax_looped_kernel[(rows,)](x, out, cols, BLOCK=4096, num_warps=8)
    return out


@triton.jit
def rowsum_kernel(x_ptr, y_ptr, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for start in range(0, cols, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        mask = (r[:, None] < rows) & (c[None, :] < cols)
        acc += tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + r, tl.sum(acc, axis=1), mask=r < rows)


def triton_rowsum(x, out):
    rows, cols = x.shape
    BLOCK_C = min(triton.next_power_of_2(cols), 4096)
    BLOCK_R = max(1, 4096 // BLOCK_C)
    rowsum_kernel[(triton.cdiv(rows, BLOCK_R),)](x, out, rows, cols, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C,
                                                 num_warps=8)
    return out


# ----------------------------------------------------------------------------- timing
class Timer:
    def __init__(self, reps):
        self.reps = reps
        self.flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda").uniform_(-1, 1)

    def time(self, fn):
        for _ in range(3):
            self.flush.sum()
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for i in range(self.reps):
            self.flush.sum()  # 256 MiB read: L2 holds only clean, unrelated lines afterwards
            starts[i].record()
            fn()
            stops[i].record()
        torch.cuda.synchronize()
        t = sorted(a.elapsed_time(b) for a, b in zip(starts, stops))
        return statistics.median(t), t[0], t[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="eager and Triton only (no torch.compile)")
    args = ap.parse_args()
    timer = Timer(args.reps)
    recs = []
    t0 = time.time()

    def emit(op, dtype, rows, cols, impl, nbytes, fn):
        try:
            ms, lo, hi = timer.time(fn)
            err = ""
        except Exception as e:  # a peer that fails is reported, not fatal
            ms = lo = hi = 0.0
            err = f"{type(e).__name__}: {e}"[:200]
        gbps = nbytes / (ms * 1e6) if ms > 0 else 0.0
        recs.append(dict(op=op, dtype=dtype, rows=rows, cols=cols, impl=impl, desc="", bytes=nbytes, ms=ms,
                         ms_min=lo, ms_max=hi, gbps=gbps, error=err))
        print(f"{op:8s} {dtype:9s} {rows:7d}x{cols:<8d} {impl:14s} {ms:9.4f} ms {gbps:8.1f} GB/s "
              f"[{time.time() - t0:5.0f}s] {err}", flush=True)

    # Ceilings.
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda").uniform_(-1, 1)
    b = torch.empty_like(a)
    emit("ceiling_copy", "bytes", 1, a.numel() * 4, "torch_copy", 2.0 * a.numel() * 4, lambda: b.copy_(a))
    emit("ceiling_read", "bytes", 1, a.numel() * 4, "torch_sum", 1.0 * a.numel() * 4, lambda: a.sum())
    emit("ceiling_write", "bytes", 1, a.numel() * 4, "torch_fill", 1.0 * a.numel() * 4, lambda: b.fill_(1.0))
    del a, b

    # Correctness of the Triton peers (a wrong fast peer would make our ratios look worse, a wrong
    # slow one better): compare with eager on small shapes. Reported, not fatal.
    def agree(name, got, want, atol, rtol):
        ok = torch.allclose(got.float(), want.float(), atol=atol, rtol=rtol)
        if not ok:
            print(f"WARNING: triton {name} disagrees with eager: max |diff| "
                  f"{(got.float() - want.float()).abs().max().item():.3g}", flush=True)
        return ok

    all_ok = True
    for dname, dt in DTYPES.items():
        tol = 1e-4 if dt == torch.float32 else 2e-2
        x = torch.randn(37, 1000, device="cuda", dtype=dt) * 3
        xl = torch.randn(3, 40000, device="cuda", dtype=dt)
        all_ok &= agree("gelu", triton_gelu(x, torch.empty_like(x)), F.gelu(x.float(), approximate="tanh"), tol, tol)
        for xs in (x, xl):
            all_ok &= agree("softmax", triton_softmax(xs, torch.empty_like(xs)), torch.softmax(xs.float(), -1),
                            tol, tol)
            all_ok &= agree("rowsum", triton_rowsum(xs, torch.empty(xs.shape[0], device="cuda")),
                            xs.float().sum(-1), 1e-2, 1e-3)
    print(f"triton peers agree with eager: {all_ok}", flush=True)

    def compiled(f):
        return torch.compile(f, dynamic=False)

    for dname, dt in DTYPES.items():
        es = torch.finfo(dt).bits // 8
        x = torch.empty(GELU_N, device="cuda", dtype=dt).uniform_(-4, 4)
        y = torch.empty_like(x)
        nb = 2.0 * GELU_N * es
        emit("gelu", dname, 1, GELU_N, "torch_eager", nb, lambda: F.gelu(x, approximate="tanh"))
        if not args.quick:
            g = compiled(lambda t: F.gelu(t, approximate="tanh"))
            emit("gelu", dname, 1, GELU_N, "torch_compile", nb, lambda: g(x))
        emit("gelu", dname, 1, GELU_N, "triton", nb, lambda: triton_gelu(x, y))
        del x, y
        for rows, cols in SHAPES:
            x = torch.empty(rows, cols, device="cuda", dtype=dt).uniform_(-4, 4)
            y = torch.empty_like(x)
            ys = torch.empty(rows, device="cuda", dtype=torch.float32)
            nb = 2.0 * rows * cols * es
            emit("softmax", dname, rows, cols, "torch_eager", nb, lambda: torch.softmax(x, dim=-1))
            if not args.quick:
                f = compiled(lambda t: torch.softmax(t, dim=-1))
                emit("softmax", dname, rows, cols, "torch_compile", nb, lambda: f(x))
            emit("softmax", dname, rows, cols, "triton", nb, lambda: triton_softmax(x, y))
            nb = 1.0 * rows * cols * es + 4.0 * rows
            emit("rowsum", dname, rows, cols, "torch_eager", nb, lambda: torch.sum(x, dim=-1, dtype=torch.float32))
            if not args.quick:
                f2 = compiled(lambda t: torch.sum(t, dim=-1, dtype=torch.float32))
                emit("rowsum", dname, rows, cols, "torch_compile", nb, lambda: f2(x))
            emit("rowsum", dname, rows, cols, "triton", nb, lambda: triton_rowsum(x, ys))
            del x, y, ys
    with open(args.json, "w") as fh:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       method="L2 flushed by a 256 MiB read before each call; CUDA events; median",
                       records=recs), fh, indent=1)
    print(f"peers done in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
