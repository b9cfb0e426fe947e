"""fusebox Python client: numpy arrays in, numpy arrays out, over gRPC.

dtypes: float32 and float16 arrays map directly to FLOAT32 / FLOAT16. NumPy has
no bfloat16, so it is explicit:
  * pass ``dtype="bfloat16"``: float arrays are rounded to bfloat16 on the client
    (round to nearest even); a uint16 array is taken as raw bfloat16 bit patterns;
  * a bfloat16 result comes back as float32 (exact widening) by default, or as
    uint16 bit patterns with ``bf16_output="bits"``;
  * arrays whose dtype is named "bfloat16" (ml_dtypes, if you use it) are sent as
    bfloat16 without a dtype argument.
float64 input with no dtype is narrowed to float32.

Tensors can stay on the server: ``upload`` returns a Handle, any op accepts a
Handle in place of an array, ``keep=True`` makes an op return a Handle to its
output, and ``download`` / ``free`` / ``list_tensors`` do the rest.

Several replicas: a handle starts with the id of the replica that holds it
("<replica>.<random>"), and every call naming one sends the header
``fusebox-replica: <replica>``, which a proxy (deploy/proxy) routes on. Without a
proxy, ``Router([...targets])`` keeps one Client per replica and sends each call
naming a handle to the replica holding it, the rest round-robin.

TLS: ``Client(target, root_certificates="ca.pem")``; mTLS adds ``certificate_chain`` and
``private_key``. Without them (or ``tls=True``) the channel is plaintext.
"""

import itertools
import os
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple, Union

import grpc
import numpy as np

try:
    from fusebox.v1 import kernel_service_pb2 as pb
    from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fusebox_client needs the generated fusebox.v1 modules: build the CMake target "
        "fusebox_proto_python (or fusebox_client_python) and put <build>/python on PYTHONPATH"
    ) from e

_DTYPES = {"float32": pb.FLOAT32, "float16": pb.FLOAT16, "bfloat16": pb.BFLOAT16}
_ALIASES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
            "half": "float16", "bf16": "bfloat16"}


class FuseboxError(RuntimeError):
    """A failed call: ``code`` is the grpc.StatusCode, ``details`` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass
class Timing:
    """Where a call's time went (microseconds), as fusebox.v1.Timing says.

    In time order: queue, copy_in, launch, kernel, copy_out; total_us is the
    whole call on the server. launch_us is copy-in end -> kernel start on the
    GPU (launch work, an idle stream waking up); 0 on the CPU backend. It comes
    last, with a default, so positional construction keeps working. rpc_us is
    the client's round trip.
    """
    queue_us: float
    copy_in_us: float
    kernel_us: float
    copy_out_us: float
    total_us: float
    backend: str
    device: str
    stream: int
    rpc_us: float
    launch_us: float = 0.0


class Handle(str):
    """A tensor held by the server (from Client.upload or an op with keep=True)."""


REPLICA_HEADER = "fusebox-replica"


def replica_of(handle) -> Optional[str]:
    """The replica a Handle names ("<replica>.<random>"); None for arrays and bare handles."""
    if not isinstance(handle, str):
        return None
    replica, dot, _ = handle.partition(".")
    return replica if dot and replica else None


@dataclass
class TensorInfo:
    handle: Handle
    dtype: str
    shape: tuple
    size_bytes: int
    created_unix_ms: int
    last_used_unix_ms: int


def _info(t) -> TensorInfo:
    return TensorInfo(Handle(t.handle), pb.DType.Name(t.dtype).lower(), tuple(t.shape), t.size_bytes,
                      t.created_unix_ms, t.last_used_unix_ms)


def _float32_rounded_to_odd(x) -> np.ndarray:
    """float64 -> float32 with round-to-odd (an inexact result gets its last bit set), so that
    narrowing again to bfloat16 rounds as one direct rounding to nearest even would."""
    d = np.ascontiguousarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        f = d.astype(np.float32)
    back = f.astype(np.float64)
    inexact = (back != d) & ~np.isnan(d)
    away = np.abs(back) > np.abs(d)  # rounded away from zero: step back toward it
    u = f.view(np.uint32).copy()
    u[inexact] = (u[inexact] - away[inexact].astype(np.uint32)) | np.uint32(1)
    return u.view(np.float32)


def float_to_bfloat16_bits(x) -> np.ndarray:
    """Rounds float values to bfloat16 (nearest even, NaN stays NaN); returns uint16 bits.
    float64 input is rounded once, not through float32's rounding first."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        f = _float32_rounded_to_odd(x)
    else:
        f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    bits = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    bits = bits.astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    bits[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return bits


def bfloat16_bits_to_float(bits) -> np.ndarray:
    """Widens uint16 bfloat16 bit patterns to float32 (exact)."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _dtype_name(dtype) -> Optional[str]:
    if dtype is None:
        return None
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    name = _ALIASES.get(name, name)
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}: use float32, float16 or bfloat16")
    return name


def to_tensor(x, dtype=None) -> "pb.Tensor":
    """numpy array (+ optional target dtype) -> fusebox.v1.Tensor (see module doc)."""
    arr = np.asarray(x)
    if arr.dtype.byteorder == ">":  # big-endian floats: the same values, little-endian
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    want = _dtype_name(dtype)
    if want is None:
        if arr.dtype == np.float32:
            want = "float32"
        elif arr.dtype == np.float16:
            want = "float16"
        elif arr.dtype.name == "bfloat16":
            want = "bfloat16"
        elif arr.dtype == np.float64:
            want = "float32"
        elif arr.dtype == np.uint16:
            raise TypeError("uint16 input: pass dtype='bfloat16' to send it as bfloat16 bit patterns")
        else:
            raise TypeError(f"unsupported array dtype {arr.dtype}: use float32, float16 or bfloat16")
    if want == "bfloat16":
        if arr.dtype == np.uint16 or arr.dtype.name == "bfloat16":
            data = np.ascontiguousarray(arr).view(np.uint16)
        else:
            data = float_to_bfloat16_bits(arr)
    else:
        data = np.ascontiguousarray(arr, dtype=np.dtype(want).newbyteorder("<"))
    return pb.Tensor(dtype=_DTYPES[want], shape=list(arr.shape), data=data.tobytes())


def _ref(x, dtype) -> "pb.TensorRef":
    if isinstance(x, Handle):
        return pb.TensorRef(handle=x)
    return pb.TensorRef(tensor=to_tensor(x, dtype))


def from_tensor(t: "pb.Tensor", bf16_output: str = "float32") -> np.ndarray:
    """fusebox.v1.Tensor -> numpy array; bfloat16 as float32 or as uint16 bits."""
    shape = tuple(t.shape)
    if t.dtype == pb.FLOAT32:
        return np.frombuffer(t.data, dtype="<f4").reshape(shape).copy()
    if t.dtype == pb.FLOAT16:
        return np.frombuffer(t.data, dtype="<f2").reshape(shape).copy()
    if t.dtype == pb.BFLOAT16:
        bits = np.frombuffer(t.data, dtype="<u2").reshape(shape)
        if bf16_output == "bits":
            return bits.copy()
        if bf16_output != "float32":
            raise ValueError("bf16_output must be 'float32' or 'bits'")
        return bfloat16_bits_to_float(bits).reshape(shape)
    raise FuseboxError(grpc.StatusCode.INTERNAL, f"server returned unknown dtype {t.dtype}")


_HEALTH = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}

_Pem = Union[bytes, str, "os.PathLike[str]"]


def _read_pem(pem: Optional[_Pem]) -> Optional[bytes]:
    """bytes as they are (PEM text), a str or path-like as the file it names."""
    if pem is None or isinstance(pem, bytes):
        return pem
    with open(pem, "rb") as f:
        return f.read()


class Client:
    """A connection to one fusebox server. Thread-safe; use as a context manager."""

    def __init__(self, target: str, timeout: float = 60.0, max_message_bytes: int = -1,
                 token: Optional[str] = None, *, tls: bool = False,
                 root_certificates: Optional[_Pem] = None,
                 certificate_chain: Optional[_Pem] = None,
                 private_key: Optional[_Pem] = None,
                 server_name: Optional[str] = None):
        """target "host:port"; timeout: default deadline in seconds; token: bearer token
        for a server started with a token file.

        TLS, off unless ``tls=True`` or a PEM below is given. Each PEM is bytes (its contents)
        or a str / path-like (a file to read): root_certificates, the CA(s) to trust for the
        server's certificate (None: gRPC's default roots); certificate_chain and private_key,
        the client's certificate and key for mTLS, both or neither. server_name: the name the
        server's certificate must carry when it is not target's host."""
        self.target = target
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.enable_retries", 0),
        ]
        roots, chain, key = (_read_pem(p) for p in (root_certificates, certificate_chain,
                                                    private_key))
        if (chain is None) != (key is None):
            raise ValueError("certificate_chain and private_key come together (mTLS), or neither")
        if tls or roots is not None or chain is not None or server_name:
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            credentials = grpc.ssl_channel_credentials(
                root_certificates=roots, private_key=key, certificate_chain=chain)
            self.channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(target, options=options)
        self.stub = pb_grpc.KernelServiceStub(self.channel)
        self._health = self.channel.unary_unary("/grpc.health.v1.Health/Check")

    def close(self):
        self.channel.close()

    def _md(self, *refs):
        """The call's metadata: the token, and the replica of the first handle among refs."""
        replica = next((r for r in map(replica_of, refs) if r), None)
        if replica is None:
            return self._metadata
        return (self._metadata or ()) + ((REPLICA_HEADER, replica),)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_for_ready(self, timeout: float = 10.0) -> bool:
        """True when the channel connects within timeout seconds."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
            return True
        except grpc.FutureTimeoutError:
            return False

    def health(self, service: str = "", timeout: float = 5.0) -> str:
        """grpc.health.v1 Check: 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN' or 'UNKNOWN'."""
        svc = service.encode()
        req = (b"\x0a" + _varint(len(svc)) + svc) if svc else b""
        try:
            resp = self._health(req, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise FuseboxError(e.code(), e.details()) from None
        return _HEALTH.get(_read_field1_varint(resp), "UNKNOWN")

    # --- ops -------------------------------------------------------------------------------

    def gelu(self, x, *, dtype=None, keep=False, timeout=None, bf16_output="float32",
             return_timing=False):
        """Tanh-form GeLU of x (any shape). x: array or Handle."""
        req = pb.GeluRequest(input=_ref(x, dtype), output_options=pb.OutputOptions(keep_on_server=keep))
        return self._call(self.stub.Gelu, req, timeout, bf16_output, return_timing, (x,))

    def softmax(self, x, *, dtype=None, keep=False, timeout=None, bf16_output="float32",
                return_timing=False):
        """Softmax over the last axis (rank >= 1). x: array or Handle."""
        req = pb.SoftmaxRequest(input=_ref(x, dtype), output_options=pb.OutputOptions(keep_on_server=keep))
        return self._call(self.stub.Softmax, req, timeout, bf16_output, return_timing, (x,))

    def rowsum(self, x, *, dtype=None, keep=False, timeout=None, return_timing=False):
        """Sum over the last axis (rank >= 1); always float32. x: array or Handle."""
        req = pb.RowSumRequest(input=_ref(x, dtype), output_options=pb.OutputOptions(keep_on_server=keep))
        return self._call(self.stub.RowSum, req, timeout, "float32", return_timing, (x,))

    def matmul_relu(self, a, b, bias=None, *, dtype=None, allow_tf32=False, impl=0, keep=False,
                    timeout=None, bf16_output="float32", return_timing=False):
        """relu(a @ b + bias): a [M,K], b [K,N], bias [N] or None (arrays or Handles).
        dtype defaults to a's (when a is an array)."""
        ra = _ref(a, dtype)
        want = dtype
        if want is None and ra.HasField("tensor"):
            want = pb.DType.Name(ra.tensor.dtype).lower()
        req = pb.MatmulReluRequest(a=ra, b=_ref(b, want), allow_tf32=allow_tf32, impl=impl,
                                   output_options=pb.OutputOptions(keep_on_server=keep))
        if bias is not None:
            req.bias.CopyFrom(_ref(bias, want))
        return self._call(self.stub.MatmulRelu, req, timeout, bf16_output, return_timing,
                          (a, b, bias))

    # --- tensors held by the server --------------------------------------------------------

    def upload(self, x, *, dtype=None, chunk_bytes=4 << 20, timeout=None) -> Handle:
        """Streams x to the server in chunks; returns its Handle."""
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, not {chunk_bytes}")
        t = to_tensor(x, dtype)
        data = memoryview(t.data)

        def chunks():
            yield pb.UploadRequest(dtype=t.dtype, shape=t.shape, data=bytes(data[:chunk_bytes]))
            for off in range(chunk_bytes, len(data), chunk_bytes):
                yield pb.UploadRequest(data=bytes(data[off:off + chunk_bytes]))

        try:
            resp = self.stub.Upload(chunks(), timeout=self.timeout if timeout is None else timeout,
                                    metadata=self._metadata)
        except grpc.RpcError as e:
            raise FuseboxError(e.code(), e.details()) from None
        return Handle(resp.tensor.handle)

    def download(self, handle, *, bf16_output="float32", timeout=None) -> np.ndarray:
        """Fetches a held tensor as a numpy array (bfloat16 as in the ops)."""
        try:
            parts, header = [], None
            for msg in self.stub.Download(pb.DownloadRequest(handle=handle),
                                          timeout=self.timeout if timeout is None else timeout,
                                          metadata=self._md(handle)):
                if header is None and msg.HasField("tensor"):
                    header = msg.tensor
                parts.append(msg.data)
        except grpc.RpcError as e:
            raise FuseboxError(e.code(), e.details()) from None
        if header is None:
            raise FuseboxError(grpc.StatusCode.INTERNAL, "download carried no tensor header")
        return from_tensor(pb.Tensor(dtype=header.dtype, shape=header.shape, data=b"".join(parts)),
                           bf16_output)

    def free(self, handle) -> int:
        """Frees a held tensor; returns the bytes freed."""
        try:
            return self.stub.FreeTensor(pb.FreeTensorRequest(handle=handle), timeout=self.timeout,
                                        metadata=self._md(handle)).freed_bytes
        except grpc.RpcError as e:
            raise FuseboxError(e.code(), e.details()) from None

    def list_tensors(self):
        """This caller's held tensors: (list of TensorInfo, used_bytes, quota_bytes)."""
        try:
            r = self.stub.ListTensors(pb.ListTensorsRequest(), timeout=self.timeout,
                                      metadata=self._metadata)
        except grpc.RpcError as e:
            raise FuseboxError(e.code(), e.details()) from None
        return [_info(t) for t in r.tensors], r.used_bytes, r.quota_bytes

    def _call(self, method, req, timeout, bf16_output, return_timing, refs=()):
        start = time.perf_counter()
        try:
            resp = method(req, timeout=self.timeout if timeout is None else timeout,
                          metadata=self._md(*refs))
        except grpc.RpcError as e:
            raise FuseboxError(e.code(), e.details()) from None
        rpc_us = (time.perf_counter() - start) * 1e6
        if resp.output.HasField("handle"):
            out = Handle(resp.output.handle)
        elif resp.output.HasField("tensor"):
            out = from_tensor(resp.output.tensor, bf16_output)
        else:
            raise FuseboxError(grpc.StatusCode.INTERNAL, "response has no output")
        if not return_timing:
            return out
        t = resp.timing
        return out, Timing(queue_us=t.queue_us, copy_in_us=t.copy_in_us, kernel_us=t.kernel_us,
                           copy_out_us=t.copy_out_us, total_us=t.total_us, backend=t.backend,
                           device=t.device, stream=t.stream, rpc_us=rpc_us,
                           launch_us=t.launch_us)


class Router:
    """Several replicas without a proxy: one Client per target. A call naming a handle goes to
    the replica whose id the handle starts with; other calls (uploads, inline ops) go to the
    targets in turn. Replica ids are learned from the handles each target mints, or given:
    ``Router({"fusebox-0": "fusebox-0.fusebox-pods:50051", ...})``. Keyword arguments are
    Client's (token, TLS, timeout). A handle of a replica no target is known for is NOT_FOUND,
    as is one whose replica is gone. Thread-safe; use as a context manager."""

    def __init__(self, targets: Union[Iterable[str], Dict[str, str]], **client_kwargs):
        named = dict(targets) if isinstance(targets, dict) else {}
        addresses = list(named.values()) if named else list(targets)
        if not addresses:
            raise ValueError("Router needs at least one target")
        self.clients = [Client(t, **client_kwargs) for t in addresses]
        self._by_replica = {r: self.clients[i] for i, r in enumerate(named)}
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def close(self):
        for c in self.clients:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def client_for(self, *refs) -> Client:
        """The Client a call with these arguments goes to."""
        replica = next((r for r in map(replica_of, refs) if r), None)
        if replica is None:
            return self.clients[next(self._turn) % len(self.clients)]
        with self._lock:
            client = self._by_replica.get(replica)
        if client is None:
            raise FuseboxError(grpc.StatusCode.NOT_FOUND,
                               f"no target is known for replica '{replica}' (the handle's "
                               "replica is gone, or no call has reached it through this Router)")
        return client

    def _learn(self, client: Client, out):
        held = out[0] if isinstance(out, tuple) else out  # (out, timing) with return_timing
        replica = replica_of(held) if isinstance(held, Handle) else None
        if replica:
            with self._lock:
                self._by_replica.setdefault(replica, client)
        return out

    def gelu(self, x, **kw):
        c = self.client_for(x)
        return self._learn(c, c.gelu(x, **kw))

    def softmax(self, x, **kw):
        c = self.client_for(x)
        return self._learn(c, c.softmax(x, **kw))

    def rowsum(self, x, **kw):
        c = self.client_for(x)
        return self._learn(c, c.rowsum(x, **kw))

    def matmul_relu(self, a, b, bias=None, **kw):
        c = self.client_for(a, b, bias)
        return self._learn(c, c.matmul_relu(a, b, bias, **kw))

    def upload(self, x, **kw) -> Handle:
        c = self.client_for()
        return self._learn(c, c.upload(x, **kw))

    def download(self, handle, **kw) -> np.ndarray:
        return self.client_for(handle).download(handle, **kw)

    def free(self, handle) -> int:
        return self.client_for(handle).free(handle)

    def list_tensors(self):
        """Every target's list_tensors together: (TensorInfos, used_bytes, quota_bytes), the
        bytes summed over the targets."""
        infos, used, quota = [], 0, 0
        for c in self.clients:
            i, u, q = c.list_tensors()
            infos += i
            used += u
            quota += q
        return infos, used, quota


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_field1_varint(buf: bytes) -> int:
    """Reads field 1 (varint) of a serialized message; 0 when absent."""
    i, value = 0, 0

    def varint():
        nonlocal i
        v, shift = 0, 0
        while i < len(buf):
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v
            shift += 7
        raise ValueError("truncated varint")

    while i < len(buf):
        key = varint()
        wire = key & 7
        if wire == 0:
            v = varint()
            if key >> 3 == 1:
                value = v
        elif wire == 2:
            i += varint()
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError("cannot parse health response")
    return value
