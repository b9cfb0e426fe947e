"""Probe: why tiny tensors lose to Triton under CUDA-graph replay. For each case
(op:dtype:ROWSxCOLS), times ours (the memory-bound C API), the plain Triton peer and
torch.compile as graphs of 20 calls replayed interleaved (as bench/gpu/sweep.py does), and,
under `ncu -k regex:'Softmax|RowSum|Gelu|triton_'`, launches each once more for Nsight Compute.
CASE = op:dtype:ROWSxCOLS[+OFFSET][@key=v,key=v;key=v...]: each ;-separated set of KernelChoice
fields (tpr vpt cluster threads smem long_rows pipeline streaming exp_once split split_wait exp_fma
prefetch tile) adds a forced variant of ours, timed in the same rounds.
usage: python3 tiny_kernels.py BUNDLE_BIN CASE... (PROBE_NCU=1: the ncu pass only)"""
import ctypes
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, sys.argv[1])
from triton_peers import triton_gelu, triton_rowsum, triton_softmax  # noqa: E402

lib = ctypes.CDLL(os.path.join(sys.argv[1], "libfusebox_memory_bound_capi.so"))
fn = lib.fusebox_bench_memory_bound
fn.restype = ctypes.c_int
fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
               ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
OPS = {"gelu": 0, "softmax": 1, "rowsum": 2}
DT = {"float32": (torch.float32, 1), "float16": (torch.float16, 2), "bfloat16": (torch.bfloat16, 3)}


KEYS = ["tpr", "vpt", "cluster", "threads", "smem", "long_rows", "pipeline", "streaming", "exp_once",
        "split", "split_wait", "exp_fma", "prefetch", "tile", "tile_elems"]


def impls(op, dname, rows, cols, off, variants):
    dt, code = DT[dname]
    xb = torch.randn(rows * cols + off, device="cuda").to(dt)
    x = xb[off:].view(rows, cols)
    ob = torch.empty(rows + off, device="cuda") if op == "rowsum" else torch.empty_like(xb)
    out = ob[off:] if op == "rowsum" else ob[off:].view(rows, cols)

    def make(choice):
        arr = None
        if choice is not None:
            arr = (ctypes.c_int32 * 15)(*choice)

        def ours():
            rc = fn(OPS[op], code, x.data_ptr(), out.data_ptr(), rows, cols, arr,
                    torch.cuda.current_stream().cuda_stream)
            assert rc == 0, (choice, rc)
        return ours
    res = {"ours": make(None)}
    for v in variants:
        if v.startswith("probe="):  # lab/probes/tiny_softmax_probe.cu: probe=TPRxTHREADS
            tpr, threads = map(int, v[6:].split("x"))
            plib = ctypes.CDLL(os.path.join(sys.argv[1], "libtiny_probe.so"))
            pf = plib.tiny_softmax
            pf.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int, ctypes.c_void_p]

            def probe(tpr=tpr, threads=threads, pf=pf):
                rc = pf(code, x.data_ptr(), out.data_ptr(), rows, cols, tpr, threads,
                        torch.cuda.current_stream().cuda_stream)
                assert rc == 0, rc
            res[v] = probe
            continue
        c = [0] * 15
        for kv in v.split(","):
            k, val = kv.split("=")
            c[KEYS.index(k)] = int(val)
        res["ours:" + v] = make(c)
    ours = res["ours"]
    tri = {"gelu": lambda: triton_gelu(x.view(-1), out.view(-1)),
           "softmax": lambda: triton_softmax(x, out),
           "rowsum": lambda: triton_rowsum(x, out)}[op]
    f = {"gelu": lambda t: F.gelu(t, approximate="tanh"), "softmax": lambda t: torch.softmax(t, -1),
         "rowsum": lambda t: torch.sum(t, -1, dtype=torch.float32)}[op]
    comp = torch.compile(f, dynamic=True)
    res.update({"triton": tri, "compile": lambda: comp(x), "eager": lambda: f(x), "_x": x, "_out": out})
    return res


def graph_times(fns, calls=20, rounds=40):
    graphs = {}
    for name, f in fns.items():
        try:
            f()
        except AssertionError as e:
            print(f"    {name}: refused ({e})")
            continue
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):
                for _ in range(calls):
                    f()
        graphs[name] = g
    t = {n: [] for n in graphs}
    names = list(graphs)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graphs[n].replay()
            b.record()
            b.synchronize()
            t[n].append(a.elapsed_time(b) * 1000 / calls)
    return {n: statistics.median(v) for n, v in t.items()}


for case in sys.argv[2:]:
    case, _, vs = case.partition("@")
    op, dname, shape = case.split(":")
    shape, _, off = shape.partition("+")
    rows, cols = map(int, shape.split("x"))
    fns = impls(op, dname, rows, cols, int(off or 0), [v for v in vs.split(";") if v])
    if os.environ.get("PROBE_NCU") == "1":
        for k, f in fns.items():
            if k.startswith("_"):
                continue
            f()
            f()
        torch.cuda.synchronize()
        continue
    med = graph_times({k: v for k, v in fns.items() if not k.startswith("_")})
    for k, f in fns.items():
        if k.startswith("probe="):
            fns["_out"].fill_(float("nan"))
            f()
            err = (fns["_out"].float() - torch.softmax(fns["_x"].float(), -1)).abs().max().item()
            print(f"    {k}: max |err| {err:.2e}")
    print(case, flush=True)
    for n, v in med.items():
        print(f"    {n:36s} {v:6.2f} us", flush=True)
