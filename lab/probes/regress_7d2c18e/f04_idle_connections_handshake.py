"""Finding 4 (idle TCP connections are never closed: no connection limit, no short handshake
timeout): the HEAD test test_python_client.py::test_connections_past_the_limit_are_closed_at_
once_and_silent_ones_after_the_handshake minus its --max_connections=20 --handshake_timeout_s=1
(flags 7d2c18e lacks): 60 TCP connections that never send HTTP/2's preface. PASS when the server
has closed all of them 12 s later (HEAD's default --handshake_timeout_s is 10) and still serves;
FAIL when it holds them (7d2c18e: for ever). The descriptor-exhaustion half of the finding is
test_a_flood_of_idle_connections_past_the_descriptor_limit_loses_nothing, which runs on
7d2c18e unchanged.
"""
import time

from fbserver import Server, closed_by_server, gelu_ok, idle_connections, server_bin, verdict

s = Server(server_bin())
socks = []
try:
    socks = idle_connections(s.port, 60)
    time.sleep(12)
    closed = sum(closed_by_server(k) for k in socks)
    serving = gelu_ok(s.address)
    verdict(closed == len(socks) == 60 and serving,
            f"{closed} of {len(socks)} silent connections closed by the server after 12 s; "
            f"serving={serving}")
finally:
    for k in socks:
        k.close()
    s.kill()
