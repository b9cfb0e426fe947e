"""A real Prometheus scrapes a real fusebox-server, end to end.

Starts `fusebox-server --backend=cpu` with --metrics_address on a free loopback
port and Debian's /usr/bin/prometheus (own temp config: scrape every 1 s, the
alert rules of deploy/prometheus loaded, temp TSDB), waits for a scrape of the
all-zero series, makes a known number of calls per op and dtype plus some bad
ones, waits for the next scrape, then asks Prometheus' HTTP API and checks:
counts per method and code, histogram counts and sums against the timings the
responses carried, histogram_quantile(0.99) per op and phase against the true
p99's bucket, payload bytes, backend gauges; `promtool check metrics` on the
exposition; every alert rule evaluates cleanly (and none fires on this healthy
server); every Grafana panel query and variable returns data. Both processes
are always killed. Run by ctest (tests/metrics/CMakeLists.txt) with
FUSEBOX_SERVER, FUSEBOX_PYTHON_PATH, FUSEBOX_SOURCE_DIR, PROMETHEUS, PROMTOOL.
"""
import json
import math
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter, defaultdict

import pytest

SOURCE_DIR = os.environ.get(
    "FUSEBOX_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SERVER = os.environ.get("FUSEBOX_SERVER", os.path.join(SOURCE_DIR, "build/server/fusebox-server"))
PYTHON_PATH = os.environ.get("FUSEBOX_PYTHON_PATH", os.path.join(SOURCE_DIR, "build/python"))
PROMETHEUS = os.environ.get("PROMETHEUS") or "/usr/bin/prometheus"
PROMTOOL = os.environ.get("PROMTOOL") or "/usr/bin/promtool"
PROM_DIR = os.path.join(SOURCE_DIR, "deploy", "prometheus")
DASHBOARD = os.path.join(SOURCE_DIR, "deploy", "grafana", "fusebox-dashboard.json")
ALERT_RULES = os.path.join(PROM_DIR, "fusebox-alerts.yml")

sys.path.insert(0, PYTHON_PATH)
import grpc  # noqa: E402
import numpy as np  # noqa: E402
from fusebox.v1 import kernel_service_pb2 as pb  # noqa: E402
from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc  # noqa: E402

OPS = ["Gelu", "Softmax", "RowSum", "MatmulRelu"]
PHASES = ["queue", "copy_in", "launch", "kernel", "copy_out", "total"]
DTYPE_CALLS = [("float32", 8), ("float16", 6), ("bfloat16", 6)]  # 20 good calls per op
# The exporter's buckets (server/rpc/metrics.cc): 1 us x 2^k, k = 0..25.
BOUNDS = [1e-6 * float(1 << k) for k in range(26)]
PHASE_METRIC = "fusebox_call_phase_duration_seconds"
DEADLINE_S = 80  # the whole module; ctest's TIMEOUT is 150


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def tensor(values, dtype):
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "float32":
        data, code = values.tobytes(), pb.FLOAT32
    elif dtype == "float16":
        data, code = values.astype(np.float16).tobytes(), pb.FLOAT16
    else:  # bfloat16: the upper half of a float32
        data, code = (values.view(np.uint32) >> 16).astype(np.uint16).tobytes(), pb.BFLOAT16
    return pb.Tensor(dtype=code, shape=list(values.shape), data=data)


def ref(t):
    return pb.TensorRef(tensor=t)


class Prom:
    """Prometheus' HTTP API."""

    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        try:
            body = http_get(url)
        except urllib.error.HTTPError as e:  # 400/422: a bad query; the body says why
            body = e.read().decode()
        reply = json.loads(body)
        assert reply.get("status") == "success", f"{path} {params}: {reply}"
        return reply["data"]

    def query(self, expr):
        data = self.api("query", query=expr)
        return data["result"] if data["resultType"] == "vector" else [{"value": data["result"]}]

    def scalar(self, expr):
        r = self.query(expr)
        assert len(r) == 1, f"{expr}: {r}"
        return float(r[0]["value"][1])

    def by(self, expr, *labels):
        return {tuple(s["metric"].get(l, "") for l in labels): float(s["value"][1])
                for s in self.query(expr)}


def wait_for(what, check, deadline, interval=0.2):
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (OSError, AssertionError, urllib.error.URLError) as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def start_server(metrics_port, log, deadline):
    proc = subprocess.Popen(
        [SERVER, "--backend=cpu", "--address=127.0.0.1:0",
         f"--metrics_address=127.0.0.1:{metrics_port}", "--workers=2", "--cpu_threads=1",
         "--drain_seconds=1"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            m = re.search(r"listening on (\S+:\d+) backend=cpu", line)
            if m:
                return proc, m.group(1)
    stop(proc)
    raise AssertionError(f"fusebox-server did not start (last stdout line {line!r})")


def start_prometheus(tmp, metrics_port, deadline, log):
    port = free_port()
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""# written by {os.path.basename(__file__)}
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {ALERT_RULES}
scrape_configs:
  - job_name: fusebox
    static_configs:
      - targets: ["127.0.0.1:{metrics_port}"]
""")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=log)
    try:
        wait_for("Prometheus /-/ready",
                 lambda: proc.poll() is None and "Ready" in http_get(
                     f"http://127.0.0.1:{port}/-/ready"), deadline)
    except AssertionError:
        stop(proc)
        raise
    return proc, Prom(port)


def make_calls(channel):
    """The known traffic: 20 good calls per op (by dtype), a few bad ones.
    Returns what the client saw, to compare with what Prometheus says."""
    stub = pb_grpc.KernelServiceStub(channel)
    rng = np.random.default_rng(5)
    seen = {
        "codes": Counter(),                     # (method, code name) -> calls
        "phases": defaultdict(list),            # (op, phase) -> [seconds]
        "phase_count_dtype": Counter(),         # (op, dtype) -> good calls
        "bytes_in": Counter(), "bytes_out": Counter(),
    }

    def call(method, request, dtype=None):
        try:
            resp = getattr(stub, method)(request, timeout=20)
        except grpc.RpcError as e:
            seen["codes"][(method, e.code().name)] += 1
            return None
        seen["codes"][(method, "OK")] += 1
        t = resp.timing
        for phase in PHASES:
            # The server observes timing_us * 1e-6: the same double here.
            seen["phases"][(method, phase)].append(getattr(t, phase + "_us") * 1e-6)
        seen["phase_count_dtype"][(method, dtype)] += 1
        seen["bytes_out"][method] += len(resp.output.tensor.data)
        return resp

    for dtype, n in DTYPE_CALLS:
        for i in range(n):
            rows, cols = 8 * (1 + i % 4), 128 * (1 + i % 3)
            x = ref(tensor(rng.standard_normal((rows, cols)), dtype))
            for method, req in (("Gelu", pb.GeluRequest(input=x)),
                                ("Softmax", pb.SoftmaxRequest(input=x)),
                                ("RowSum", pb.RowSumRequest(input=x))):
                seen["bytes_in"][method] += len(x.tensor.data)
                call(method, req, dtype)
            a = ref(tensor(rng.standard_normal((rows, 32)), dtype))
            b = ref(tensor(rng.standard_normal((32, 48)), dtype))
            req = pb.MatmulReluRequest(a=a, b=b)
            seen["bytes_in"]["MatmulRelu"] += len(a.tensor.data) + len(b.tensor.data)
            if i % 2:
                req.bias.CopyFrom(ref(tensor(rng.standard_normal(48), dtype)))
                seen["bytes_in"]["MatmulRelu"] += len(req.bias.tensor.data)
            call("MatmulRelu", req, dtype)

    # Tensors held by the server: counted by method and code, bytes in / out.
    data = tensor(rng.standard_normal((64, 32)), "float32").data
    chunks = [pb.UploadRequest(dtype=pb.FLOAT32, shape=[64, 32], data=data[:5000]),
              pb.UploadRequest(data=data[5000:])]
    handle = stub.Upload(iter(chunks), timeout=20).tensor.handle
    seen["codes"][("Upload", "OK")] += 1
    seen["bytes_in"]["Upload"] += len(data)
    got = b"".join(m.data for m in stub.Download(pb.DownloadRequest(handle=handle), timeout=20))
    assert got == data
    seen["codes"][("Download", "OK")] += 1
    seen["bytes_out"]["Download"] += len(got)
    stub.ListTensors(pb.ListTensorsRequest(), timeout=20)
    seen["codes"][("ListTensors", "OK")] += 1
    stub.FreeTensor(pb.FreeTensorRequest(handle=handle), timeout=20)
    seen["codes"][("FreeTensor", "OK")] += 1

    good = dict(seen["codes"])
    # Bad calls: rejected before they run, so no latency and no payload bytes.
    no_dtype = pb.TensorRef(tensor=pb.Tensor(shape=[4], data=b"\0" * 16))
    short = pb.TensorRef(tensor=pb.Tensor(dtype=pb.FLOAT32, shape=[4, 4], data=b"\0" * 12))
    mismatch = pb.MatmulReluRequest(a=ref(tensor(np.ones((4, 8)), "float32")),
                                    b=ref(tensor(np.ones((5, 3)), "float32")))
    bad = [("Gelu", pb.GeluRequest(input=no_dtype))] * 3 + \
          [("Softmax", pb.SoftmaxRequest(input=short))] * 2 + \
          [("MatmulRelu", mismatch)] * 2
    for method, req in bad:
        assert call(method, req) is None, f"{method}: a bad request succeeded"
    try:
        stub.FreeTensor(pb.FreeTensorRequest(handle="t-never-existed"), timeout=20)
        raise AssertionError("freeing an unknown handle succeeded")
    except grpc.RpcError as e:
        seen["codes"][("FreeTensor", e.code().name)] += 1
    seen["bad"] = {k: v for k, v in seen["codes"].items() if k not in good}
    return seen


@pytest.fixture(scope="module")
def stack():
    deadline = time.monotonic() + DEADLINE_S
    for path, what in ((SERVER, "fusebox-server (build it)"),
                       (PROMETHEUS, "prometheus (scripts/setup.sh installs it)"),
                       (PROMTOOL, "promtool (scripts/setup.sh installs it)")):
        assert os.access(path, os.X_OK), f"missing {what}: {path}"
    server = prom_proc = channel = None
    with tempfile.TemporaryDirectory(prefix="fusebox-metrics-") as tmp:
        server_log = open(os.path.join(tmp, "server.log"), "w+")
        prom_log = open(os.path.join(tmp, "prometheus.log"), "w+")
        try:
            metrics_port = free_port()
            server, address = start_server(metrics_port, server_log, deadline)
            prom_proc, prom = start_prometheus(tmp, metrics_port, deadline, prom_log)
            # A scrape of the all-zero series first: rate() then starts from 0.
            wait_for("the first scrape", lambda: prom.query(
                f'count({PHASE_METRIC}_bucket{{job="fusebox"}})'), deadline)
            channel = grpc.insecure_channel(address)
            seen = make_calls(channel)
            total = sum(seen["codes"].values())
            wait_for(f"a scrape that saw all {total} calls", lambda: prom.query(
                f'sum(fusebox_calls_total{{job="fusebox"}}) == {total}'), deadline)
            yield {"prom": prom, "seen": seen, "metrics_url":
                   f"http://127.0.0.1:{metrics_port}/metrics", "deadline": deadline}
        except BaseException:
            for name, log in (("fusebox-server", server_log), ("prometheus", prom_log)):
                log.seek(0)
                sys.stderr.write(f"--- {name} log (tail) ---\n{log.read()[-4000:]}\n")
            raise
        finally:
            if channel is not None:
                channel.close()
            stop(prom_proc)
            stop(server)
            server_log.close()
            prom_log.close()


def test_call_counts_by_method_and_code_match_the_calls_made(stack):
    prom, seen = stack["prom"], stack["seen"]
    got = prom.by('fusebox_calls_total{job="fusebox"} > 0', "method", "code")
    assert got == {k: float(v) for k, v in seen["codes"].items()}
    for op in OPS:
        assert seen["codes"][(op, "OK")] == 20
    assert seen["bad"], "the bad calls must show up under an error code"


def test_histogram_counts_and_sums_equal_the_response_timings(stack):
    prom, seen = stack["prom"], stack["seen"]
    counts = prom.by(f'sum by (op, phase) ({PHASE_METRIC}_count{{job="fusebox"}})', "op", "phase")
    sums = prom.by(f'sum by (op, phase) ({PHASE_METRIC}_sum{{job="fusebox"}})', "op", "phase")
    by_dtype = prom.by(f'sum by (op, dtype) ({PHASE_METRIC}_count{{job="fusebox",phase="total"}})',
                       "op", "dtype")
    for op in OPS:
        for dtype, n in DTYPE_CALLS:
            assert by_dtype[(op, dtype)] == n, (op, dtype)
        for phase in PHASES:
            values = seen["phases"][(op, phase)]
            assert counts[(op, phase)] == len(values) == 20, (op, phase)
            assert sums[(op, phase)] == pytest.approx(sum(values), rel=1e-6, abs=1e-9), (op, phase)
    # The CPU backend runs the kernel: it took time.
    assert all(sums[(op, "kernel")] > 0 and sums[(op, "total")] > 0 for op in OPS)


def test_launch_phase_is_scraped_and_equals_the_responses_launch_us(stack):
    # launch (copy-in end -> kernel start, filled by the CUDA backend) has its
    # own series per op and dtype, counted once per call like every phase;
    # on this CPU server every response says launch_us = 0, and so must the sum.
    prom, seen = stack["prom"], stack["seen"]
    sel = f'{{job="fusebox",phase="launch"}}'
    counts = prom.by(f"{PHASE_METRIC}_count{sel}", "op", "dtype")
    sums = prom.by(f"{PHASE_METRIC}_sum{sel}", "op", "dtype")
    assert set(counts) == {(op, dtype) for op in OPS for dtype, _ in DTYPE_CALLS}
    for op in OPS:
        launch_s = seen["phases"][(op, "launch")]
        assert len(launch_s) == 20 and all(v == 0 for v in launch_s), (op, launch_s)
        for dtype, n in DTYPE_CALLS:
            assert counts[(op, dtype)] == n == seen["phase_count_dtype"][(op, dtype)], (op, dtype)
            assert sums[(op, dtype)] == 0, (op, dtype)
        # Every call's 0 lies in the first bucket (le = 1 us).
        buckets = prom.by(f'sum by (le) ({PHASE_METRIC}_bucket{{job="fusebox",phase="launch",'
                          f'op="{op}"}})', "le")
        assert buckets[min(buckets, key=lambda le: float(le[0]))] == 20, (op, buckets)


def bucket_of(value):
    """(lower, upper] of the exporter's bucket that holds `value`."""
    for i, upper in enumerate(BOUNDS):
        if value <= upper:
            return (BOUNDS[i - 1] if i else 0.0), upper
    return BOUNDS[-1], math.inf


def test_p99_per_op_and_phase_lies_in_the_bucket_of_the_true_p99(stack):
    prom, seen = stack["prom"], stack["seen"]
    p99 = prom.by(f'histogram_quantile(0.99, sum by (op, phase, le) '
                  f'(rate({PHASE_METRIC}_bucket{{job="fusebox"}}[5m])))', "op", "phase")
    for op in OPS:
        for phase in PHASES:
            values = sorted(seen["phases"][(op, phase)])
            # Prometheus interpolates inside the bucket holding the ceil(0.99 n)-th value.
            true_p99 = values[math.ceil(0.99 * len(values)) - 1]
            lower, upper = bucket_of(true_p99)
            got = p99[(op, phase)]
            print(f"{op:10} {phase:8} p99 {got * 1e6:10.1f} us, true {true_p99 * 1e6:10.1f} us")
            assert lower * (1 - 1e-9) <= got <= upper * (1 + 1e-9), \
                f"{op}/{phase}: p99 {got} s, true p99 {true_p99} s in ({lower}, {upper}]"


def test_payload_bytes_match_requests_and_responses(stack):
    prom, seen = stack["prom"], stack["seen"]
    got = prom.by('fusebox_payload_bytes_total{job="fusebox"}', "method", "direction")
    for op in OPS:
        assert got[(op, "in")] == seen["bytes_in"][op] > 0, op
        assert got[(op, "out")] == seen["bytes_out"][op] > 0, op
    assert got[("Upload", "in")] == seen["bytes_in"]["Upload"] > 0
    assert got[("Download", "out")] == seen["bytes_out"]["Download"] > 0


def test_backend_gauges_and_build_info_are_scraped(stack):
    prom = stack["prom"]
    sel = '{job="fusebox",device="cpu"}'
    assert prom.scalar(f"fusebox_queued_calls{sel}") == 0
    assert prom.scalar(f"fusebox_busy_streams{sel}") == 0
    assert prom.scalar(f"fusebox_streams{sel}") == 2  # --workers=2
    assert prom.scalar(f"fusebox_device_memory_used_bytes{sel}") == 0
    assert prom.scalar(f"fusebox_device_memory_total_bytes{sel}") == 0
    assert prom.scalar(f"fusebox_resident_tensors{sel}") == 0
    assert prom.scalar(f"fusebox_resident_tensor_bytes{sel}") == 0
    assert prom.scalar('fusebox_calls_in_flight{job="fusebox"}') == 0
    info = prom.query('fusebox_build_info{job="fusebox"}')
    assert len(info) == 1 and info[0]["metric"]["backend"] == "cpu"
    assert re.fullmatch(r"\d+\.\d+\.\d+", info[0]["metric"]["version"])


def test_exposition_passes_promtool_check_metrics(stack):
    text = http_get(stack["metrics_url"])
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert families and all(f.startswith("fusebox_") for f in families), families


def test_kubernetes_scrape_config_is_valid_apart_from_discovery():
    # Debian's promtool is built without Kubernetes discovery: check the rest of
    # the file (relabelling, rule files) with a static target in its place.
    # ctest's metrics_scrape_config_is_valid checks prometheus.yml as it is.
    with open(os.path.join(PROM_DIR, "prometheus-kubernetes.yml")) as f:
        k8s = f.read()
    stand_in, n = re.subn(r"kubernetes_sd_configs:\n(?:      .*\n)+",
                          'static_configs:\n      - targets: ["localhost:9464"]\n', k8s)
    assert n == 1, "prometheus-kubernetes.yml: no kubernetes_sd_configs block found"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "prometheus-kubernetes.yml")
        with open(path, "w") as f:
            f.write(stand_in.replace("  - fusebox-alerts.yml", f"  - {ALERT_RULES}"))
        r = subprocess.run([PROMTOOL, "check", "config", path], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_rule_evaluates_cleanly_and_none_fires_on_a_healthy_server(stack):
    prom = stack["prom"]

    def rules():
        groups = prom.api("rules")["groups"]
        rs = [r for g in groups for r in g["rules"]]
        return rs if rs and all(r["health"] != "unknown" for r in rs) else None

    evaluated = wait_for("every rule evaluated", rules, stack["deadline"])
    names = {r["name"] for r in evaluated}
    assert names == {"FuseboxHighErrorRatio", "FuseboxHighLatencyP99", "FuseboxQueueBacklog",
                     "FuseboxGpuMemoryNearlyFull", "FuseboxTargetDown"}
    for r in evaluated:
        assert r["health"] == "ok", f"{r['name']}: {r.get('lastError')}"
        assert r["state"] == "inactive", f"{r['name']} is {r['state']} on a healthy server"
        prom.query(r["query"])  # parses and runs through the query API too


def dashboard_panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])  # collapsed rows hold their panels


def test_every_dashboard_variable_and_panel_query_returns_data(stack):
    prom = stack["prom"]
    with open(DASHBOARD) as f:
        dash = json.load(f)
    # Variables: label_values(selector, label), as Grafana runs them.
    values = {}
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"]["query"])
        assert m, var["name"]
        selector = m.group(1).replace("$job", "fusebox")
        values[var["name"]] = prom.api(f"label/{m.group(2)}/values", **{"match[]": selector})
        assert values[var["name"]], f"variable {var['name']} has no values"
    assert values["job"] == ["fusebox"] and sorted(values["op"]) == sorted(OPS)

    checked = 0
    for panel in dashboard_panels(dash):
        if panel["type"] == "row":
            continue
        # A repeated panel is drawn once per value; others see "All" (allValue .*).
        ops = values["op"] if panel.get("repeat") == "op" else [".*"]
        for target in panel["targets"]:
            for op in ops:
                expr = (target["expr"].replace("$__rate_interval", "5m")
                        .replace("$job", "fusebox").replace("$instance", ".*")
                        .replace("$op", op))
                assert "$" not in expr, f"{panel['title']}: unresolved variable in {expr}"
                result = prom.query(expr)
                assert result, f"panel {panel['title']!r} ({op}): no data for {expr}"
                finite = [s for s in result if math.isfinite(float(s["value"][1]))]
                assert finite, f"panel {panel['title']!r} ({op}): only NaN for {expr}"
                checked += 1
    assert checked >= 20

    errors = prom.by('sum by (code) (rate(fusebox_calls_total{job="fusebox",code!="OK"}[5m]))',
                     "code")
    for (_, code) in stack["seen"]["bad"]:
        assert errors[(code,)] > 0, f"errors-by-code panel shows no {code}"


def test_autoscaler_metrics_from_the_adapter_rules_return_a_value_per_server(stack):
    """deploy/k8s/monitoring's prometheus-adapter rules, filled in as the adapter does (here
    the scrape has no namespace or pod labels: one server stands for one pod), give the HPA
    a finite number: queued calls, and the mean queue wait per call."""
    import yaml
    path = os.path.join(SOURCE_DIR, "deploy", "k8s", "monitoring", "prometheus-adapter-values.yaml")
    with open(path) as f:
        rules = yaml.safe_load(f)["rules"]["custom"]
    names = set()
    for rule in rules:
        expr = (rule["metricsQuery"].replace("<<.Series>>", rule["seriesQuery"].split("{")[0])
                .replace("<<.LabelMatchers>>", 'job="fusebox"').replace("<<.GroupBy>>", "instance"))
        result = stack["prom"].query(expr)
        assert len(result) == 1, f"{rule['name']['as']}: {expr} gave {result}"
        value = float(result[0]["value"][1])
        assert math.isfinite(value) and value >= 0, f"{rule['name']['as']}: {value}"
        names.add(rule["name"]["as"])
    assert names == {"fusebox_queued_calls", "fusebox_queue_seconds_per_call"}


def test_dashboard_json_is_well_formed_for_import(stack):
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["uid"] and dash["title"] and "id" not in dash
    ids = [p["id"] for p in dashboard_panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dash["templating"]["list"]}
    for p in dashboard_panels(dash):
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            for name in re.findall(r"\$(\w+)", t["expr"]):
                assert name == "__rate_interval" or name in variables, (p["title"], name)
