"""Finding 3 (requests whose body never finishes are held without limit or deadline): the HEAD
test test_python_client.py::test_requests_that_never_finish_arriving_lose_their_connection_
after_the_arrival_timeout minus its --arrival_timeout_s=1 (7d2c18e has no such flag): 10 raw
HTTP/2 connections x 100 Gelu streams, each sent its headers and 512 bytes of a 1 MiB body.
PASS when the server closes every such connection by itself within 90 s (HEAD's default
--arrival_timeout_s is 60 s) and keeps serving; FAIL when it still holds them (7d2c18e: for
ever).
"""
import time

from fbserver import Server, closed_by_server, gelu_ok, grpc_headers, h2_connect, server_bin, verdict

s = Server(server_bin())
conns = []
try:
    idle = s.rss_kib()
    for _ in range(10):
        sock, conn = h2_connect(s.port, timeout=10)
        for _ in range(100):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, grpc_headers("/fusebox.v1.KernelService/Gelu"))
            conn.send_data(sid, b"\0" + (1 << 20).to_bytes(4, "big") + bytes(512))
        sock.sendall(conn.data_to_send())
        conns.append(sock)
    t0 = time.monotonic()
    time.sleep(1)
    held = s.rss_kib() - idle
    closed = set()
    while len(closed) < len(conns) and time.monotonic() - t0 < 90:
        for i, sock in enumerate(conns):
            if i not in closed and closed_by_server(sock):
                closed.add(i)
        time.sleep(0.2)
    took = time.monotonic() - t0
    print(f"1000 unfinished requests: RSS +{held} KiB; {len(closed)}/10 connections closed "
          f"by the server after {took:.1f} s")
    serving = gelu_ok(s.address)
    verdict(len(closed) == len(conns) and serving,
            f"{len(closed)} of 10 connections with unfinished requests closed by the server "
            f"within {took:.0f} s; serving={serving}")
finally:
    for k in conns:
        k.close()
    s.kill()
