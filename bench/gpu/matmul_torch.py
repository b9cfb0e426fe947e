"""Our matmul+ReLU beside its PyTorch peers: same shapes, same tensors, same harness, one process.

torch.relu(a @ b)                     -- what a user writes: GEMM, then a separate ReLU pass
torch._addmm_activation(bias, a, b)   -- cuBLASLt with the RELU_BIAS epilogue (what we should match)
ours (libfusebox_matmul_capi.so via ctypes): cuBLASLt path without / with bias as the server
  runs it, tiled kernel (automatic choice: wgmma where it applies) and tiled forced to mma.sync,
  both with bias.

Timed by interleaved_timer.Timer, the memory-bound harness's timer: the variants of one shape and
dtype interleaved, every variant once per round in a rotating order, each call preceded by a
~300 us GPU spin (the host queues the call meanwhile, so no variant is timed waiting for its own
Python launch path) and an L2 flush (a 256 MiB read), CUDA events around the call; median of
10-100 rounds (about 100 ms of calls per variant). So clock and temperature drift, which moved
run 6's sequential main-pass ratios by up to 5% between runs, affect every variant alike.
Inputs uniform in [-1, 1), fresh per shape and dtype. fp32 runs twice: exact ("highest") and TF32
("high"). Correctness on the same inputs: ours vs relu(a @ b + bias) in float64 on the GPU
(relative L2 error), and NaN-free.

"ours Lt" is the server's default runner: 32 MiB workspace, two picks (the heuristic's first pick
for a 32 MiB and for a 1 MiB workspace preference, timed against each other once per key where they
differ; matmul.h). Its "algo" field says which pick it took ("choice ...", with the timed ms).

A/B rounds (run 5): after the main pass of a shape and dtype, "Lt default (two picks)" beside
"Lt 32 MiB first pick" and "Lt 1 MiB first pick" (PyTorch's cuBLASLt workspace) and, with bias,
torch._addmm_activation: --ab-rounds rounds, each one interleaved timing of the variants (about
--ab-rep ms of calls per variant), one median per variant and round. Rows carry "ab_round",
"label" and the algorithm cuBLASLt picked for that runner ("algo": id, tile, stages, split-K, ...,
a hash of the opaque algorithm -- equal hashes, same kernel and configuration -- and the choice).
--ab missed (the default) runs them only for a (shape, dtype, bias) where the 32 MiB and the 1 MiB
first picks differ (the fp32/tf32 cases where the two-pick timing decides something) or where the
main pass missed 0.98x torch._addmm_activation with bias; --ab all for every case.

One JSON object per line; main-pass rows carry median_ms, min_ms, max_ms and rounds. Cost: about
40 s on an H200, plus ~2 s per A/B case (--ab missed: ~10-16 cases; --ab all: 40).

usage: python3 matmul_torch.py --capi PATH/libfusebox_matmul_capi.so [--json FILE] [--quick]
           [--ab all|missed|none] [--ab-rounds N] [--ab-rep MS]
"""
import argparse
import ctypes
import json
import sys

import torch

from interleaved_timer import Timer

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4000, 4000, 4000), (16384, 16384, 256),
          (64, 4096, 4096)]
MODES = [("fp32", torch.float32, "highest", 1), ("tf32", torch.float32, "high", 1),
         ("fp16", torch.float16, "highest", 2), ("bf16", torch.bfloat16, "highest", 3)]
TOL = {"fp32": 1e-5, "tf32": 3e-3, "fp16": 3e-3, "bf16": 1e-2}
# impl codes of libfusebox_matmul_capi (matmul_capi.cc): 0 is the server's default runner.
LT_DEFAULT = ("cublaslt", 0, "Lt default (two picks)")
LT_FIRST_32M = ("cublaslt_first32m", 5, "Lt 32 MiB first pick")
LT_FIRST_1M = ("cublaslt_first1m", 4, "Lt 1 MiB first pick")
LT_VARIANTS = [LT_DEFAULT, LT_FIRST_32M, LT_FIRST_1M]
# --ab missed: also every bias case below this ratio to _addmm_activation in the main pass.
BIAS_TARGET = 0.98
MAIN_MS, MAIN_ROUNDS = 100.0, (10, 100)  # main pass: ms of calls per variant, rounds (min, max)
AB_ROUNDS_PER_ROUND = (5, 50)  # A/B: timed calls per variant in one round (min, max)


def rounds_for(run, budget_ms, bounds):
    """Rounds that give about budget_ms of calls of `run` (one call timed now), within bounds."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    run()
    b.record()
    torch.cuda.synchronize()
    return max(bounds[0], min(bounds[1], int(budget_ms / max(a.elapsed_time(b), 1e-3))))


def algo_hash(a):
    """The opaque-algorithm hash of an algo string (None if absent)."""
    return a.split(" hash ")[1].split()[0] if a and " hash " in a else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capi", required=True)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ab", choices=("all", "missed", "none"), default="missed")
    ap.add_argument("--ab-rounds", type=int, default=3)
    ap.add_argument("--ab-rep", type=float, default=40.0, help="ms of calls per variant in one A/B round")
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
    ws_of = lib.fusebox_bench_workspace_bytes
    ws_of.restype = ctypes.c_int64
    ws_of.argtypes = [ctypes.c_int]
    algo_of = lib.fusebox_bench_matmul_algo
    algo_of.restype = ctypes.c_int
    algo_of.argtypes = fn.argtypes + [ctypes.c_char_p, ctypes.c_int]  # ..., impl, stream, buf, len
    default_ws = ws_of(LT_DEFAULT[1])
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; our default cuBLASLt "
          f"workspace {default_ws} B, two picks; A/B variants {[lb for _, _, lb in LT_VARIANTS]}",
          file=sys.stderr)
    failures = 0
    timer = Timer(MAIN_ROUNDS[1])

    def emit(row):
        line = json.dumps(row)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

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
            checkable = m * n * k <= 2**40
            refs = {}

            def ref_for(with_bias):
                if with_bias not in refs:
                    r = a.double() @ b.double()
                    refs[with_bias] = torch.relu(r + bias.double() if with_bias else r)
                return refs[with_bias]

            def ours(impl, with_bias):
                def run():
                    stream = torch.cuda.current_stream().cuda_stream
                    rc = fn(code, m, n, k, a.data_ptr(), b.data_ptr(),
                            bias.data_ptr() if with_bias else None, c.data_ptr(), tf32, impl, stream)
                    if rc != 0:
                        raise RuntimeError(f"fusebox_bench_matmul impl {impl} rc={rc}")
                return run

            def algo(impl, with_bias):
                """The algorithm of a cuBLASLt code; chosen now on a first call (code 0 may time
                its two picks on the current stream, writing c)."""
                buf = ctypes.create_string_buffer(512)
                algo_of(code, m, n, k, a.data_ptr(), b.data_ptr(),
                        bias.data_ptr() if with_bias else None, c.data_ptr(), tf32, impl,
                        torch.cuda.current_stream().cuda_stream, buf, 512)
                return buf.value.decode()

            def check(run, with_bias, row):
                """Runs once into a NaN-poisoned output; adds rel_err/nans/check to row."""
                nonlocal failures
                c.fill_(float("nan"))
                res = run()
                res = c if res is None else res
                torch.cuda.synchronize()
                r = ref_for(with_bias)
                err = ((res.double() - r).norm() / r.norm()).item()
                nans = int(torch.isnan(res).sum().item())
                ok = nans == 0 and err <= TOL[name]
                row.update(rel_err=err, nans=nans, check="pass" if ok else "FAIL")
                failures += not ok

            variants = [
                ("torch_relu_matmul", False, lambda: torch.relu(a @ b), None),
                ("cublaslt", False, ours(0, False), 0),
                ("torch_addmm_activation", True, lambda: torch._addmm_activation(bias, a, b), None),
                ("cublaslt", True, ours(0, True), 0),
            ]
            if name != "tf32":
                variants.append(("tiled", True, ours(1, True), None))
            if name in ("fp16", "bf16"):
                variants.append(("tiled_mma", True, ours(2, True), None))
            main_tflops = {}  # (impl, bias) -> tflops of the main pass
            rows, runs = {}, []  # timer name -> row; [(timer name, run)]
            for impl, with_bias, run, lt_code in variants:
                row = {"impl": impl, "mode": name, "bias": with_bias, "m": m, "n": n, "k": k}
                if lt_code is not None:
                    row.update(workspace_bytes=ws_of(lt_code), algo=algo(lt_code, with_bias))
                if checkable and not impl.startswith("torch"):
                    check(run, with_bias, row)
                key = f"{impl}{'+bias' if with_bias else ''}"
                rows[key] = row
                runs.append((key, run))
            rounds = rounds_for(variants[0][2], MAIN_MS, MAIN_ROUNDS)
            for key, res in timer.time(runs, rounds).items():
                row = rows[key]
                if isinstance(res, Exception):
                    row.update(error=str(res), check="FAIL")
                    failures += 1
                else:
                    ms, lo, hi = res
                    row.update(median_ms=ms, min_ms=lo, max_ms=hi, rounds=rounds, tflops=flops / (ms * 1e9))
                    main_tflops[(row["impl"], row["bias"])] = row["tflops"]
            for row in rows.values():
                emit(row)

            def ab_wanted(with_bias):
                """--ab missed: the two first picks differ, or the bias target missed."""
                if args.ab == "all" or args.quick:
                    return True, "all"
                if args.ab == "none":
                    return False, ""
                h32 = algo_hash(algo(LT_FIRST_32M[1], with_bias))
                h1 = algo_hash(algo(LT_FIRST_1M[1], with_bias))
                if h32 != h1:
                    return True, "picks differ"
                lt_b = main_tflops.get(("cublaslt", True))
                ta = main_tflops.get(("torch_addmm_activation", True))
                if with_bias and lt_b and ta and lt_b / ta < BIAS_TARGET:
                    return True, f"bias missed ({lt_b / ta:.3f})"
                return False, ""

            if args.ab_rounds > 0:
                for with_bias in (True, False):
                    wanted, why = ab_wanted(with_bias)
                    if not wanted:
                        continue
                    vs = []  # (impl, run, lt_code)
                    if with_bias:
                        vs.append(("torch_addmm_activation",
                                   lambda: torch._addmm_activation(bias, a, b), None))
                    info = {}
                    for impl, lt_code, label in LT_VARIANTS:
                        run = ours(lt_code, with_bias)
                        meta = {"workspace_bytes": ws_of(lt_code), "algo": algo(lt_code, with_bias),
                                "label": label, "ab_why": why}
                        # One row per variant with ab_round -1: its correctness check (the
                        # default was checked in the main pass) or the error that dropped it.
                        row = {"impl": impl, "mode": name, "bias": with_bias, "m": m, "n": n,
                               "k": k, "ab_round": -1, **meta}
                        try:
                            if checkable and impl != "cublaslt":
                                check(run, with_bias, row)
                            else:
                                run()
                        except RuntimeError as e:  # e.g. no algorithm fits this workspace
                            emit({**row, "error": str(e)})
                            continue
                        emit(row)
                        info[impl] = meta
                        vs.append((impl, run, lt_code))
                        print(f"{m}x{n}x{k} {name} bias={with_bias} {impl}: {meta['algo']}",
                              file=sys.stderr)
                    if not vs:  # every runner refused this case (rows with "error" above)
                        continue
                    per_round = rounds_for(vs[0][1], args.ab_rep, AB_ROUNDS_PER_ROUND)
                    for rnd in range(args.ab_rounds):
                        res = timer.time([(impl, run) for impl, run, _ in vs], per_round)
                        for impl, _, _ in vs:
                            row = {"impl": impl, "mode": name, "bias": with_bias, "m": m, "n": n,
                                   "k": k, "ab_round": rnd}
                            if isinstance(res[impl], Exception):
                                row["error"] = str(res[impl])
                            else:
                                ms = res[impl][0]
                                row.update(median_ms=ms, tflops=flops / (ms * 1e9))
                            if impl in info:
                                row.update(info[impl])
                            emit(row)
            del a, b, bias, c, refs
            torch.cuda.empty_cache()
    torch.set_float32_matmul_precision("highest")
    print(f"matmul_torch: {failures} correctness failures", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
