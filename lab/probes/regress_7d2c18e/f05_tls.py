"""Finding 5 (no TLS at all: bearer tokens and tensors cross the network in cleartext). The HEAD
tests (test_tls.py, tls_client_test.cc, tls_test.cc) all start the server with --tls_cert, a
flag 7d2c18e does not have, so they fail there for that reason alone. This probe shows the
finding itself: a server with a token file is started with TLS if it accepts
--tls_cert/--tls_key (certificates made by openssl now), else as it can (plaintext), and a
Gelu call carrying the token and a marker tensor goes through a recording TCP proxy. PASS when
the server speaks TLS (a plaintext client is refused, neither the token nor the marker is on
the wire) and warns at start-up about a token file without TLS; FAIL when the token crosses
the wire in cleartext (7d2c18e: --tls_cert is an unknown flag, the only server it runs has the
token and data readable on the wire, and it gives no warning).
"""
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import grpc

from fbserver import Server, md, pb, pb_grpc, server_bin, token_file, verdict

TOKEN = "tok-7d2c18e-cleartext-probe"
MARKER = b"FUSEBOX-TENSOR-MARKER-0123456789"  # 32 bytes: 8 fp32 values


def make_cert(d, name, ca=None):
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    cmd = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
           "-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)]
    if ca:
        cmd += ["-CA", str(ca[0]), "-CAkey", str(ca[1]),
                "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                "-addext", "basicConstraints=critical,CA:FALSE"]
    subprocess.run(cmd, check=True, capture_output=True)
    return cert, key


def recording_proxy(port, seen):
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4)

    def pump(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                seen.append(d)
                b.sendall(d)
        except OSError:
            pass
        for k in (a, b):
            try:
                k.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def accept():
        while True:
            c, _ = lst.accept()
            s = socket.create_connection(("127.0.0.1", port))
            threading.Thread(target=pump, args=(c, s), daemon=True).start()
            threading.Thread(target=pump, args=(s, c), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return lst.getsockname()[1]


binary = server_bin()
d = Path(tempfile.mkdtemp(prefix="fusebox-tls-probe-"))
ca = make_cert(d, "ca")
srv = make_cert(d, "server", ca)
tokens = token_file({TOKEN: "alice"})
req = pb.GeluRequest(input=pb.TensorRef(tensor=pb.Tensor(dtype=pb.FLOAT32, shape=[8],
                                                         data=MARKER)))
help_text = subprocess.run([binary, "--helpfull"], capture_output=True, text=True,
                           timeout=30).stdout
tls = "--tls_cert" in help_text
flags = [f"--token_file={tokens}"] + ([f"--tls_cert={srv[0]}", f"--tls_key={srv[1]}"] if tls else [])
print(f"server knows --tls_cert: {tls}")
s = Server(binary, *flags)
try:
    warned = "CLEARTEXT" in s.stderr_text() or "without TLS" in s.stderr_text()
    # (with TLS on, the warning is read below from a second, plaintext start)
    seen = []
    port = recording_proxy(s.port, seen)
    if tls:
        creds = grpc.ssl_channel_credentials(root_certificates=ca[0].read_bytes())
        ch = grpc.secure_channel(f"127.0.0.1:{port}", creds,
                                 options=[("grpc.ssl_target_name_override", "localhost")])
    else:
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    r = pb_grpc.KernelServiceStub(ch).Gelu(req, timeout=30, metadata=md(TOKEN))
    assert list(r.output.tensor.shape) == [8]
    ch.close()
    wire = b"".join(seen)
    token_seen, marker_seen = TOKEN.encode() in wire, MARKER in wire
    plain_refused = True
    if tls:
        with grpc.insecure_channel(s.address) as pch:
            try:
                pb_grpc.KernelServiceStub(pch).Gelu(req, timeout=5, metadata=md(TOKEN))
                plain_refused = False
            except grpc.RpcError as e:
                plain_refused = e.code() == grpc.StatusCode.UNAVAILABLE
finally:
    s.kill()
if tls:  # the start-up warning of a token file without TLS
    p = Server(binary, f"--token_file={tokens}")
    warned = "CLEARTEXT" in p.stderr_text()
    p.kill()
print(f"on the wire ({len(wire)} bytes): token {'SEEN' if token_seen else 'not seen'}, "
      f"tensor bytes {'SEEN' if marker_seen else 'not seen'}; plaintext client refused: "
      f"{plain_refused}; token-file-without-TLS warning: {warned}")
verdict(tls and not token_seen and not marker_seen and plain_refused and warned,
        "TLS served, nothing readable on the wire, plaintext refused, warning given" if tls else
        "the server has no --tls_cert: the bearer token and the tensor cross the wire in "
        f"cleartext (token seen: {token_seen}, tensor seen: {marker_seen}), no warning: {not warned}")
