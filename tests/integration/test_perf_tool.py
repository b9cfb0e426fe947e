"""fusebox-perf against a real CPU fusebox-server on a free port: a short closed-loop sweep and
an open-loop run, each checked through the --json report (every field there, every call
answered, no errors) and the CSV; --token reaches a server with a token file; bad command
lines exit 2."""
import csv
import io
import json
import os
import re
import signal
import subprocess

import pytest

SERVER_BIN = os.environ["FUSEBOX_SERVER_BIN"]
PERF_BIN = os.environ["FUSEBOX_PERF_BIN"]

QUANTILES = ["p50", "p90", "p99", "p99.9"]
PHASES = ["queue_us", "copy_in_us", "launch_us", "kernel_us", "copy_out_us", "total_us"]


def serve(*flags):
    proc = subprocess.Popen([SERVER_BIN, "--address=127.0.0.1:0", "--backend=cpu", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on (\S+):(\d+)", line)
        assert m, f"server did not announce its port: {line!r}"
        yield f"127.0.0.1:{m.group(2)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server():
    yield from serve()


def perf(server, *args):
    if "--warmup_s" not in args:
        args = ("--warmup_s", "0.2", *args)
    return subprocess.run([PERF_BIN, "--server", server, *args],
                          capture_output=True, text=True, timeout=60)


def check_run(run, callers, rate):
    assert run["callers"] == callers
    assert run["rate"] == rate
    assert run["errors"] == {}
    assert run["calls"] > 0 and run["ok"] == run["calls"]
    assert run["calls_per_s"] > 0
    lat = run["latency_us"]
    values = [lat[q] for q in QUANTILES]
    assert all(v > 0 for v in values) and values == sorted(values)
    assert lat["max"] >= lat["p99.9"]
    assert set(run["server_us"]) == set(PHASES)
    assert run["server_us"]["total_us"] > 0
    assert run["server_us"]["total_us"] >= run["server_us"]["kernel_us"]


def test_closed_loop_sweep_reports_every_caller_count_without_errors(server):
    r = perf(server, "--op", "gelu", "--shape", "1024", "--concurrency_sweep", "1,4",
             "--duration_s", "0.6", "--json", "-")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["op"] == "gelu" and report["dtype"] == "float32" and report["shape"] == [1024]
    assert report["mode"] == "closed" and report["input"] == "inline"
    assert [run["callers"] for run in report["runs"]] == [1, 4]
    for run in report["runs"]:
        check_run(run, run["callers"], 0)
    assert "p99.9 us" in r.stderr  # the table moves to stderr when stdout is the JSON


def test_open_loop_by_handle_sends_at_the_rate_asked(server, tmp_path):
    out = tmp_path / "r.json"
    r = perf(server, "--op", "matmul_relu", "--shape", "16x32x8", "--bias", "--dtype", "bfloat16",
             "--by_handle", "--rate", "200", "--callers", "4", "--duration_s", "1",
             "--json", str(out), "--csv", "-")
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["mode"] == "open" and report["input"] == "handle"
    (run,) = report["runs"]
    check_run(run, 4, 200)
    assert run["calls"] == 200  # exactly the calls due in the measured second
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 1 and rows[0]["mode"] == "open" and rows[0]["errors"] == ""
    assert int(rows[0]["calls"]) == 200


def test_failed_calls_are_counted_by_grpc_code_and_fail_the_run(server):
    # 16 MiB cannot cross even loopback within a 1 ms deadline.
    r = perf(server, "--shape", "4194304", "--timeout_ms", "1", "--duration_s", "0.3",
             "--warmup_s", "0", "--json", "-")
    assert r.returncode == 1
    (run,) = json.loads(r.stdout)["runs"]
    assert run["ok"] == 0 and run["errors"] == {"DEADLINE_EXCEEDED": run["calls"]}


def test_the_token_reaches_the_server(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret alice\n")
    for address in serve(f"--token_file={tokens}"):
        args = ("--duration_s", "0.3", "--warmup_s", "0", "--json", "-")
        r = perf(address, "--token", "s3cret", *args)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["runs"][0]["errors"] == {}
        r = perf(address, "--token", "wrong", *args)
        assert r.returncode == 1
        (run,) = json.loads(r.stdout)["runs"]
        assert run["ok"] == 0 and list(run["errors"]) == ["UNAUTHENTICATED"]


@pytest.mark.parametrize("args", [["--op", "conv"], ["--shape", "4x"], ["--dtype", "int8"],
                                  ["--rate", "10", "--concurrency_sweep", "1,2"],
                                  ["--callers", "0"], ["--no_such_option"]])
def test_bad_command_lines_exit_2(server, args):
    assert perf(server, *args).returncode == 2


def test_stream_mode_keeps_a_window_on_an_execute_stream_per_caller(server):
    r = perf(server, "--mode=stream", "--window", "8", "--concurrency_sweep", "1,2",
             "--duration_s", "0.5", "--shape", "256", "--json", "-")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["mode"] == "stream" and report["window"] == 8
    for run, callers in zip(report["runs"], [1, 2]):
        check_run(run, callers, 0)
        assert run["server_us"]["total_us"] > 0
    # Streaming is closed loop only.
    bad = perf(server, "--mode=stream", "--rate", "100")
    assert bad.returncode == 2 and "closed loop" in bad.stderr
