#!/usr/bin/env python3
"""Times fusebox's memory-bound kernels and what a user would run instead, in one process.

On the issue-3 shapes and float32 / bfloat16: "ours" (the automatic choice the server launches,
called through libfusebox_memory_bound_capi.so with ctypes on torch's current stream), PyTorch
eager (F.gelu(approximate='tanh'), torch.softmax, torch.sum(dim=-1, dtype=float32)), torch.compile
of the same function (default mode, static shapes, one compiled function per shape), and a plain
Triton kernel per op (written the way the Triton tutorials do, not tuned per shape). Also the
bandwidth ceilings: a 1 GiB device copy (bytes read + written) and a 1 GiB torch.sum (read-only),
and for context the same at 64 MiB (the smallest cases' size).

Per op / dtype / shape the inputs are made once; ours is first checked against torch eager on
them (a disagreement is printed and written into the record's "error": it never counts as a
pass); then every impl gets 3 warm-ups and the timed calls are interleaved: for each of --reps
(100) rounds, each impl in a rotating order: a ~300 us GPU spin (so that the host has queued the
call before the GPU reaches it), L2 flushed by reading 256 MiB, CUDA event, the call, CUDA event.
Median (and min / max) per impl. Interleaving puts ours and the peers under the same
clocks and temperature; two processes drifted 5-15% apart. Bytes: inputs read once + outputs
written once. Without the library (--capi, else next to this script or in ../lib) the peers are
timed alone and the verdict falls back to memory_bound_bench.cc's numbers.
Cost: about a minute of compiling on the device.

A/B runs: --only CASE (repeatable) keeps the listed cases, CASE = op:dtype:ROWSxCOLS (gelu's
ROWSxCOLS is 1x268435456), and so does --variant CASE:key=v,key=v (repeatable), which adds a
forced kernel choice of ours to that case, timed in the same interleaved rounds as
"ours:key=v,...". Keys are
KernelChoice's fields (threads_per_row, vectors_per_thread, cluster, threads, smem_bytes,
long_rows, pipeline, streaming, exp_once, split, split_wait_us, exp_fma, prefetch, tile, tile_elems, rows_per_lane, row_program). Variants are
checked against eager like ours. --baseline PATH adds another build of the library (the previous
commit's, say) as "ours@base" (repeatable: "ours@base2", ...), checked and timed the same way:
builds' kernels compared in the same rounds, which a forced choice cannot do when the old kernel
is gone.

--trace also records the timed rounds with torch.profiler (CUDA activity, CUPTI timestamps),
prints, per kernel name, the median GPU duration and the median idle gap before it (what the
events' time splits into), and adds to each record "kernel_us" (median per call, from the impl's
first kernel's start to its last kernel's end) and "kernels" (kernels per call). It slows the
host side, so the event times of peers with heavy Python launch paths (torch.compile) are not
comparable in that mode. --tiny adds to every case an impl "tiny_kernel" (torch's fill of one
element: one block) timed in the same rounds, the cost of a launch and its events on their own.
Each peer's record carries "paired_ours_ratio": ours' speed over the peer's, taken round by round
(the two were timed in the same rounds, so slow drift cancels), its median and a distribution-free
95% confidence interval of that median.
--shape ROWSxCOLS (repeatable)
replaces the issue's softmax / row-sum shapes, e.g. for one wave or a few microseconds of work.

usage: memory_bound_peers.py --json PATH [--reps N] [--quick] [--capi PATH/libfusebox_memory_bound_capi.so]
                             [--only CASE ...] [--variant CASE:key=v,... ...] [--baseline PATH]
                             [--trace] [--tiny] [--shape ROWSxCOLS ...]
"""
import argparse
import ctypes
import json
import os
import sys
import time

import torch
import torch._dynamo
import torch.nn.functional as F
import triton

from interleaved_timer import Timer
from paired_stats import paired_ratio
from triton_peers import triton_gelu, triton_rowsum, triton_softmax

SHAPES = [(262144, 128), (65536, 1024), (8192, 8192), (2048, 32768), (128, 1048576)]
GELU_N = 1 << 28
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DTYPE_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}  # fusebox::DType
OP_CODES = {"gelu": 0, "softmax": 1, "rowsum": 2}  # memory_bound_capi.cc
CAPI_NAME = "libfusebox_memory_bound_capi.so"
CHOICE_KEYS = ["threads_per_row", "vectors_per_thread", "cluster", "threads", "smem_bytes", "long_rows",
               "pipeline", "streaming", "exp_once", "split",
               "split_wait_us", "exp_fma", "prefetch", "tile", "tile_elems", "rows_per_lane", "row_program"]  # KernelChoice order (memory_bound_capi.cc)

# ----------------------------------------------------------------------------- ours (ctypes)
class Ours:
    """Our plain launchers through the capi library, on torch's current stream."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        self.fn = lib.fusebox_bench_memory_bound
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        self.describe_fn = lib.fusebox_bench_memory_bound_describe
        self.describe_fn.restype = None
        self.describe_fn.argtypes = self.fn.argtypes[:7] + [ctypes.c_char_p, ctypes.c_int]
        self.error_name = lib.fusebox_bench_cuda_error_name
        self.error_name.restype = ctypes.c_char_p
        self.error_name.argtypes = [ctypes.c_int]
        self.cubin_fn = getattr(lib, "fusebox_bench_softmax_cubin", None)  # absent in builds before 2026-12-01
        if self.cubin_fn is not None:
            self.cubin_fn.restype = ctypes.c_int
            self.cubin_fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int, ctypes.c_void_p]
        self._keep = []

    def _args(self, op, x, out, choice=None):
        rows, cols = (1, x.numel()) if op == "gelu" else x.shape
        c = None
        if choice:
            c = (ctypes.c_int32 * len(CHOICE_KEYS))(*[choice.get(k, 0) for k in CHOICE_KEYS])
            self._keep.append(c)  # the array must outlive every call that passes it
        return [OP_CODES[op], DTYPE_CODES[x.dtype], x.data_ptr(), out.data_ptr(), rows, cols, c]

    def launcher(self, op, x, out, choice=None):
        """A no-argument call of ours on x into out (choice: {KernelChoice field: value}, None = the
        automatic choice); raises on a launch error."""
        args = self._args(op, x, out, choice) + [torch.cuda.current_stream().cuda_stream]

        def run():
            rc = self.fn(*args)
            if rc != 0:
                raise RuntimeError(f"fusebox_bench_memory_bound({op}): {self.error_name(rc).decode()} ({rc})")
        return run

    def cubin_launcher(self, path, x, out):
        """A no-argument call of Triton's softmax program from the cubin at path (--triton-cubin),
        launched by this library as it launches ours."""
        if self.cubin_fn is None:
            raise RuntimeError("this build of the capi library has no fusebox_bench_softmax_cubin")
        args = [path.encode(), x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
                torch.cuda.current_stream().cuda_stream]

        def run():
            rc = self.cubin_fn(*args)
            if rc != 0:
                raise RuntimeError(f"fusebox_bench_softmax_cubin: {self.error_name(rc).decode()} ({rc})")
        return run

    def describe(self, op, x, out, choice=None):
        buf = ctypes.create_string_buffer(128)
        self.describe_fn(*self._args(op, x, out, choice), buf, len(buf))
        return buf.value.decode()


def load_ours(path):
    """Ours, or None (said on stdout) when the library is not found or does not load."""
    here = os.path.dirname(os.path.abspath(__file__))
    tried = [path] if path else [os.path.join(here, CAPI_NAME), os.path.join(here, "..", "lib", CAPI_NAME)]
    for p in tried:
        if os.path.exists(p):
            try:
                ours = Ours(os.path.abspath(p))
                print(f"ours: {os.path.abspath(p)} (timed in this process, interleaved with the peers)", flush=True)
                return ours
            except OSError as e:
                print(f"NOTE: {p} did not load ({e})", flush=True)
    print(f"NOTE: no usable {CAPI_NAME} (tried {', '.join(tried)}): timing the peers only; the verdict "
          "will use memory_bound_bench.cc's numbers for ours (another process)", flush=True)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="ours, eager and Triton only (no torch.compile)")
    ap.add_argument("--shape", action="append", default=[], metavar="ROWSxCOLS",
                    help="time these softmax / row-sum shapes instead of the issue's (repeatable)")
    ap.add_argument("--trace", action="store_true", help="also trace the timed rounds' kernels (torch.profiler) "
                    "and print each kernel's median GPU duration and the idle gap before it")
    ap.add_argument("--tiny", action="store_true", help="also time a one-element fill in every case: the cost "
                    "of a launch and its events alone (a diagnostic)")
    ap.add_argument("--capi", help=f"path of {CAPI_NAME} (default: next to this script, then ../lib)")
    ap.add_argument("--only", action="append", default=[], metavar="CASE", help="op:dtype:ROWSxCOLS (repeatable)")
    ap.add_argument("--variant", action="append", default=[], metavar="CASE:key=v,...",
                    help="a forced kernel choice of ours timed beside the automatic one (repeatable)")
    ap.add_argument("--baseline", metavar="PATH", action="append", default=[],
                    help=f"another build of {CAPI_NAME} (e.g. the previous commit's), timed as 'ours@base' "
                    "interleaved with ours: an A/B of two builds in one process (repeatable: the second "
                    "is 'ours@base2', ...)")
    ap.add_argument("--pad-mib", type=int, default=0, metavar="N",
                    help="allocate N MiB before each case's tensors (a diagnostic: other physical placement)")
    ap.add_argument("--gap-mib", type=int, default=0, metavar="N",
                    help="allocate N MiB between each case's input and output (a diagnostic: their offset)")
    ap.add_argument("--flush", choices=["torch", "ours"], default="torch",
                    help="the L2 flush before each call: torch.sum over 256 MiB (default) or our row sum over "
                    "the same buffer with plain loads, as FlushL2 and the C++ bench (a diagnostic)")
    ap.add_argument("--triton-cubin", metavar="DIR",
                    help="also time Triton's softmax program from DIR/softmax_{fp32,bf16}.cubin "
                    "(triton_softmax_cubin.py) at 8192 columns, launched by our library (a diagnostic)")
    args = ap.parse_args()
    shapes = []
    for sh in args.shape:
        rows, _, cols = sh.partition("x")
        if not (rows.isdigit() and cols.isdigit() and int(rows) > 0 and int(cols) > 0):
            ap.error(f"--shape {sh}: expected ROWSxCOLS, e.g. 1056x8192")
        shapes.append((int(rows), int(cols)))
    shapes = shapes or SHAPES
    variants = {}  # case -> [(label, {field: value})]
    for v in args.variant:
        key, _, kv = v.rpartition(":")
        try:
            choice = {k: int(x) for k, x in (item.split("=") for item in kv.split(","))}
        except ValueError:
            ap.error(f"--variant {v}: expected op:dtype:ROWSxCOLS:key=v,...")
        bad = [k for k in choice if k not in CHOICE_KEYS]
        if bad:
            ap.error(f"--variant {v}: unknown field(s) {bad}; known: {CHOICE_KEYS}")
        variants.setdefault(key, []).append((kv, choice))
    only = set(args.only) | set(variants)  # empty: every case

    def wanted(op, dname, rows, cols):
        return not only or f"{op}:{dname}:{rows}x{cols}" in only
    torch.ones(1, device="cuda").sum()  # CUDA up in torch first; our library then shares its context
    ours = load_ours(args.capi)
    bases = []  # [(label, Ours)]: other builds, each its own copy of the kernels (RTLD_LOCAL)
    if args.baseline and ours is None:
        ap.error("--baseline needs our library as well (--capi)")
    for i, path in enumerate(args.baseline):
        bases.append((f"ours@base{i + 1 if i else ''}", Ours(os.path.abspath(path))))
        print(f"{bases[-1][0]}: {os.path.abspath(path)}", flush=True)
    timer = Timer(args.reps, args.trace)
    if args.flush == "ours":
        if ours is None:
            ap.error("--flush ours needs our library")
        flush_rows = timer.flush.view(-1, 16384)
        # Plain loads: streaming (evict-first) ones would leave older lines in L2 (launch.h, FlushL2).
        timer.flush_fn = ours.launcher("rowsum", flush_rows, torch.empty(flush_rows.shape[0], device="cuda"),
                                       {"streaming": -1})
    recs = []
    t0 = time.time()

    def emit(op, dtype, rows, cols, impl, nbytes, res, desc="", err="", paired=None):
        ms = lo = hi = 0.0
        if isinstance(res, Exception):
            why = f"{type(res).__name__}: {res}"[:200]
            err = err if why in err else "; ".join(filter(None, [err, why]))
        else:
            ms, lo, hi = res
        gbps = nbytes / (ms * 1e6) if ms > 0 else 0.0
        recs.append(dict(op=op, dtype=dtype, rows=rows, cols=cols, impl=impl, desc=desc, bytes=nbytes, ms=ms,
                         ms_min=lo, ms_max=hi, gbps=gbps, error=err))
        if impl in timer.kernel_us:  # --trace: kernel time per call (no launch latency)
            recs[-1]["kernel_us"], recs[-1]["kernels"] = timer.kernel_us[impl]
        if paired:  # ours' speed over this impl's, round by round
            recs[-1]["paired_ours_ratio"] = dict(zip(("median", "lo95", "hi95", "rounds"), paired))
        print(f"{op:8s} {dtype:9s} {rows:7d}x{cols:<8d} {impl:14s} {ms:9.4f} ms {gbps:8.1f} GB/s "
              f"[{time.time() - t0:5.0f}s] {err}", flush=True)
        return gbps

    # Ceilings.
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda").uniform_(-1, 1)
    b = torch.empty_like(a)
    for op, impl, nb, fn in [("ceiling_copy", "torch_copy", 2.0 * a.numel() * 4, lambda: b.copy_(a)),
                             ("ceiling_read", "torch_sum", 1.0 * a.numel() * 4, lambda: a.sum()),
                             ("ceiling_write", "torch_fill", 1.0 * a.numel() * 4, lambda: b.fill_(1.0))]:
        emit(op, "bytes", 1, a.numel() * 4, impl, nb, timer.time([(impl, fn)])[impl])
    # The same at 64 MiB, the size of the smallest cases (bf16 262144x128): what a plain copy or
    # read of that size reaches with launch, ramp-up and drain included. Context, not the target.
    a64, b64 = a[:1 << 24], b[:1 << 24]
    for op, impl, nb, fn in [("ceiling_copy_64MiB", "torch_copy", 2.0 * a64.numel() * 4, lambda: b64.copy_(a64)),
                             ("ceiling_read_64MiB", "torch_sum", 1.0 * a64.numel() * 4, lambda: a64.sum())]:
        emit(op, "bytes", 1, a64.numel() * 4, impl, nb, timer.time([(impl, fn)])[impl])
    del a, b, a64, b64

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

    def check_ours(op, x, out, run):
        """Ours on the benchmark tensors vs torch eager (tolerances as above, scaled with the row
        length: softmax values are ~1/cols, fp32 rounding of a sum grows ~sqrt(cols)). Returns ""
        or the error, printed loudly."""
        tol = 1e-4 if x.dtype == torch.float32 else 2e-2
        try:
            out.fill_(float("nan"))  # a launch that writes nothing cannot pass on stale data
            run()
            if op == "gelu":
                want, atol, rtol = F.gelu(x.float(), approximate="tanh"), tol, tol
            elif op == "softmax":
                want, atol, rtol = torch.softmax(x.float(), -1), tol / x.shape[-1], tol
            else:
                want = torch.sum(x, -1, dtype=torch.float32)
                atol, rtol = 1e-2 * max(1, x.shape[-1] / 1024) ** 0.5, 1e-3
            if torch.allclose(out.float(), want, atol=atol, rtol=rtol):
                return ""
            err = f"WRONG: ours disagrees with torch eager, max abs diff {(out.float() - want).abs().max().item():.3g}"
        except Exception as e:
            err = f"WRONG: ours failed: {type(e).__name__}: {e}"[:200]
        print(f"!!!!!!!! {op} {list(x.shape)} {x.dtype}: {err}", flush=True)
        return err

    def case(op, dname, rows, cols, nbytes, x, out, peers):
        """Checks ours on x (output into out), then times ours and the peers interleaved."""
        if not wanted(op, dname, rows, cols):
            return
        impls, errs, descs = list(peers), {}, {}
        if args.tiny:
            one = torch.empty(1, device="cuda")
            impls.append(("tiny_kernel", lambda: one.fill_(1.0)))
        if ours is not None:
            forced = variants.get(f"{op}:{dname}:{rows}x{cols}", [])
            mine = [("ours", ours, None)] + [("ours:" + label, ours, c) for label, c in forced]
            mine += [(label, lib, None) for label, lib in bases]
            for name, lib, choice in reversed(mine):
                run = lib.launcher(op, x, out, choice)
                errs[name], descs[name] = check_ours(op, x, out, run), lib.describe(op, x, out, choice)
                impls.insert(0, (name, run))
        res = timer.time(impls)
        gbps = {}
        paired = {name: paired_ratio(timer.rounds.get("ours"), timer.rounds.get(name, []))
                  for name, _ in impls if not name.startswith("ours")}
        for name, _ in impls:
            gbps[name] = emit(op, dname, rows, cols, name, nbytes, res[name], descs.get(name, ""), errs.get(name, ""),
                              paired.get(name))
        err = errs.get("ours", "")
        best = max((n for n in gbps if not n.startswith("ours") and n != "tiny_kernel"), key=gbps.get, default=None)
        if ours is not None and best and gbps[best] > 0:
            pr = paired[best]
            interval = f" paired {pr[0]:.4f} [{pr[1]:.4f}, {pr[2]:.4f}]" if pr else ""
            print(f"{'':44s} ours/best peer {gbps['ours'] / gbps[best]:.3f} ({best}){interval}"
                  f"{' WRONG' if err else ''}", flush=True)
        for label, _ in bases:
            if gbps.get(label, 0) > 0:
                print(f"{'':44s} ours/{label} {gbps['ours'] / gbps[label]:.4f}", flush=True)

    # One compiled lambda per op is recompiled for each shape and dtype (dynamo caches per code
    # object): past its recompile limit (8) dynamo silently runs eager instead, which made
    # "torch_compile" eager on the last bf16 shapes of every run before 2026-12-01 (NOTES run 24).
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)

    def compiled(f):
        return torch.compile(f, dynamic=False)

    for dname, dt in DTYPES.items():
        es = torch.finfo(dt).bits // 8
        if not wanted("gelu", dname, 1, GELU_N):
            x = y = None  # nothing to time: no 1 GiB tensors, no compile
        else:
            x = torch.empty(GELU_N, device="cuda", dtype=dt).uniform_(-4, 4)
            y = torch.empty_like(x)
            peers = [("torch_eager", lambda: F.gelu(x, approximate="tanh"))]
            if not args.quick:
                g = compiled(lambda t: F.gelu(t, approximate="tanh"))
                peers.append(("torch_compile", lambda: g(x)))
            peers.append(("triton", lambda: triton_gelu(x, y)))
            case("gelu", dname, 1, GELU_N, 2.0 * GELU_N * es, x, y, peers)
        del x, y
        for rows, cols in shapes:
            if not (wanted("softmax", dname, rows, cols) or wanted("rowsum", dname, rows, cols)):
                continue
            pad = torch.empty(args.pad_mib << 20, device="cuda", dtype=torch.uint8)  # held until the tensors go
            x = torch.empty(rows, cols, device="cuda", dtype=dt).uniform_(-4, 4)
            gap = torch.empty(args.gap_mib << 20, device="cuda", dtype=torch.uint8)  # held until the tensors go
            y = torch.empty_like(x)
            ys = torch.empty(rows, device="cuda", dtype=torch.float32)
            # Where the caching allocator put them (the same kernels time ~1.5% apart between this
            # process and a --only one: NOTES.md run 36), said for every case.
            print(f"{dname} {rows}x{cols}: input at {x.data_ptr():#x}, output at {y.data_ptr():#x} "
                  f"({(y.data_ptr() - x.data_ptr()) / 2**20:+.0f} MiB)", flush=True)
            peers = [("torch_eager", lambda: torch.softmax(x, dim=-1))]
            if not args.quick:
                f = compiled(lambda t: torch.softmax(t, dim=-1))
                peers.append(("torch_compile", lambda: f(x)))
            peers.append(("triton", lambda: triton_softmax(x, y)))
            if args.triton_cubin and ours is not None and cols == 8192:
                cubin = os.path.join(args.triton_cubin, f"softmax_{'fp32' if dt == torch.float32 else 'bf16'}.cubin")
                try:
                    run_cubin = ours.cubin_launcher(cubin, x, y)
                    y.fill_(float("nan"))
                    run_cubin()
                    tol = 1e-4 if es == 4 else 2e-2  # as check_ours
                    ok = torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=tol / cols, rtol=tol)
                    print(f"triton@capi ({cubin}) agrees with eager: {ok}", flush=True)
                    peers.append(("triton@capi", run_cubin))
                except RuntimeError as e:
                    print(f"NOTE: triton@capi ({cubin}) not timed: {e}", flush=True)
            case("softmax", dname, rows, cols, 2.0 * rows * cols * es, x, y, peers)
            peers = [("torch_eager", lambda: torch.sum(x, dim=-1, dtype=torch.float32))]
            if not args.quick:
                f2 = compiled(lambda t: torch.sum(t, dim=-1, dtype=torch.float32))
                peers.append(("torch_compile", lambda: f2(x)))
            peers.append(("triton", lambda: triton_rowsum(x, ys)))
            case("rowsum", dname, rows, cols, 1.0 * rows * cols * es + 4.0 * rows, x, ys, peers)
            del x, y, ys, pad, gap
    method = ("L2's persisting (evict_last) lines reset to normal" if timer.reset_l2 is not None else
              "L2's persisting lines NOT reset (no cudart found)")
    method += ", a ~300 us GPU spin (the host queues the call meanwhile), then L2 flushed by a 256 MiB read, before each call; CUDA events; median"
    if ours is not None:
        method += "; ours and the peers interleaved in this process, rotating order"
    if args.flush != "torch" or args.pad_mib or args.gap_mib or args.triton_cubin:
        method += (f"; DIAGNOSTIC RUN: flush by {args.flush}, {args.pad_mib} MiB allocated before each case, "
                   f"{args.gap_mib} MiB between input and output, Triton cubin {args.triton_cubin}")
    wrong = sum(1 for r in recs if r["impl"] == "ours" and r["error"])
    with open(args.json, "w") as fh:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       method=method, ours_in_process=ours is not None, records=recs), fh, indent=1)
    print(f"peers done in {time.time() - t0:.0f}s" + (f"; OURS WRONG on {wrong} cases" if wrong else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
