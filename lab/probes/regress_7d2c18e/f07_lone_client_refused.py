"""Finding 7 (a lone sequential client is refused by its own previous call, whose in-flight
reservation is released in OnDone after the client already has its status): the HEAD test
service_test.cc CallsOneAfterAnotherEachFitAloneNearTheInflightLimit as a client of a server
binary: --inflight_mib=4, 300 Gelu calls one after another on one channel, 1 MiB inline
(3 MiB of the budget) and every third 2 MiB (6 MiB, past it: a call alone always fits).
PASS when none is refused; FAIL when some are RESOURCE_EXHAUSTED.
"""
import grpc

from fbserver import Server, f32, pb, server_bin, stub, verdict

s = Server(server_bin(), "--inflight_mib=4")
try:
    ch, st = stub(s.address)
    near = pb.GeluRequest(input=pb.TensorRef(tensor=f32(1 << 18)))
    past = pb.GeluRequest(input=pb.TensorRef(tensor=f32(1 << 19)))
    refused, other = 0, []
    for i in range(300):
        try:
            st.Gelu(past if i % 3 == 2 else near, timeout=30)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                refused += 1
                msg = e.details()
            else:
                other.append(e.code().name)
    ch.close()
    verdict(refused == 0 and not other,
            f"{refused} of 300 calls made one after another by a lone client refused"
            + (f" (e.g. {msg!r})" if refused else "") + (f"; other errors {other[:5]}" if other else ""))
finally:
    s.kill()
