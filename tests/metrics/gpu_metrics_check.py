"""/metrics with the CUDA backend loaded: cuBLASLt's static TLS must not break
the /metrics server's thread, and the GPU gauges must be real.

Starts `fusebox-server --backend=cuda --metrics_address=127.0.0.1:<free>`,
makes a known number of calls per op, scrapes /metrics and checks: the page
is served, call counts match, the kernel and launch histograms' counts and
sums match the responses' kernel_us and launch_us (launch > 0 on a GPU),
device="cuda:0", GPU memory used and total > 0, build info says cuda. Exits 77 (skip) when the
server finds no usable GPU. Needs python grpcio + numpy + protobuf and the
generated stubs; on the device machine run it from a bundle, e.g.
  LD_LIBRARY_PATH=<bundle>/lib:/usr/local/cuda/lib64 python3 gpu_metrics_check.py \
      <bundle>/bin/fusebox-server <dir holding fusebox/v1/*_pb2*.py>
"""
import math
import os
import re
import select
import socket
import subprocess
import sys
import time
import urllib.request

SKIP = 77
CALLS = 25


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(text):
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'(\w+)(?:\{(.*)\})? (\S+)', line)
        labels = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), math.nan)


def main(server_path, python_path):
    sys.path.insert(0, python_path)
    import grpc
    import numpy as np
    from fusebox.v1 import kernel_service_pb2 as pb
    from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc

    port = free_port()
    proc = subprocess.Popen([server_path, "--backend=cuda", "--address=127.0.0.1:0",
                             f"--metrics_address=127.0.0.1:{port}", "--drain_seconds=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        address, deadline = None, time.monotonic() + 60
        while address is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                m = re.search(r"listening on (\S+:\d+)", proc.stdout.readline())
                address = m and m.group(1)
        if address is None:
            proc.kill()
            err = proc.stderr.read()
            print(f"server did not start:\n{err[-3000:]}")
            return SKIP if "no usable GPU" in err else 1

        stub = pb_grpc.KernelServiceStub(grpc.insecure_channel(address))
        x = np.random.default_rng(1).standard_normal((256, 1024)).astype(np.float32)
        t = pb.TensorRef(tensor=pb.Tensor(dtype=pb.FLOAT32, shape=list(x.shape), data=x.tobytes()))
        w = np.ones((1024, 256), np.float32)
        tw = pb.TensorRef(tensor=pb.Tensor(dtype=pb.FLOAT32, shape=list(w.shape), data=w.tobytes()))
        timings = {}  # op -> [Timing]
        for _ in range(CALLS):
            timings.setdefault("Gelu", []).append(stub.Gelu(pb.GeluRequest(input=t)).timing)
            timings.setdefault("Softmax", []).append(stub.Softmax(pb.SoftmaxRequest(input=t)).timing)
            timings.setdefault("RowSum", []).append(stub.RowSum(pb.RowSumRequest(input=t)).timing)
            timings.setdefault("MatmulRelu", []).append(
                stub.MatmulRelu(pb.MatmulReluRequest(a=t, b=tw)).timing)

        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        s = parse(text)
        failures = []

        def check(ok, what):
            print(("ok   " if ok else "FAIL ") + what)
            if not ok:
                failures.append(what)

        for op, ts in timings.items():
            n = value(s, "fusebox_calls_total", method=op, code="OK")
            check(n == CALLS, f"fusebox_calls_total{{method={op},code=OK}} = {n}")
            for phase in ("kernel", "launch"):
                us = sum(getattr(x, phase + "_us") for x in ts)
                c = value(s, "fusebox_call_phase_duration_seconds_count", op=op, dtype="float32",
                          device="cuda:0", phase=phase)
                total = value(s, "fusebox_call_phase_duration_seconds_sum", op=op, dtype="float32",
                              device="cuda:0", phase=phase)
                check(c == CALLS, f"{op} {phase} histogram count = {c}")
                check(abs(total - us * 1e-6) <= 1e-6 * total + 1e-9,
                      f"{op} {phase} sum {total * 1e6:.1f} us = responses' {us:.1f} us")
            launch = sum(x.launch_us for x in ts)
            check(launch > 0, f"{op} launch_us filled by the CUDA backend ({launch:.1f} us)")
        used = value(s, "fusebox_device_memory_used_bytes", device="cuda:0")
        size = value(s, "fusebox_device_memory_total_bytes", device="cuda:0")
        check(0 < used <= size, f"GPU memory used {used / 2**30:.2f} GiB of {size / 2**30:.2f} GiB")
        check(value(s, "fusebox_streams", device="cuda:0") > 0, "fusebox_streams > 0")
        info = [k for k in s if k[0] == "fusebox_build_info"]
        check(len(info) == 1 and ("backend", "cuda") in info[0][1], f"build info {info}")
        return 1 if failures else 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
