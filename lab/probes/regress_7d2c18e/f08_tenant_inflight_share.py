"""Finding 8 (the in-flight budget is global: one tenant whose client stops reading replies
starves every other tenant): the HEAD test service_test.cc TokenServiceTest.ATenantWhoseClient
TakesNoRepliesCannotStarveAnother as a client of a server binary, with no new flag: a token
file of two tenants, --inflight_mib=6 --max_message_bytes=2097152 (HEAD's default
--tenant_inflight_share gives each tenant half). alice calls through a proxy that stops reading
the server's replies; after each of her six 1 MiB Gelu calls, bob makes the same call directly.
PASS when all six of bob's calls succeed; FAIL when alice's untaken replies get bob refused.
"""
import time

import grpc

from fbserver import PausableProxy, Server, f32, md, pb, pb_grpc, server_bin, stub, token_file, verdict

tokens = token_file({"secret-a": "alice", "secret-b": "bob"})
s = Server(server_bin(), f"--token_file={tokens}", "--inflight_mib=6",
           "--max_message_bytes=2097152")
try:
    proxy = PausableProxy(s.port)
    ach = grpc.insecure_channel(f"127.0.0.1:{proxy.port}",
                                options=[("grpc.http2.bdp_probe", 0)])
    alice = pb_grpc.KernelServiceStub(ach)
    try:  # NOT_FOUND, over the connection: it is open before the pause
        alice.FreeTensor(pb.FreeTensorRequest(handle="none"), timeout=30, metadata=md("secret-a"))
    except grpc.RpcError:
        pass
    proxy.paused = True
    bch, bob = stub(s.address)
    req = pb.GeluRequest(input=pb.TensorRef(tensor=f32(1 << 18)))
    pending, bob_fail = [], None
    for i in range(6):
        pending.append(alice.Gelu.future(req, timeout=60, metadata=md("secret-a")))
        time.sleep(0.2)  # answered, not taken
        try:
            bob.Gelu(req, timeout=30, metadata=md("secret-b"))
        except grpc.RpcError as e:
            bob_fail = (i + 1, e.code().name, e.details())
            break
    proxy.paused = False
    pattern = ""
    for f in pending:
        try:
            f.result()
            pattern += "a"
        except grpc.RpcError:
            pattern += "r"
    ach.close()
    bch.close()
    verdict(bob_fail is None,
            "bob was never refused; alice's calls: " + pattern if bob_fail is None else
            f"after alice's {bob_fail[0]} untaken call(s) bob's call was {bob_fail[1]}: "
            f"{bob_fail[2]!r}")
finally:
    s.kill()
