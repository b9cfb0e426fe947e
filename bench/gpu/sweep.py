"""Every-shape sweep of the memory-bound kernels: shapes drawn fresh on every run (the seed printed),
ours (libfusebox_memory_bound_capi.so, ctypes) against torch eager, torch.compile (dynamic=True)
and the plain Triton kernels, interleaved in one process (interleaved_timer: L2 flushed before
every call, rotating order), paired ratios with 95% intervals (paired_stats). Per op (gelu,
softmax, rowsum) and dtype (float32, float16, bfloat16): --shapes N shapes mixing LLM vocabulary
and hidden sizes, primes and odd sizes, 1-8 rows of 10^6+ columns, 10^6+ rows of <= 64 columns,
ranks 1-4, element-offset (unaligned) base pointers, sizes from 16 KiB to 2 GiB.
Shapes moving >= 64 MiB are also compared with a device-to-device copy of the same bytes timed in
the same rounds (% of copy). Tensors too small to be bandwidth-bound (< 8 MiB moved) are timed with
launch cost removed on both sides: CUDA graphs of K back-to-back calls, replayed interleaved.
Every shape checks ours against torch eager first. One failing case never stops the run; a time
budget (--budget-s) stops drawing new cases and still writes the results.
Targets (counted in the summary): >= 1.0x the best peer (a tie by the interval counts) and, for
shapes moving >= 64 MiB, >= 85% of the copy.
--dry-run prints the drawn shapes without torch or a GPU.
One device command (10 minutes) holds about a third of the 360 cases with torch.compile a peer:
--part K/N runs the cases K, K+N, K+2N... of the seed's plan (K from 1), and --from-json with
every part's JSON writes the whole sweep's Markdown (the parts must share seed and commit).
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import platform
import random
import sys
import time

OPS = ("gelu", "softmax", "rowsum")
DTYPE_NAMES = ("float32", "float16", "bfloat16")
ES = {"float32": 4, "float16": 2, "bfloat16": 2}
LLM = (32000, 50257, 128256, 151936, 4096, 11008, 14336)
PRIMES = (3, 7, 13, 31, 61, 127, 251, 333, 509, 1009, 2039, 4093, 8191, 16381, 32749, 65521, 100003,
          131071, 262139, 524287, 1000003, 3000017)
MIN_BYTES, MAX_BYTES = 16 << 10, 2 << 30
BIG_BYTES = 64 << 20          # moved bytes from which % of copy counts
GRAPH_BYTES = 8 << 20         # moved bytes below which launch cost is removed (graphs)
OP_CODES = {"gelu": 0, "softmax": 1, "rowsum": 2}
DTYPE_CODES = {"float32": 1, "float16": 2, "bfloat16": 3}


# ----------------------------------------------------------------------------- shapes (no torch)
def prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def split_rank(rng, rows, rank):
    """rows as a product of rank - 1 leading dims (exactly when possible)."""
    dims = []
    r = rows
    for _ in range(rank - 2):
        f = next((d for d in (2, 3, 5, 7) if r % d == 0 and r > d), 1)
        dims.append(f)
        r //= f
    return dims + [r]


def draw_shapes(rng, op, dname, n):
    """n shapes (dims tuples) for op / dtype, each with an element offset of the base pointers."""
    es = ES[dname]
    out = []
    kinds = ["llm", "longrows", "shortrows", "prime", "rank", "size"]
    i = 0
    while len(out) < n:
        kind = kinds[i % len(kinds)]
        i += 1
        if kind == "llm":
            cols = rng.choice(LLM)
            rows = rng.choice((1, 3, 7, 16, 77, 333, 1024, 2048, 4096, 8191))
        elif kind == "longrows":
            rows = rng.randint(1, 8)
            cols = rng.choice((rng.randint(1_000_000, 4_000_000), 1000003, 3000017, 1 << 20, 2_000_000 + 1))
        elif kind == "shortrows":
            rows = rng.randint(1_000_000, 4_000_000)
            cols = rng.choice((1, 3, 7, 16, 33, 63, 64, rng.randint(1, 64)))
        elif kind == "prime":
            cols = rng.choice(PRIMES)
            rows = rng.choice(PRIMES[:12])
        elif kind == "rank":
            cols = rng.choice((64, 333, 1000, 1003, 4096, 11008, 100003, rng.randint(2, 20000)))
            rows = rng.choice((3 * 5 * 7, 2 * 3 * 4 * 5, 7, 1, 6 * 1024, 3 * 5 * 7 * 11 * 13))
        else:  # a size drawn log-uniformly from 16 KiB to 2 GiB
            target = math.exp(rng.uniform(math.log(MIN_BYTES), math.log(MAX_BYTES))) / es
            cols = rng.choice((rng.randint(1, 100), rng.randint(100, 10000), rng.randint(10000, 300000)))
            rows = max(1, int(target // cols))
        # Sizes outside [16 KiB, 2 GiB] of input are scaled into it by the row count.
        b = rows * cols * es
        if b > MAX_BYTES:
            rows = max(1, MAX_BYTES // (cols * es))
        if rows * cols * es < MIN_BYTES:
            rows = -(-MIN_BYTES // (cols * es))
        if rows * cols * es > MAX_BYTES:  # one row of more than 2 GiB
            cols = MAX_BYTES // es
            rows = 1
        rank = rng.choice((1, 2, 2, 3, 4)) if rows > 1 else rng.choice((1, 2))
        if rank == 1 and rows > 1:
            rank = 2
        if op == "gelu" and kind in ("prime", "size") and rng.random() < 0.5:
            dims = (rows * cols,)  # a flat odd-length tensor
        elif rank == 1:
            dims = (cols,)
        else:
            dims = tuple(split_rank(rng, rows, rank)) + (cols,)
        offset = rng.choice((0, 0, 0, 0, 0, 1, 3)) if es == 4 else rng.choice((0, 0, 0, 0, 0, 1, 3, 5))
        out.append(dict(op=op, dtype=dname, dims=list(dims), kind=kind, offset=offset))
    return out


def moved_bytes(op, dname, dims):
    n = prod(dims)
    es = ES[dname]
    rows = n // dims[-1]
    return 2 * n * es if op != "rowsum" else n * es + 4 * rows


# ----------------------------------------------------------------------------- report (no torch)
def summarize(recs):
    """Per op and dtype: the worst ratio vs the best peer and its % of copy; targets met."""
    by = {}
    for r in recs:
        by.setdefault((r["op"], r["dtype"]), []).append(r)
    rows, met, total, wrong = [], 0, 0, 0
    for (op, dt), rs in sorted(by.items()):
        worst = None
        for r in rs:
            if r.get("error"):
                wrong += 1
            if r.get("ratio") is None:
                continue
            total += 1
            ok = r["target_peer"] and (r.get("target_copy") in (None, True))
            met += bool(ok)
            if worst is None or r["ratio"] < worst["ratio"]:
                worst = r
        worst_copy = min((r for r in rs if r.get("pct_copy") is not None), key=lambda r: r["pct_copy"], default=None)
        rows.append(dict(op=op, dtype=dt, shapes=len(rs), worst=worst, worst_copy=worst_copy))
    return rows, met, total, wrong


def fmt_ratio(r):
    if r is None or r.get("ratio") is None:
        return "-"
    lo, hi = r.get("ratio_lo"), r.get("ratio_hi")
    iv = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
    return f"{r['ratio']:.2f}x{iv} vs {r.get('best', '?')}"


def parse_part(text):
    """'K/N' -> (K, N), 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"--part takes K/N (e.g. 2/3), not {text!r}")
    if not 1 <= k <= n:
        raise SystemExit(f"--part {text}: K must be 1..N")
    return k, n


def merge_parts(parts):
    """One sweep's meta and records from its parts' JSONs (the same seed and commit)."""
    metas = [p["meta"] for p in parts]
    for key in ("seed", "commit", "shapes_per_op_dtype"):
        if len({m.get(key) for m in metas}) > 1:
            raise SystemExit(f"--from-json: the parts differ in {key}: {[m.get(key) for m in metas]}")
    meta = dict(metas[0])
    if len(parts) > 1:
        meta["part"] = ", ".join(m.get("part", "?") for m in metas)
        meta["date"] = ", ".join(sorted({m["date"] for m in metas}))
        meta["elapsed_s"] = sum(m.get("elapsed_s", 0) for m in metas)
    return meta, [r for p in parts for r in p["records"]]


def markdown(meta, recs):
    rows, met, total, wrong = summarize(recs)
    out = [f"# Every-shape sweep: {meta['gpu']}, {meta['date']}, commit {meta['commit']}, seed {meta['seed']}", "",
           f"Method: {meta['method']}", "",
           "| op | dtype | shape (dims, +offset) | MiB moved | timing | ours us | best peer | ours/best [95%] | % of copy | desc |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        pc = f"{r['pct_copy']:.0f}%" if r.get("pct_copy") is not None else "-"
        us = f"{r['ours_us']:.2f}" if r.get("ours_us") else "-"
        best = f"{r.get('best', '-')} {r['best_us']:.2f}" if r.get("best_us") else "-"
        rt = f"{r['ratio']:.3f} [{r['ratio_lo']:.3f}, {r['ratio_hi']:.3f}]" if r.get("ratio_lo") is not None else (
            f"{r['ratio']:.3f}" if r.get("ratio") is not None else "-")
        err = f" **{r['error'][:60]}**" if r.get("error") else ""
        out.append(f"| {r['op']} | {r['dtype']} | {'x'.join(map(str, r['dims']))} +{r['offset']} | "
                   f"{r['bytes'] / 2**20:.2f} | {r.get('timing', '-')} | {us} | {best} | {rt} | {pc} | "
                   f"{r.get('desc', '')}{err} |")
    out += ["", "## Summary (worst shape per op and dtype)", "",
            "| op | dtype | shapes | worst vs best peer | its % of copy | lowest % of copy (>= 64 MiB) |",
            "|---|---|---|---|---|---|"]
    for s in rows:
        w, wc = s["worst"], s["worst_copy"]
        wpc = f"{w['pct_copy']:.0f}%" if w and w.get("pct_copy") is not None else "-"
        lc = f"{wc['pct_copy']:.0f}% ({'x'.join(map(str, wc['dims']))})" if wc else "-"
        shape = f" ({'x'.join(map(str, w['dims']))} +{w['offset']})" if w else ""
        out.append(f"| {s['op']} | {s['dtype']} | {s['shapes']} | {fmt_ratio(w)}{shape} | {wpc} | {lc} |")
    out += ["", f"Targets met: {met} of {total} timed shapes (>= 1.0x best peer, a tie by the interval counts; "
            f">= 85% of copy where >= 64 MiB moved). Ours wrong or failed: {wrong}."]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- GPU part
def run(args, plan, meta):
    import torch
    import torch.nn.functional as F
    from interleaved_timer import Timer
    from paired_stats import paired_ratio
    from triton_peers import triton_gelu, triton_rowsum, triton_softmax

    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    lib = ctypes.CDLL(args.capi)
    fn = lib.fusebox_bench_memory_bound
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p]
    dfn = lib.fusebox_bench_memory_bound_describe
    dfn.restype = None
    dfn.argtypes = fn.argtypes[:7] + [ctypes.c_char_p, ctypes.c_int]
    ename = lib.fusebox_bench_cuda_error_name
    ename.restype = ctypes.c_char_p
    ename.argtypes = [ctypes.c_int]

    def ours_fn(op, dname, x2, out):
        rows, cols = x2.shape
        a = [OP_CODES[op], DTYPE_CODES[dname], x2.data_ptr(), out.data_ptr(), rows, cols, None]

        def call():  # the current stream at call time (graph capture runs on a side stream)
            rc = fn(*a, torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"ours: {ename(rc).decode()} ({rc})")
        buf = ctypes.create_string_buffer(160)
        dfn(*a, buf, len(buf))
        return call, buf.value.decode()

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    compiled = {}
    compile_s = [0.0]

    def compiled_fn(op):
        if op not in compiled:
            f = {"gelu": lambda t: F.gelu(t, approximate="tanh"), "softmax": lambda t: torch.softmax(t, dim=-1),
                 "rowsum": lambda t: torch.sum(t, dim=-1, dtype=torch.float32)}[op]
            compiled[op] = torch.compile(f, dynamic=True)
        return compiled[op]

    timer = Timer(args.rounds_big)
    recs = []
    t0 = time.time()
    for i, c in enumerate(plan):
        if time.time() - t0 > args.budget_s:
            print(f"time budget ({args.budget_s:.0f} s) spent: {len(plan) - i} cases not run", flush=True)
            break
        op, dname, dims, off = c["op"], c["dtype"], c["dims"], c["offset"]
        n = prod(dims)
        cols = dims[-1]
        rows = n // cols
        nbytes = moved_bytes(op, dname, dims)
        rec = dict(c, bytes=nbytes, rows=rows, cols=cols)
        x = y = base = ybase = None
        try:
            dt = tdt[dname]
            base = torch.empty(n + off, device="cuda", dtype=dt).uniform_(-4, 4)
            x = base[off:].view(dims)
            x2 = x.view(rows, cols)
            if op == "rowsum":
                ybase = torch.empty(rows + off, device="cuda", dtype=torch.float32)
                y = ybase[off:]
            else:
                ybase = torch.empty(n + off, device="cuda", dtype=dt)
                y = ybase[off:].view(rows, cols)
            call, desc = ours_fn(op, dname, x2, y)
            rec["desc"] = desc
            # Correctness against torch eager (fp32 math), outputs poisoned first.
            tol = 1e-4 if dname == "float32" else 2e-2
            y.fill_(float("nan"))
            call()
            if op == "gelu":
                want, atol, rtol = F.gelu(x2.float(), approximate="tanh"), tol, tol
            elif op == "softmax":
                # Outputs near 1/cols can be fp16 subnormals (ulp 2^-24 = 5.96e-8 below 6.1e-5), where
                # a rounding is up to half that step whatever rtol says: atol is at least one step of
                # the dtype's smallest subnormal (fp16 5.96e-8; bf16 9.2e-41, fp32 1.4e-45: no change).
                fi = torch.finfo(dt)
                atol = max(tol / cols, fi.smallest_normal * fi.eps)
                want, rtol = torch.softmax(x2.float(), -1), tol
            else:
                want = torch.sum(x2, -1, dtype=torch.float32)
                atol, rtol = 1e-2 * max(1, cols / 1024) ** 0.5, 1e-3
            got = y.float()
            # NaN / inf strict: allclose (equal_nan off) fails on a NaN or an inf where want has none.
            if not torch.allclose(got, want, atol=atol, rtol=rtol):
                rec["error"] = f"WRONG: max abs diff {(got - want).abs().max().item():.3g}"
                print(f"!!!!!!!! {op} {dname} {dims}+{off}: {rec['error']}", flush=True)
            del want, got
            # Peers on the rank-n tensor (eager, compile) and the 2-D view (Triton).
            ys = torch.empty(rows, device="cuda", dtype=torch.float32) if op == "rowsum" else None
            yt = torch.empty(rows, cols, device="cuda", dtype=dt) if op != "rowsum" else None
            if op == "gelu":
                eager = lambda: F.gelu(x, approximate="tanh")  # noqa: E731
                trit = lambda: triton_gelu(x2, yt)  # noqa: E731
            elif op == "softmax":
                eager = lambda: torch.softmax(x, dim=-1)  # noqa: E731
                trit = lambda: triton_softmax(x2, yt)  # noqa: E731
            else:
                eager = lambda: torch.sum(x, dim=-1, dtype=torch.float32)  # noqa: E731
                trit = lambda: triton_rowsum(x2, ys)  # noqa: E731
            impls = [("ours", call), ("torch_eager", eager), ("triton", trit)]
            if not args.no_compile and compile_s[0] < args.compile_budget_s:
                cf = compiled_fn(op)
                ts = time.time()
                try:
                    cf(x)
                    torch.cuda.synchronize()
                    impls.append(("torch_compile", lambda: cf(x)))
                except Exception as e:  # reported, not fatal
                    print(f"NOTE: torch.compile failed on {op} {dname} {dims}: {type(e).__name__}: {str(e)[:120]}")
                compile_s[0] += time.time() - ts
                if compile_s[0] >= args.compile_budget_s:
                    print(f"NOTE: torch.compile's time budget ({args.compile_budget_s:.0f} s) spent: "
                          "no torch_compile peer from here on", flush=True)
            copy_buf = None
            if nbytes >= BIG_BYTES:  # the copy ceiling: a D2D copy moving the same bytes
                half = nbytes // 2
                src = torch.empty(half, device="cuda", dtype=torch.uint8)
                copy_buf = torch.empty(half, device="cuda", dtype=torch.uint8)
                impls.append(("copy", lambda: copy_buf.copy_(src)))
            if nbytes < GRAPH_BYTES:
                rec["timing"] = "graph"
                res, rounds = time_graphs(torch, impls, args.graph_calls, args.rounds_small)
            else:
                rec["timing"] = "events, L2 flushed"
                reps = args.rounds_big if nbytes >= BIG_BYTES else args.rounds_mid
                res = timer.time(impls, reps)
                rounds = timer.rounds
            us = {k: v[0] * 1e3 for k, v in res.items() if isinstance(v, tuple)}
            for k, v in res.items():
                if not isinstance(v, tuple):
                    rec.setdefault("peer_errors", {})[k] = f"{type(v).__name__}: {str(v)[:100]}"
            rec["us"] = us
            rec["ours_us"] = us.get("ours")
            peers = [k for k in us if k not in ("ours", "copy")]
            if "ours" in us and peers:
                best = min(peers, key=us.get)
                pr = paired_ratio(rounds.get("ours"), rounds.get(best, []))
                rec["best"], rec["best_us"] = best, us[best]
                if pr:
                    rec["ratio"], rec["ratio_lo"], rec["ratio_hi"] = pr[0], pr[1], pr[2]
                else:
                    rec["ratio"] = us[best] / us["ours"]
                rec["target_peer"] = rec["ratio"] >= 1.0 or (rec.get("ratio_hi") or 0) >= 1.0
            if "copy" in us and "ours" in us:
                rec["pct_copy"] = 100.0 * us["copy"] / us["ours"]
                rec["target_copy"] = rec["pct_copy"] >= 85.0
            if rec.get("error"):
                rec["target_peer"] = False
            print(f"[{i + 1}/{len(plan)} {time.time() - t0:5.0f}s] {op:7s} {dname:8s} {'x'.join(map(str, dims))}"
                  f"+{off} {nbytes / 2**20:9.2f} MiB ours {us.get('ours', float('nan')):9.2f} us  "
                  f"{rec.get('best', '-')} {rec.get('best_us', float('nan')):9.2f} us  ratio "
                  f"{rec.get('ratio', float('nan')):.3f}" + (f"  {rec['pct_copy']:.0f}% of copy" if 'pct_copy' in rec else "")
                  + f"  {rec.get('desc', '')}", flush=True)
            del impls, eager, trit, ys, yt, copy_buf
        except Exception as e:  # one case never stops the sweep
            rec["error"] = rec.get("error") or f"case failed: {type(e).__name__}: {str(e)[:160]}"
            print(f"!!!!!!!! {op} {dname} {dims}+{off}: {rec['error']}", flush=True)
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
        recs.append(rec)
        x = y = base = ybase = x2 = None
        if nbytes >= (256 << 20):
            torch.cuda.empty_cache()
    meta["compile_s"] = compile_s[0]
    meta["elapsed_s"] = time.time() - t0
    return recs


def time_graphs(torch, impls, calls, rounds):
    """Launch cost removed: each impl captured as a CUDA graph of `calls` back-to-back calls; the
    graphs replayed in interleaved rounds (rotating order), time per call from CUDA events.
    Returns ({name: (median ms, min, max) or exception}, {name: per-round ms})."""
    import statistics
    graphs, out = [], {}
    for name, f in impls:
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    f()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(calls):
                    f()
            g.replay()
            torch.cuda.synchronize()
            graphs.append((name, g))
        except Exception as e:
            out[name] = e
            torch.cuda.synchronize()
    times = {name: [] for name, _ in graphs}
    for r in range(rounds):
        k = r % max(1, len(graphs))
        for name, g in graphs[k:] + graphs[:k]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            times[name].append((a, b))
    torch.cuda.synchronize()
    rounds_ms = {}
    for name, ev in times.items():
        t = [a.elapsed_time(b) / calls for a, b in ev]
        rounds_ms[name] = list(t)
        t.sort()
        out[name] = (statistics.median(t), t[0], t[-1])
    del graphs
    return out, rounds_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="default: drawn from the clock (printed)")
    ap.add_argument("--shapes", type=int, default=40, help="shapes per op and dtype")
    ap.add_argument("--quick", action="store_true", help="12 shapes per op and dtype, fewer rounds")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default=",".join(DTYPE_NAMES))
    ap.add_argument("--dry-run", action="store_true", help="print the drawn shapes and exit (no torch, no GPU)")
    ap.add_argument("--capi", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "libfusebox_memory_bound_capi.so"))
    ap.add_argument("--json", default="sweep.json")
    ap.add_argument("--md", default="sweep.md")
    ap.add_argument("--rounds-big", type=int, default=20, help="rounds for shapes moving >= 64 MiB")
    ap.add_argument("--rounds-mid", type=int, default=30, help="rounds for 8-64 MiB")
    ap.add_argument("--rounds-small", type=int, default=40, help="graph replays for < 8 MiB")
    ap.add_argument("--graph-calls", type=int, default=20, help="calls per graph (< 8 MiB)")
    ap.add_argument("--budget-s", type=float, default=270.0, help="no new case after this many seconds")
    ap.add_argument("--compile-budget-s", type=float, default=60.0, help="torch.compile time before it is dropped")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--from-json", nargs="+", metavar="JSON",
                    help="rewrite the markdown from a sweep's JSON, or from its parts' (merged into --json); no GPU")
    ap.add_argument("--part", default="1/1", metavar="K/N",
                    help="run the cases K, K+N, ... of the drawn plan (K from 1; default 1/1: all)")
    args = ap.parse_args()
    if args.from_json:
        parts = []
        for path in args.from_json:
            with open(path) as fh:
                parts.append(json.load(fh))
        meta, recs = merge_parts(parts)
        if len(parts) > 1:
            with open(args.json, "w") as fh:
                json.dump(dict(meta=meta, records=recs), fh, indent=1)
        with open(args.md, "w") as fh:
            fh.write(markdown(meta, recs))
        print(open(args.md).read().split("## Summary")[-1])
        return 0
    part, parts = parse_part(args.part)
    if args.quick:
        args.shapes = min(args.shapes, 12)
        args.rounds_big, args.rounds_mid, args.rounds_small = 10, 15, 20
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % (1 << 31)
    print(f"sweep seed {seed} (rerun these shapes with --seed {seed})", flush=True)
    rng = random.Random(seed)
    plan = []
    for dname in args.dtypes.split(","):
        for op in args.ops.split(","):
            plan += draw_shapes(rng, op, dname, args.shapes)
    # Interleave ops and dtypes, small first within a budget: a stopped run still covers all.
    order = random.Random(seed + 1)
    order.shuffle(plan)
    drawn = len(plan)
    plan = plan[part - 1::parts]
    if parts > 1:
        print(f"part {part} of {parts}: {len(plan)} of the {drawn} drawn cases", flush=True)
    meta = dict(seed=seed, commit=os.environ.get("COMMIT", "unknown"), date=datetime.datetime.utcnow().strftime("%F %H:%M UTC"),
                host=platform.node(), shapes_per_op_dtype=args.shapes, gpu="(dry run)", part=f"{part}/{parts}",
                method=("ours (capi, ctypes) vs torch eager, torch.compile(dynamic=True), Triton, interleaved in one "
                        "process with rotating order; >= 8 MiB: CUDA events, ~300 us GPU spin and a 256 MiB L2 "
                        f"flush before every call, median of {args.rounds_big} (>= 64 MiB) / {args.rounds_mid} rounds; "
                        f"< 8 MiB: CUDA graphs of {args.graph_calls} calls replayed {args.rounds_small} times "
                        "(launch cost removed on both sides, L2 warm); paired ratios best-peer/ours with "
                        "distribution-free 95% intervals; % of copy = a device-to-device copy of the same bytes "
                        "in the same rounds"))
    if args.dry_run:
        for c in plan:
            print(f"{c['op']:7s} {c['dtype']:8s} {c['kind']:9s} {'x'.join(map(str, c['dims'])):>24s} +{c['offset']} "
                  f"{moved_bytes(c['op'], c['dtype'], c['dims']) / 2**20:10.3f} MiB moved")
        total = sum(moved_bytes(c['op'], c['dtype'], c['dims']) for c in plan)
        print(f"{len(plan)} shapes, {total / 2**30:.1f} GiB moved once each")
        return 0
    import torch
    import triton
    meta["gpu"] = torch.cuda.get_device_name()
    meta["torch"], meta["triton"] = torch.__version__, triton.__version__
    recs = run(args, plan, meta)
    with open(args.json, "w") as fh:
        json.dump(dict(meta=meta, records=recs), fh, indent=1)
    md = markdown(meta, recs)
    with open(args.md, "w") as fh:
        fh.write(md)
    print("\n" + md.split("## Summary")[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
