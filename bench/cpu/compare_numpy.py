#!/usr/bin/python3
"""Runs fusebox_cpu_bench and times the numpy equivalents in the same run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /usr/bin/python3 bench/cpu/compare_numpy.py \
        [--bench build-cpu/bench/cpu/fusebox_cpu_bench] [--runs 15] [--rounds 3] [--markdown out.md]

numpy expressions (float32, same sizes, median of --runs after warm-up, perf_counter):
  gelu         0.5*x*(1+np.tanh(np.sqrt(2/np.pi)*(x+0.044715*x**3)))
               (and, for information, the same with x*x*x: numpy's x**3 is a scalar powf loop)
  softmax      e=np.exp(x-x.max(-1,keepdims=True)); e/e.sum(-1,keepdims=True)
  matmul_relu  np.maximum(a@b, 0)
Prints a table with ours / numpy times and the speedup (numpy time / ours) and
the goal for each row; --markdown also writes it with the machine details.
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE apply to both sides (both use the system
OpenBLAS); threadpoolctl, when importable, reports which kernel numpy's BLAS runs.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

GOALS = {"gelu": (2.0, ">= 2x faster"), "softmax": (2.0, ">= 2x faster"),
         "matmul_relu": (1 / 1.5, "within 1.5x")}


def time_numpy(fn, runs, warmup):
    t0 = time.perf_counter()
    fn()
    if time.perf_counter() - t0 > 0.2:  # numpy's gelu (x**3) takes ~1 s: 3 runs are enough
        runs, warmup = min(runs, 3), 0
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)


def numpy_cases():
    rng = np.random.default_rng(42)
    x = rng.uniform(-5, 5, 1 << 24).astype(np.float32)
    s = rng.uniform(-5, 5, (4096, 4096)).astype(np.float32)
    a = rng.uniform(-1, 1, (1024, 1024)).astype(np.float32)
    b = rng.uniform(-1, 1, (1024, 1024)).astype(np.float32)

    def gelu():
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    def gelu_cubed_by_multiplies():  # x**3 is a slow scalar powf loop in numpy
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * (x * x * x))))

    def softmax():
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def matmul_relu():
        return np.maximum(a @ b, 0)

    assert gelu().dtype == np.float32 and softmax().dtype == np.float32
    return {"gelu": gelu, "gelu_xxx": gelu_cubed_by_multiplies, "softmax": softmax,
            "matmul_relu": matmul_relu}


def blas_info():
    try:
        import threadpoolctl
    except ImportError:
        return "threadpoolctl not installed"
    infos = threadpoolctl.threadpool_info()
    return "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} "
                     f"threads={i.get('num_threads')} ({os.path.basename(i.get('filepath', ''))})"
                     for i in infos) or "no BLAS found by threadpoolctl"


def machine():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return len(os.sched_getaffinity(0)), model  # as nproc counts


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", default=os.path.join(root, "build-cpu/bench/cpu/fusebox_cpu_bench"))
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--markdown", help="also write the table and machine details here")
    args = p.parse_args()

    def run_bench(threads):
        out = subprocess.run([args.bench, "--runs", str(args.runs), "--warmup", str(args.warmup),
                              "--threads", str(threads)],
                             check=True, capture_output=True, text=True).stdout
        return out, {r["op"]: r for r in map(json.loads, out.splitlines()) if r["dtype"] == "float32"}

    # The machine is shared: run `--rounds` interleaved rounds (ours on all
    # threads, numpy, ours on one thread) and keep each side's best median, so a
    # burst of someone else's work in one round does not decide the comparison.
    load_before = os.getloadavg()[0]
    cases = numpy_cases()
    ops = (("gelu", "2^24"), ("gelu_xxx", "2^24"), ("softmax", "4096x4096"), ("matmul_relu", "1024^3"))
    best, best1, best_np, raw = {}, {}, {}, []
    for _ in range(args.rounds):
        out, ours = run_bench(0)
        for op, _shape in ops:
            best_np[op] = min(best_np.get(op, float("inf")), time_numpy(cases[op], args.runs, args.warmup)[0])
        out1, ours1 = run_bench(1)
        raw.append(out + out1)
        for op, r in ours.items():
            best[op] = min(best.get(op, float("inf")), r["median_ms"])
        for op, r in ours1.items():
            best1[op] = min(best1.get(op, float("inf")), r["median_ms"])
    rows = []
    for op, shape in ops:
        mine = "gelu" if op == "gelu_xxx" else op
        speedup = best_np[op] / best[mine]
        if op == "gelu_xxx":  # not a goal: numpy's x**3 dominates its gelu time
            name, goal, met = "gelu, numpy with x*x*x", "(information)", "-"
        else:
            name, (need, goal) = op, GOALS[op]
            met = "yes" if speedup >= need else "NO"
        rows.append((name, shape, best[mine], best_np[op], speedup, goal, met,
                     best1[mine], best_np[op] / best1[mine]))

    ncpu, model = machine()
    env = {k: os.environ.get(k, "(unset)") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    header = ("| op (float32) | shape | fusebox ms | numpy ms | speedup | goal | met "
              "| fusebox 1 thread ms | speedup 1 thread |")
    lines = [header, "|---|---|---:|---:|---:|---|---|---:|---:|"]
    lines += [f"| {op} | {shape} | {a:.2f} | {b:.2f} | {s:.2f}x | {g} | {m} | {a1:.2f} | {s1:.2f}x |"
              for op, shape, a, b, s, g, m, a1, s1 in rows]
    details = [
        f"- date: {datetime.date.today().isoformat()}",
        f"- machine: {ncpu} cores, {model}, {platform.platform()}",
        f"- fusebox: isa={ours['gelu']['isa']} threads={ours['gelu']['threads']} "
        f"(and 1 for the 1-thread columns), BLAS core {ours['gelu']['blas_core']}",
        f"- numpy {np.__version__}, python {platform.python_version()}; BLAS: {blas_info()}",
        f"- env: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        f"- 1-minute load average before the run: {load_before:.2f} (the machine is shared)",
        f"- each side: best of {args.rounds} interleaved rounds of (median of {args.runs} runs after "
        f"{args.warmup} warm-up runs); speedup = numpy / fusebox",
    ]
    print("\n".join(lines))
    print("\n".join(details))
    if args.markdown:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        with open(args.markdown, "w") as f:
            f.write(f"# CPU kernels vs numpy ({datetime.date.today().isoformat()})\n\n")
            f.write("Reproduce: `cmake -S . -B build-cpu -DFUSEBOX_CUDA=OFF && "
                    "cmake --build build-cpu --target fusebox_cpu_bench -j2 && "
                    "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /usr/bin/python3 "
                    "bench/cpu/compare_numpy.py --markdown bench/cpu/results-DATE.md`\n\n")
            f.write("\n".join(lines) + "\n\n" + "\n".join(details) + f"\n- commit: {commit}\n")
            f.write("\nRaw fusebox_cpu_bench lines (per round: all threads, then 1 thread):\n\n```\n"
                    + "".join(raw) + "```\n")
    return 0 if all(r[6] in ("yes", "-") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
