"""Finding 12 (200 idle connections to the metrics port stall a scrape for over 60 s): the HEAD
test tests/metrics/test_metrics_http.py::test_300_idle_connections_do_not_stall_a_scrape gives
the scrape 3 s; this probe measures how long the stall really is: 200 idle TCP connections to
--metrics_address, then GET /metrics with up to 90 s to answer. PASS when it answers 200 within
2 s; FAIL otherwise, with the time taken.
"""
import socket
import time

from fbserver import Server, server_bin, verdict


def free_port():
    with socket.socket() as k:
        k.bind(("127.0.0.1", 0))
        return k.getsockname()[1]


mport = free_port()
s = Server(server_bin(), f"--metrics_address=127.0.0.1:{mport}")
idle = []
try:
    for _ in range(200):
        idle.append(socket.create_connection(("127.0.0.1", mport), timeout=5))
    time.sleep(0.2)
    t0 = time.monotonic()
    status, raw = None, b""
    try:
        with socket.create_connection(("127.0.0.1", mport), timeout=90) as k:
            k.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while True:
                d = k.recv(65536)
                if not d:
                    break
                raw += d
                if status is None and b"\r\n" in raw:
                    status = raw.split(b" ", 2)[1].decode()
                    took_first = time.monotonic() - t0
    except OSError as e:
        print(f"scrape: {e!r}")
    took = time.monotonic() - t0
    print(f"GET /metrics behind 200 idle connections: status {status}, {len(raw)} bytes, "
          f"{took:.1f} s")
    verdict(status == "200" and took < 2,
            f"the scrape took {took:.1f} s (status {status}) behind 200 idle connections")
finally:
    for k in idle:
        k.close()
    s.kill()
