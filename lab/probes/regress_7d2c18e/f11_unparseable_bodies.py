"""Finding 11 (unparseable request bodies get UNIMPLEMENTED with no message, are not counted in
fusebox_calls_total, and a handle of invalid UTF-8 makes libprotobuf log a line per request
before authentication). The HEAD test test_python_client.py::test_bodies_that_do_not_parse_are_
invalid_argument_counted_and_logged_at_most_a_little stops at its first assertion on 7d2c18e;
this probe checks the finding's three parts each on its own, with the same requests: 3 bytes of
non-protobuf to Gelu, 200 FreeTensor calls whose handle is b"\\xc3\\x28". PASS when the code is
INVALID_ARGUMENT with a message, /metrics counts the calls, and the log has at most 10 lines
about UTF-8; FAIL naming each part that does not hold.
"""
import re
import socket
import tempfile
import urllib.request

import grpc

from fbserver import Server, server_bin, verdict


def free_port():
    with socket.socket() as k:
        k.bind(("127.0.0.1", 0))
        return k.getsockname()[1]


mport = free_port()
err = tempfile.TemporaryFile()
s = Server(server_bin(), f"--metrics_address=127.0.0.1:{mport}", stderr=err)
problems = []
try:
    with grpc.insecure_channel(s.address) as ch:
        try:
            ch.unary_unary("/fusebox.v1.KernelService/Gelu")(b"\xff\xff\xff", timeout=30)
            problems.append("garbage body answered OK")
        except grpc.RpcError as e:
            print(f"garbage body: {e.code().name} {e.details()!r}")
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT or not e.details():
                problems.append(f"garbage body is {e.code().name} with message {e.details()!r}")
        free = ch.unary_unary("/fusebox.v1.KernelService/FreeTensor")
        codes = set()
        for _ in range(200):
            try:
                free(b"\x0a\x02\xc3\x28", timeout=30)
            except grpc.RpcError as e:
                codes.add(e.code().name)
        print(f"200 non-UTF-8 handles: {codes}")
    text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
    counted = {m: sum(float(l.split()[-1]) for l in text.splitlines()
                      if l.startswith("fusebox_calls_total{") and f'method="{m}"' in l)
               for m in ("Gelu", "FreeTensor")}
    print(f"fusebox_calls_total: {counted}")
    if counted["Gelu"] < 1 or counted["FreeTensor"] < 200:
        problems.append(f"not counted in fusebox_calls_total (Gelu {counted['Gelu']:.0f} of 1, "
                        f"FreeTensor {counted['FreeTensor']:.0f} of 200)")
    s.stop()
    err.seek(0)
    log = err.read().decode(errors="replace").splitlines()
    utf8 = [l for l in log if "UTF-8" in l]
    print(f"log lines about UTF-8: {len(utf8)}" + (f", e.g. {utf8[0][:200]!r}" if utf8 else ""))
    if len(utf8) > 10:
        problems.append(f"{len(utf8)} log lines ({sum(len(l) + 1 for l in utf8)} bytes) for 200 "
                        "unauthenticated requests")
finally:
    s.kill()
verdict(not problems, "; ".join(problems) or "INVALID_ARGUMENT with a reason, counted, log quiet")
