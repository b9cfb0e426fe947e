#!/usr/bin/python3
"""Runs fusebox_cpu_bench and times the numpy equivalents in the same run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /usr/bin/python3 bench/cpu/compare_numpy.py \
        [--bench build-cpu/bench/cpu/fusebox_cpu_bench] [--runs 15] [--markdown out.md]

numpy expressions (float32, same sizes, median of --runs after warm-up, perf_counter):
  gelu         0.5*x*(1+np.tanh(np.sqrt(2/np.pi)*(x+0.044715*x**3)))
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

    def softmax():
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def matmul_relu():
        return np.maximum(a @ b, 0)

    assert gelu().dtype == np.float32 and softmax().dtype == np.float32
    return {"gelu": gelu, "softmax": softmax, "matmul_relu": matmul_relu}


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
    return os.cpu_count(), model


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", default=os.path.join(root, "build-cpu/bench/cpu/fusebox_cpu_bench"))
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--markdown", help="also write the table and machine details here")
    args = p.parse_args()

    def run_bench(threads):
        out = subprocess.run([args.bench, "--runs", str(args.runs), "--warmup", str(args.warmup),
                              "--threads", str(threads)],
                             check=True, capture_output=True, text=True).stdout
        return out, {r["op"]: r for r in map(json.loads, out.splitlines()) if r["dtype"] == "float32"}

    load_before = os.getloadavg()[0]
    out, ours = run_bench(0)
    out1, ours1 = run_bench(1)
    cases = numpy_cases()
    rows = []
    for op, shape in (("gelu", "2^24"), ("softmax", "4096x4096"), ("matmul_relu", "1024^3")):
        np_med, np_min = time_numpy(cases[op], args.runs, args.warmup)
        o = ours[op]
        speedup = np_med / o["median_ms"]
        need, goal = GOALS[op]
        rows.append((op, shape, o["median_ms"], np_med, speedup, goal, "yes" if speedup >= need else "NO",
                     ours1[op]["median_ms"], np_med / ours1[op]["median_ms"]))

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
        f"(and 1 for the last two columns), BLAS core {ours['gelu']['blas_core']}",
        f"- numpy {np.__version__}, python {platform.python_version()}; BLAS: {blas_info()}",
        f"- env: " + ", ".join(f"{k}={v}" for k, v in env.items()),
        f"- 1-minute load average before the run: {load_before:.2f} (the machine is shared)",
        f"- median of {args.runs} runs after {args.warmup} warm-up runs; speedup = numpy / fusebox",
    ]
    print("\n".join(lines))
    print("\n".join(details))
    if args.markdown:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        with open(args.markdown, "w") as f:
            f.write(f"# CPU kernels vs numpy ({datetime.date.today().isoformat()})\n\n")
            f.write("\n".join(lines) + "\n\n" + "\n".join(details) + f"\n- commit: {commit}\n")
            f.write("\nRaw fusebox_cpu_bench lines (all threads, then 1 thread):\n\n```\n" + out + out1 + "```\n")
    return 0 if all(r[-1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
