#!/usr/bin/env python3
"""The Python client against the C++ client on one large inline op call (issue 33/34: the Python
client at >= 0.8x the C++ client for a 64 MiB inline GeLU).

Starts `fusebox-server --backend=cpu` on a free loopback port, then runs interleaved rounds
(the order rotates each round) of:
  cpp        `fusebox-perf --op gelu --shape N --callers 1` for --cpp_seconds: the median
             latency of its calls in that round (the C++ client library, one call at a time)
  py         this tree's fusebox_client.Client, --calls calls, their median wall time, as a
             user gets it: through the native transport (the build's libfusebox_native, the
             C++ client under the Python one) when the build has it
  py_grpcio  the same with native=False: grpcio carries the call (results copied into
             writable arrays)
  py_view    grpcio with copy_results=False (results are read-only views of the reply)
  py_old     the client package at --old_rev (git show'n into a temporary directory), the
             same calls: the path before the hand-encoded requests and replies
and reports medians per client and each Python client's round-by-round ratio to the C++
client's time with a distribution-free 95% interval (bench/gpu/paired_stats.py). A ratio
of time <= 1.25 is >= 0.8x the C++ client's speed. Every result is checked against the first.

With GLIBC_TUNABLES set (e.g. glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296,
freed large blocks kept for reuse instead of unmapped), both clients run with it; the server
never does.

  PYTHONPATH=build/python /usr/bin/python3 bench/python/zero_copy.py --build build \
      --rounds 12 --out bench/baselines/python-zero-copy-$(date -u +%F)-$(git rev-parse --short HEAD).md
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
sys.path.insert(0, str(ROOT / "client" / "python"))  # this tree's client, not the build's copy

import numpy as np  # noqa: E402

from paired_stats import paired_ratio  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def old_client(rev: str, tmp: Path) -> Any:
    """The fusebox_client package at ``rev``, importable as fusebox_client_old."""
    pkg = tmp / "fusebox_client_old"
    pkg.mkdir()
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", rev,
                            "client/python/fusebox_client/"], check=True, capture_output=True,
                           text=True).stdout.split()
    for n in names:
        data = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{n}"], check=True,
                              capture_output=True).stdout
        (pkg / Path(n).name).write_bytes(data)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("fusebox_client_old")


def start_server(binary: Path, log: Path) -> "tuple[subprocess.Popen[str], str]":
    """The server, its output in ``log`` (a file: a pipe nobody reads would fill and stall it)."""
    # The server runs as it would anyway: malloc settings given to the clients are not its.
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    with open(log, "w") as out:
        proc = subprocess.Popen([str(binary), "--address=127.0.0.1:0", "--backend=cpu"],
                                stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + 30
    while time.time() < deadline and proc.poll() is None:
        m = re.search(r"listening on (\S+)", log.read_text())
        if m:
            return proc, m.group(1)
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("the server did not say where it listens")


def cpp_round(perf: Path, address: str, n: int, seconds: float) -> float:
    """The median latency (s) of fusebox-perf's calls over ``seconds``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([str(perf), "--server", address, "--op", "gelu", "--shape", str(n),
                        "--callers", "1", "--warmup_s", "0.5", "--duration_s", str(seconds),
                        "--timeout_ms", "120000", "--json", f.name],
                       check=True, stdout=subprocess.DEVNULL)
        run = json.load(open(f.name))["runs"][0]
    if run["ok"] != run["calls"] or run["calls"] < 3:
        raise SystemExit(f"fusebox-perf: {run}")
    return float(run["latency_us"]["p50"]) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--mib", type=int, default=64, help="input size (float32)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--calls", type=int, default=5, help="Python calls per client per round")
    ap.add_argument("--cpp_seconds", type=float, default=2.0)
    ap.add_argument("--old_rev", default="6692f5c", help="the client before this change")
    ap.add_argument("--out", help="write the markdown record here")
    args = ap.parse_args()

    build = Path(args.build)
    native_lib = build / "python" / "fusebox_client" / "libfusebox_native.so"
    if native_lib.is_file():  # this tree's package is imported, the build's library used
        os.environ.setdefault("FUSEBOX_NATIVE_LIB", str(native_lib))
    import fusebox_client
    import grpc
    import google.protobuf

    n = args.mib << 18
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    load_start = load()
    tmp = Path(tempfile.mkdtemp(prefix="pyzc-"))
    old = old_client(args.old_rev, tmp)
    server_log = tmp / "server.log"
    proc, address = start_server(build / "server" / "fusebox-server", server_log)
    try:
        clients = {"py": fusebox_client.Client(address, timeout=120),
                   "py_grpcio": fusebox_client.Client(address, timeout=120, native=False),
                   "py_view": fusebox_client.Client(address, timeout=120, copy_results=False,
                                                    native=False),
                   "py_old": old.Client(address, timeout=120)}
        want = clients["py"].gelu(x)
        for c in clients.values():  # connect and warm up
            np.testing.assert_array_equal(c.gelu(x), want)

        def py_round(c: Any) -> float:
            times = []
            for _ in range(args.calls):
                t = time.perf_counter()
                y = c.gelu(x)
                times.append(time.perf_counter() - t)
                if not np.array_equal(y, want):
                    raise SystemExit("a result differs")
                del y
            return statistics.median(times)

        runs: Dict[str, Callable[[], float]] = {
            "cpp": lambda: cpp_round(build / "client" / "fusebox-perf", address, n,
                                     args.cpp_seconds)}
        for name, c in clients.items():
            runs[name] = (lambda c=c: py_round(c))
        names = list(runs)
        times: Dict[str, List[float]] = {k: [] for k in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for k in order:
                times[k].append(runs[k]())
            print(f"round {r + 1}/{args.rounds}: " +
                  ", ".join(f"{k} {times[k][-1] * 1e3:.1f} ms" for k in names) +
                  f"; load {load()}", flush=True)
        clients_native = clients["py"]._native is not None
        for c in clients.values():
            c.close()
    except BaseException:
        print(f"the server's last lines ({server_log}):\n" +
              "\n".join(server_log.read_text().splitlines()[-20:]), file=sys.stderr)
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # a slow graceful stop is not this bench's business
            proc.kill()
            proc.wait()
    load_end = load()

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                            "client/python", "bench/python"],
                           capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    tunables = (f"GLIBC_TUNABLES={os.environ['GLIBC_TUNABLES']} "
                if os.environ.get("GLIBC_TUNABLES") else "")
    lines = [
        f"# Python client vs C++ client: {args.mib} MiB float32 inline GeLU, CPU backend, loopback",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {commit}{' (with uncommitted client changes)' if dirty else ''}; "
        f"old client: {args.old_rev}",
        f"- machine: {platform.node()}, {cpu}, {os.cpu_count()} cores; load average "
        f"(1/5/15 min) {load_start} at the start, {load_end} at the end (other sessions' "
        "builds share the cores)",
        f"- Python {platform.python_version()}, grpcio {grpc.__version__}, protobuf "
        f"{google.protobuf.__version__}, numpy {np.__version__}",
        f"- command: `{tunables}PYTHONPATH={build}/python /usr/bin/python3 bench/python/zero_copy.py "
        f"--build {build} --mib {args.mib} --rounds {args.rounds} --calls {args.calls} "
        f"--cpp_seconds {args.cpp_seconds} --old_rev {args.old_rev}`",
        f"- per round: cpp = the median latency of `fusebox-perf --callers 1` over "
        f"{args.cpp_seconds} s; each Python client = the median of {args.calls} calls. Rounds "
        f"interleave the {len(names)}, the order rotating. py "
        + ("went through the native transport (" + os.environ["FUSEBOX_NATIVE_LIB"] + ")"
           if clients_native else "had no native transport (grpcio)") + "."
        + (" GLIBC_TUNABLES applies to both clients' processes (the Python one and each "
           "fusebox-perf), not to the server." if tunables else ""),
        "",
        "| client | median of round medians (ms) | min (ms) | time / C++ time (median, 95% CI) |"
        " speed vs C++ |",
        "|---|---|---|---|---|",
    ]
    for k in names:
        med = statistics.median(times[k]) * 1e3
        if k == "cpp":
            lines.append(f"| cpp (fusebox-perf) | {med:.1f} | {min(times[k]) * 1e3:.1f} | 1 | 1 |")
            continue
        pr = paired_ratio(times["cpp"], times[k])
        ratio = (f"{pr[0]:.2f} [{pr[1]:.2f}, {pr[2]:.2f}] (n={pr[3]})" if pr
                 else f"{statistics.median(b / a for a, b in zip(times['cpp'], times[k])):.2f}"
                 " (too few rounds for an interval)")
        speed = f"{1 / pr[0]:.2f}x [{1 / pr[2]:.2f}, {1 / pr[1]:.2f}]" if pr else "-"
        lines.append(f"| {k} | {med:.1f} | {min(times[k]) * 1e3:.1f} | {ratio} | {speed} |")
    lines += ["", "Round medians (ms):", "", "| round | " + " | ".join(names) + " |",
              "|---" * (len(names) + 1) + "|"]
    for r in range(args.rounds):
        lines.append(f"| {r + 1} | " + " | ".join(f"{times[k][r] * 1e3:.1f}" for k in names) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
