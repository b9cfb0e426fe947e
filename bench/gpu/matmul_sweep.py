"""Every-shape sweep of matmul+ReLU: shapes drawn fresh on every run (the seed printed), ours
(libfusebox_matmul_capi.so impl 0, the cuBLASLt runner the server uses) against what a user would
run instead, interleaved in one process (interleaved_timer: L2 flushed and a GPU spin before every
call, rotating order), paired ratios with distribution-free 95% intervals (paired_stats).

Shapes (--shapes N per mode, half with a bias): odd and prime M, N, K; skinny (M or N of 1-64
against thousands); GEMV (M = 1 or N = 1); LLM projections (K and N from 4096, 11008, 14336,
odd token counts); squares up to 8191. Modes: fp32 with TF32 off ("fp32") and on ("tf32"), fp16,
bf16. Peers: `torch.relu(a @ b + bias)` (without a bias `torch.relu(a @ b)`) and, with a bias,
`torch._addmm_activation(bias, a, b)` (cuBLASLt's RELU_BIAS epilogue, what we should match).
Targets (counted in the summary): >= 1.0x the first peer and >= 0.98x the second, each a tie by
its interval counting. Every case is first checked: ours into a NaN-poisoned output against
relu(a @ b + bias) in float64 (relative L2 error within the mode's tolerance, no NaN).
Cost: about 1-2 minutes on an H200 for 24 shapes per mode.
--dry-run prints the drawn shapes without torch or a GPU.

usage: python3 matmul_sweep.py --capi PATH/libfusebox_matmul_capi.so [--seed N] [--shapes N]
           [--json FILE] [--md FILE] [--rounds N] [--dry-run]
"""
import argparse
import ctypes
import datetime
import json
import os
import platform
import random
import sys
import time

MODES = ("fp32", "tf32", "fp16", "bf16")
DTYPE_CODES = {"fp32": 1, "tf32": 1, "fp16": 2, "bf16": 3}
TOL = {"fp32": 1e-5, "tf32": 3e-3, "fp16": 3e-3, "bf16": 1e-2}
LLM = (4096, 11008, 14336)
PRIMES = (3, 7, 13, 31, 61, 127, 251, 509, 1009, 2039, 4093, 8191)
MAX_FLOPS = 2 * 8192 ** 3  # per case: keeps a sweep within minutes
MAX_ELEMS = 1 << 28          # per operand


def draw_shapes(rng, n):
    """n (m, n, k, bias, kind) tuples mixing the kinds, about half with a bias."""
    kinds = ["odd", "skinny", "gemv", "llm", "square", "prime"]
    out = []
    i = 0
    while len(out) < n:
        kind = kinds[i % len(kinds)]
        i += 1
        if kind == "odd":
            m, nn, k = (rng.randrange(65, 6000) | 1 for _ in range(3))
        elif kind == "skinny":
            small, big1, big2 = rng.randint(1, 64), rng.randrange(1000, 16385), rng.randrange(1000, 16385)
            m, nn, k = (small, big1, big2) if rng.random() < 0.5 else (big1, small, big2)
        elif kind == "gemv":
            big1, big2 = rng.randrange(1000, 16385), rng.randrange(1000, 16385)
            m, nn, k = (1, big1, big2) if rng.random() < 0.5 else (big1, 1, big2)
        elif kind == "llm":
            m = rng.choice((1, 7, 33, 77, 333, 1023, 2049, 4097, 8191))
            k, nn = rng.choice(LLM), rng.choice(LLM)
        elif kind == "square":
            m = nn = k = rng.choice((255, 1000, 1025, 2047, 3001, 4095, 6143, 8191))
        else:
            m, nn, k = (rng.choice(PRIMES) for _ in range(3))
        while 2 * m * nn * k > MAX_FLOPS or max(m * k, k * nn, m * nn) > MAX_ELEMS:
            k = max(1, k // 2)
            if 2 * m * nn * k > MAX_FLOPS and k == 1:
                m, nn = max(1, m // 2), max(1, nn // 2)
        out.append((m, nn, k, rng.random() < 0.5, kind))
    return out


def summarize(recs):
    """Per mode: the worst ratio against each peer, and the targets met."""
    lines = ["| mode | cases | vs relu(a@b+bias): worst [interval] (shape) | vs _addmm_activation: worst [interval] (shape) | targets met |",
             "|---|---|---|---|---|"]
    total = met = 0
    for mode in MODES:
        rs = [r for r in recs if r["mode"] == mode and "ratio_relu" in r]
        if not rs:
            continue
        wr = min(rs, key=lambda r: r["ratio_relu"][0])
        ra = [r for r in rs if r.get("ratio_addmm")]
        wa = min(ra, key=lambda r: r["ratio_addmm"][0]) if ra else None
        ok = sum(r["met"] for r in rs)
        total += len(rs)
        met += ok

        def fmt(r, key):
            if r is None:
                return "-"
            q = r[key]
            return (f"{q[0]:.3f} [{q[1]:.3f}, {q[2]:.3f}] ({r['m']}x{r['n']}x{r['k']}"
                    f"{' +bias' if r['bias'] else ''})")
        lines.append(f"| {mode} | {len(rs)} | {fmt(wr, 'ratio_relu')} | {fmt(wa, 'ratio_addmm')} | {ok}/{len(rs)} |")
    return lines, met, total


def write_md(path, meta, recs):
    lines, met, total = summarize(recs)
    wrong = [r for r in recs if r.get("check") == "FAIL"]
    head = [f"# matmul+ReLU sweep, {meta['date']}, commit {meta['commit']}, {meta['gpu']}",
            "",
            f"Seed {meta['seed']} ({meta['shapes_per_mode']} shapes per mode, drawn fresh; the seed redraws them). "
            f"{meta['method']}",
            "",
            f"Targets met: {met} of {total}; wrong results: {len(wrong)}.",
            ""]
    rows = ["", "| mode | M x N x K | bias | kind | ours us | relu(a@b+bias) us | ratio [95%] | _addmm_activation us | ratio [95%] | TFLOP/s | rel err | met |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: (MODES.index(r["mode"]), r.get("ratio_relu", [9])[0])):
        def q(key):
            v = r.get(key)
            return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" if v else "-"

        def us(name):
            v = r.get("us", {}).get(name)
            return f"{v:.2f}" if v is not None else "-"
        rows.append(f"| {r['mode']} | {r['m']}x{r['n']}x{r['k']} | {'yes' if r['bias'] else 'no'} | {r['kind']} | "
                    f"{us('ours')} | {us('torch_relu')} | {q('ratio_relu')} | {us('torch_addmm_activation')} | "
                    f"{q('ratio_addmm')} | {r.get('tflops', 0):.1f} | {r.get('rel_err', float('nan')):.2e} | "
                    f"{'yes' if r.get('met') else 'NO'} |")
    with open(path, "w") as f:
        f.write("\n".join(head + lines + rows) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capi", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "libfusebox_matmul_capi.so"))
    ap.add_argument("--seed", type=int, default=None, help="default: drawn from the clock (printed)")
    ap.add_argument("--shapes", type=int, default=24, help="shapes per mode")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per case")
    ap.add_argument("--json", default="matmul_sweep.json")
    ap.add_argument("--md", default="matmul_sweep.md")
    ap.add_argument("--budget-s", type=float, default=400.0, help="no new case after this many seconds")
    ap.add_argument("--dry-run", action="store_true", help="print the drawn shapes and exit (no torch, no GPU)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % (2 ** 31)
    print(f"matmul sweep seed {seed}", flush=True)
    rng = random.Random(seed)
    cases = [(mode, s) for mode in MODES for s in draw_shapes(rng, args.shapes)]
    if args.dry_run:
        for mode, (m, n, k, bias, kind) in cases:
            print(f"{mode} {m}x{n}x{k} {'bias' if bias else '-'} {kind}")
        return 0

    import torch  # noqa: E402 (the dry run needs no torch)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from interleaved_timer import Timer  # noqa: E402
    from paired_stats import paired_ratio  # noqa: E402

    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")  # torch's cuBLAS first
    lib = ctypes.CDLL(args.capi)
    fn = lib.fusebox_bench_matmul
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                   ctypes.c_void_p]
    timer = Timer(args.rounds)
    dtypes = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    recs = []
    start = time.time()
    for idx, (mode, (m, n, k, with_bias, kind)) in enumerate(cases):
        if time.time() - start > args.budget_s:
            print(f"budget of {args.budget_s:g} s spent: {len(cases) - idx} cases not run", flush=True)
            break
        torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
        dt = dtypes[mode]
        g = torch.Generator(device="cuda").manual_seed(seed + idx)
        a = torch.rand(m, k, device="cuda", dtype=dt, generator=g) * 2 - 1
        b = torch.rand(k, n, device="cuda", dtype=dt, generator=g) * 2 - 1
        bias = torch.rand(n, device="cuda", dtype=dt, generator=g) * 2 - 1
        c = torch.empty(m, n, device="cuda", dtype=dt)
        rec = dict(mode=mode, m=m, n=n, k=k, bias=with_bias, kind=kind)
        tf32 = int(mode == "tf32")

        def ours():
            rc = fn(DTYPE_CODES[mode], m, n, k, a.data_ptr(), b.data_ptr(),
                    bias.data_ptr() if with_bias else None, c.data_ptr(), tf32, 0,
                    torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"fusebox_bench_matmul rc={rc}")
        try:
            c.fill_(float("nan"))
            ours()
            torch.cuda.synchronize()
            r = a.double() @ b.double()
            r = torch.relu(r + bias.double() if with_bias else r)
            err = ((c.double() - r).norm() / max(r.norm().item(), 1e-30)).item()
            nans = int(torch.isnan(c).sum().item())
            ok = nans == 0 and err <= TOL[mode]
            rec.update(rel_err=err, nans=nans, check="pass" if ok else "FAIL")
            del r
        except Exception as e:  # one failing case never stops the sweep
            rec.update(check="FAIL", error=str(e))
            recs.append(rec)
            print(json.dumps(rec), flush=True)
            continue
        impls = [("ours", ours)]
        if with_bias:
            impls.append(("torch_relu", lambda: torch.relu(a @ b + bias)))
            impls.append(("torch_addmm_activation", lambda: torch._addmm_activation(bias, a, b)))
        else:
            impls.append(("torch_relu", lambda: torch.relu(a @ b)))
        res = timer.time(impls)
        rec["us"] = {name: v[0] * 1000 for name, v in res.items() if not isinstance(v, Exception)}
        errs = {name: str(v) for name, v in res.items() if isinstance(v, Exception)}
        if errs:
            rec["errors"] = errs
        rounds = timer.rounds
        if "ours" in rounds:
            rec["tflops"] = 2.0 * m * n * k / (rec["us"]["ours"] * 1e6)
            for peer, key in (("torch_relu", "ratio_relu"), ("torch_addmm_activation", "ratio_addmm")):
                if peer in rounds:
                    pr = paired_ratio(rounds["ours"], rounds[peer])
                    if pr:
                        rec[key] = list(pr[:3])
        met = rec.get("check") == "pass" and "ratio_relu" in rec and rec["ratio_relu"][2] >= 1.0
        if with_bias:
            met = met and "ratio_addmm" in rec and rec["ratio_addmm"][2] >= 0.98
        rec["met"] = bool(met)
        recs.append(rec)
        print(json.dumps(rec), flush=True)
        del a, b, bias, c
    meta = dict(seed=seed, commit=os.environ.get("COMMIT", "?"),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                host=platform.node(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                shapes_per_mode=args.shapes, elapsed_s=time.time() - start,
                method=(f"ours (capi impl 0: the server's cuBLASLt runner) vs torch.relu(a @ b + bias) and "
                        f"torch._addmm_activation, interleaved in one process, L2 flushed and a GPU spin before "
                        f"every call, median of {args.rounds} rounds; paired ratios peer/ours with "
                        f"distribution-free 95% intervals; a target is met when the interval reaches it"))
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "records": recs}, f)
    write_md(args.md, meta, recs)
    lines, met, total = summarize(recs)
    print("\n".join(lines))
    wrong = sum(r.get("check") == "FAIL" for r in recs)
    print(f"targets met: {met} of {total}; wrong: {wrong}; seed {seed}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
