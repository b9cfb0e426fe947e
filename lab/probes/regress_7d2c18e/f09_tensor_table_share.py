"""Finding 9 (empty tensors cost no quota but fill the server-wide tensor table, so one tenant
locks all others out): the HEAD test service_test.cc TokenServiceTest.ATenantCannotTakeEvery
PlaceInTheTensorTable as a client of a server binary, with no new flag: two tenants,
--max_tensors=10 (HEAD's default --max_tensors_per_tenant gives each 5). alice uploads up to 10
empty tensors, then bob uploads 5. PASS when alice holds 5 and bob gets all his 5; FAIL when
alice takes all 10 places and bob is refused.
"""
import grpc

from fbserver import Server, md, pb, server_bin, stub, token_file, verdict

tokens = token_file({"secret-a": "alice", "secret-b": "bob"})
s = Server(server_bin(), f"--token_file={tokens}", "--max_tensors=10")
try:
    ch, st = stub(s.address)

    def upload(tok):
        try:
            st.Upload(iter([pb.UploadRequest(dtype=pb.FLOAT32, shape=[0])]), timeout=10,
                      metadata=md(tok))
            return None
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}"

    alice = 0
    for _ in range(10):
        if upload("secret-a"):
            break
        alice += 1
    bob_errors = [e for e in (upload("secret-b") for _ in range(5)) if e]
    ch.close()
    verdict(alice == 5 and not bob_errors,
            f"alice holds {alice} empty tensors of --max_tensors=10; bob refused "
            f"{len(bob_errors)} of 5" + (f" ({bob_errors[0]!r})" if bob_errors else ""))
finally:
    s.kill()
