"""Finding 10 (a 14-byte RowSum of shape [268435456, 0] makes a 1 GiB reply): the HEAD test
service_test.cc ResultsThatNeedNoKernelAreHeldToTheRequestsSize's first case at the default
--max_message_bytes, against a server binary: RowSum on an inline empty fp32 tensor of shape
[268435456, 0] (the client accepts any reply size). PASS when it is refused (RESOURCE_EXHAUSTED:
results that need no kernel are held to the request's size, or 64 KiB); FAIL when the server
builds and sends the 1 GiB of zeros.
"""
import time

import grpc

from fbserver import Server, pb, server_bin, stub, verdict

s = Server(server_bin())
try:
    ch, st = stub(s.address)
    req = pb.RowSumRequest(input=pb.TensorRef(tensor=pb.Tensor(dtype=pb.FLOAT32,
                                                               shape=[268435456, 0])))
    print(f"request: {req.ByteSize()} bytes")
    t0 = time.monotonic()
    try:
        r = st.RowSum(req, timeout=120)
        n = len(r.output.tensor.data)
        verdict(False, f"a {req.ByteSize()}-byte request got a {n >> 20} MiB reply "
                       f"in {time.monotonic() - t0:.1f} s")
    except grpc.RpcError as e:
        verdict(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"refused {e.code().name}: {e.details()!r}")
finally:
    ch.close()
    s.kill()
