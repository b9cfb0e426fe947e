"""Finding 6 (an Upload that sends a tiny message just inside the stall timeout holds its
reservation for ever): the HEAD test service_test.cc AnUploadTricklingOneByteAtATimeIsCancelled
WithinItsAllowance as a client of a server binary: --stall_timeout_s=0.3 (7d2c18e knows it), an
Upload of a 1 MiB fp32 tensor sending one byte every 200 ms for up to 5 s. PASS when the server
cancels it between 1 and 2.5 s (its waits add up: 0.3 s + about 1 s per MiB); FAIL when the
trickle keeps it alive (7d2c18e: every byte resets the timer; the upload only ends, short, when
the client stops).
"""
import time

import grpc

from fbserver import Server, pb, server_bin, stub, verdict

s = Server(server_bin(), "--stall_timeout_s=0.3")
try:
    ch, st = stub(s.address)

    def messages():
        yield pb.UploadRequest(dtype=pb.FLOAT32, shape=[1 << 18], data=b"x")
        for _ in range(25):
            time.sleep(0.2)
            yield pb.UploadRequest(data=b"x")

    t0 = time.monotonic()
    code, details = grpc.StatusCode.OK, ""
    try:
        st.Upload(messages(), timeout=30)
    except grpc.RpcError as e:
        code, details = e.code(), e.details()
    took = time.monotonic() - t0
    listed = len(st.ListTensors(pb.ListTensorsRequest(), timeout=10).tensors)
    ch.close()
    verdict(code == grpc.StatusCode.CANCELLED and 1.0 < took < 2.5 and listed == 0,
            f"the trickling upload ended {code.name} ({details!r}) after {took:.1f} s; "
            f"{listed} tensors held")
finally:
    s.kill()
