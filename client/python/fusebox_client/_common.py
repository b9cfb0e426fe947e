"""What the synchronous and the asyncio client share: settings from the environment, errors,
handles, timings, progress, the one place uploads are cut into chunks, download assembly, and
the requests and replies of the op RPCs. Neither client builds a message anywhere else.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union,
                    cast)

import grpc
import numpy as np

from fusebox.v1 import kernel_service_pb2 as pb

from ._tensors import (Bf16Output, DTypeArg, NDArray, OutputKind, Wire, decode, dtype_name,
                       element_bytes, to_wire)
from ._wire import key, message, OpReply, Pieces, tensor_ref, varint

DEFAULT_SERVER = "localhost:50051"
SERVICE = "/fusebox.v1.KernelService/"
# protobuf cannot serialize a message of 2 GiB or more; what is left of it for tensor bytes.
PROTOBUF_LIMIT = (1 << 31) - 1
INLINE_LIMIT = PROTOBUF_LIMIT - (1 << 20)
DEFAULT_CHUNK_BYTES = 4 << 20
# Parallel transfers: a tensor of at least PARALLEL_MIN_BYTES goes as byte ranges of
# RANGE_BYTES on DEFAULT_CONNECTIONS connections at once (CreateUpload / WriteUpload /
# CommitUpload; ranged Downloads); each WriteUpload message carries TRANSFER_CHUNK_BYTES.
PARALLEL_MIN_BYTES = 64 << 20
DEFAULT_CONNECTIONS = 4
RANGE_BYTES = 8 << 20
TRANSFER_CHUNK_BYTES = 4 << 20

Metadata = Tuple[Tuple[str, str], ...]
Pem = Union[bytes, str, "os.PathLike[str]"]
ProgressCallback = Callable[[int, int], None]
Progress = Union[bool, ProgressCallback, None]


class FuseboxError(RuntimeError):
    """A failed call: ``code`` is the grpc.StatusCode, ``details`` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class MessageTooLargeError(FuseboxError, ValueError):
    """Inline tensors too large for one message: upload() them and pass the handle."""


def rpc_error(e: Exception, inline_bytes: int = 0) -> FuseboxError:
    """A gRPC error (a grpc.RpcError, or anything with its code() and details(): the native
    transport's) as a FuseboxError; one that a large inline request explains says so."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else None) or str(e)
    # gRPC's words for a message past a limit (either side's) or past protobuf's 2 GiB.
    too_large = ("larger than max" in details or "serializing request" in details or
                 "message" in details.lower() and "limit" in details.lower())
    if inline_bytes >= (1 << 20) and too_large:
        return MessageTooLargeError(code, f"{details} (this call sends {inline_bytes} bytes of "
                                    "inline tensors: upload() large tensors once and pass the "
                                    "handle instead)")
    return FuseboxError(code, details)


def check_inline(inline_bytes: int, max_message_bytes: int) -> None:
    """Refuses, before anything is sent, a request that cannot be one gRPC message."""
    limit = INLINE_LIMIT if max_message_bytes < 0 else min(INLINE_LIMIT, max_message_bytes)
    if inline_bytes > limit:
        raise MessageTooLargeError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"this call's inline tensors hold {inline_bytes} bytes, past the {limit}-byte "
            "message limit: upload() them (streamed in chunks) and pass the handles instead")


@dataclass(frozen=True)
class Settings:
    """Where and how to connect, each from its argument or else the environment."""
    target: str
    token: Optional[str]
    root_certificates: Optional[bytes]
    certificate_chain: Optional[bytes]
    private_key: Optional[bytes]
    tls: bool


def _read_pem(pem: Optional[Pem]) -> Optional[bytes]:
    """bytes as they are (PEM text), a str or path-like as the file it names."""
    if pem is None or isinstance(pem, bytes):
        return pem
    with open(pem, "rb") as f:
        return f.read()


_heap_lock = threading.Lock()
_heap_kept: Optional[bool] = None


def keep_freed_memory(retain_bytes: int = 1 << 30) -> bool:
    """Lets this process's malloc (glibc's) serve large blocks from its heap and keep up to
    retain_bytes of freed memory for the next ones, instead of mapping every block past 32 MiB
    fresh and faulting it in 4 KiB at a time. A 64 MiB inline call makes four or five such
    buffers, three of them inside grpcio, and their page faults were most of the Python
    client's time (lab/notes/python-client.md). Process-wide and once: the clients call it
    when made unless told not to (keep_freed_memory=False, or $FUSEBOX_KEEP_FREED_MEMORY=0).
    Returns whether the setting is in effect (False where malloc is not glibc's)."""
    global _heap_kept
    with _heap_lock:
        if _heap_kept is not None:
            return _heap_kept
        _heap_kept = False
        if os.environ.get("FUSEBOX_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
            return False
        try:
            import ctypes
            libc = ctypes.CDLL(None)
            libc.gnu_get_libc_version  # glibc only: mallopt's numbers below are glibc's
            m_trim_threshold, m_mmap_max = -1, -4
            retain = max(0, min(int(retain_bytes), (1 << 31) - 1))
            _heap_kept = bool(libc.mallopt(m_mmap_max, 0)) and bool(
                libc.mallopt(m_trim_threshold, ctypes.c_int(retain)))
        except (OSError, AttributeError):
            pass
        return _heap_kept


def settings(target: Optional[str], token: Optional[str], tls: bool,
             root_certificates: Optional[Pem], certificate_chain: Optional[Pem],
             private_key: Optional[Pem], server_name: Optional[str]) -> Settings:
    """Arguments first, then $FUSEBOX_SERVER, $FUSEBOX_TOKEN, $FUSEBOX_TLS_CA,
    $FUSEBOX_TLS_CERT and $FUSEBOX_TLS_KEY (as the CLI reads them)."""
    env = os.environ
    target = target or env.get("FUSEBOX_SERVER") or DEFAULT_SERVER
    if token is None:
        token = env.get("FUSEBOX_TOKEN") or None
    roots = _read_pem(root_certificates if root_certificates is not None
                      else env.get("FUSEBOX_TLS_CA") or None)
    chain = _read_pem(certificate_chain if certificate_chain is not None
                      else env.get("FUSEBOX_TLS_CERT") or None)
    key = _read_pem(private_key if private_key is not None
                    else env.get("FUSEBOX_TLS_KEY") or None)
    if (chain is None) != (key is None):
        raise ValueError("certificate_chain and private_key come together (mTLS), or neither")
    use_tls = bool(tls or roots is not None or chain is not None or server_name)
    return Settings(target, token, roots, chain, key, use_tls)


def channel_options(max_message_bytes: int, server_name: Optional[str]) -> List[Tuple[str, Any]]:
    options: List[Tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.enable_retries", 0),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


def transfer_channel_options(options: List[Tuple[str, Any]], index: int
                             ) -> List[Tuple[str, Any]]:
    """A parallel transfer's extra channel: a subchannel pool of its own and an argument no
    other channel has, so that it is a connection of its own."""
    return options + [("grpc.use_local_subchannel_pool", 1),
                      ("fusebox.transfer_connection", index)]


def credentials(s: Settings) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=s.root_certificates,
                                        private_key=s.private_key,
                                        certificate_chain=s.certificate_chain)


# --- handles ---------------------------------------------------------------------------------

class Freer:
    """Frees handles for one client. ``free_later`` must not block (it may run in a garbage
    collection, on any thread); ``closed`` makes every later free a no-op."""

    def __init__(self, free_later: Callable[[str], None],
                 free_now: Optional[Callable[[str], None]] = None) -> None:
        self._free_later = free_later
        self._free_now = free_now
        self._lock = threading.Lock()
        self.closed = False
        self.live: "weakref.WeakSet[Handle]" = weakref.WeakSet()

    def __call__(self, handle_id: str) -> None:
        if not self.closed:
            try:
                self._free_later(handle_id)
            except Exception:  # a finaliser has no caller to tell
                pass

    def now(self, handle_id: str) -> None:
        """An explicit free (``Handle.free``, the end of a ``with``): done when it returns, where
        the client can wait for it (the synchronous one); a later listing no longer shows it."""
        if self._free_now is None:
            self(handle_id)
        elif not self.closed:
            try:
                self._free_now(handle_id)
            except Exception:  # as a finaliser's: a tensor already gone is not an error here
                pass

    def adopt(self, handle: "Handle") -> None:
        with self._lock:
            self.live.add(handle)

    def take_live(self) -> List["Handle"]:
        """The handles still alive and owned (not released), detached from their finalisers
        (the client frees them)."""
        with self._lock:
            handles = [h for h in self.live if h.owned]
            self.live.clear()
        for h in handles:
            h.release()
        return handles


class Handle:
    """A tensor held by the server. A handle this client created (``upload``, ``keep=True``)
    frees its tensor when it leaves a ``with`` block, when ``free()`` is called, when it is
    garbage collected, or when its client closes; ``release()`` keeps the tensor on the server
    and returns its id. ``Handle("id")`` or a plain string names a tensor without owning it."""

    __slots__ = ("id", "_finalizer", "_freer", "__weakref__")

    def __init__(self, handle_id: str, *, _freer: Optional[Freer] = None) -> None:
        self.id = str(handle_id)
        self._finalizer: "Optional[weakref.finalize[[str], Handle]]" = None
        self._freer = _freer
        if _freer is not None:
            self._finalizer = weakref.finalize(self, _freer, self.id)
            self._finalizer.atexit = False  # at exit the channel may already be gone
            _freer.adopt(self)

    @property
    def owned(self) -> bool:
        """True while this object will free its tensor."""
        return self._finalizer is not None and self._finalizer.alive

    def free(self) -> None:
        """Frees the tensor now, if this object owns it (once; later calls do nothing)."""
        if self._finalizer is not None and self._freer is not None and \
                self._finalizer.detach() is not None:
            self._freer.now(self.id)

    def release(self) -> str:
        """Stops owning the tensor (it stays on the server) and returns its id."""
        if self._finalizer is not None:
            self._finalizer.detach()
        return self.id

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"Handle({self.id!r}{', owned' if self.owned else ''})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Handle):
            return self.id == other.id
        if isinstance(other, str):
            return self.id == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    def __lt__(self, other: "HandleLike") -> bool:
        return self.id < handle_id(other)


HandleLike = Union[Handle, str]


def handle_id(h: HandleLike) -> str:
    return h.id if isinstance(h, Handle) else str(h)


@dataclass
class Timing:
    """Where a call's time went (microseconds), as fusebox.v1.Timing says.

    In time order: queue, copy_in, launch, kernel, copy_out; total_us is the whole call on the
    server. launch_us is copy-in end -> kernel start on the GPU (launch work, an idle stream
    waking up); 0 on the CPU backend. rpc_us is the client's round trip.
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


@dataclass
class TensorInfo:
    """One held tensor, as ListTensors reports it."""
    handle: Handle
    dtype: str
    shape: Tuple[int, ...]
    size_bytes: int
    created_unix_ms: int
    last_used_unix_ms: int


def tensor_info(t: pb.TensorInfo) -> TensorInfo:
    return TensorInfo(Handle(t.handle), dtype_name(t.dtype), tuple(t.shape), t.size_bytes,
                      t.created_unix_ms, t.last_used_unix_ms)


# --- progress --------------------------------------------------------------------------------

class Meter:
    """Progress of one transfer: a callback on every chunk, or (``progress=None``) a tqdm bar on
    stderr that appears once the transfer has taken a second, when tqdm is installed."""

    def __init__(self, progress: Progress, total: int, label: str) -> None:
        self._lock = threading.Lock()  # a parallel transfer's threads add at once
        self.done = 0
        self.total = total
        self._callback: Optional[ProgressCallback] = None
        self._bar: Any = None
        if callable(progress):
            self._callback = progress
        elif progress is None or progress is True:
            try:
                from tqdm.auto import tqdm  # type: ignore[import-untyped, unused-ignore]
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=label, unit="B", unit_scale=True,
                             unit_divisor=1024, delay=0.0 if progress else 1.0, leave=False,
                             file=sys.stderr)

    def add(self, n: int) -> None:
        with self._lock:  # one callback at a time, its count never going back
            self.done += n
            if self._callback is not None:
                self._callback(self.done, self.total)
            if self._bar is not None:
                self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# --- transfers -------------------------------------------------------------------------------

def upload_messages(w: Wire, chunk_bytes: int, meter: Meter) -> Iterator[bytes]:
    """The one place an upload is cut into messages (serialized UploadRequests): the header
    with the first chunk, then one message per chunk, each sliced from the caller's bytes and
    copied once, into its message (a chunk's copy, never the tensor's).
    Parallel or zero-copy transfers belong here. A bad chunk size raises here, before any call."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, not {chunk_bytes}")
    return _chunks(w, chunk_bytes, meter)


def _with_data(head: bytes, field: int, chunk: memoryview) -> bytes:
    """A message's other fields (serialized, all numbered below ``field``) and then ``chunk``
    as the bytes field ``field``: the chunk copied once, into the message."""
    if not len(chunk):
        return head
    return b"".join((head, key(field, 2), varint(len(chunk)), chunk))


def _chunks(w: Wire, chunk_bytes: int, meter: Meter) -> Iterator[bytes]:
    """UploadRequest messages, serialized: {dtype, shape, data} then {data}..."""
    data = w.data()
    first = data[:chunk_bytes]
    yield _with_data(pb.UploadRequest(dtype=w.dtype, shape=list(w.shape)).SerializeToString(),
                     3, first)
    meter.add(len(first))
    for off in range(chunk_bytes, len(data), chunk_bytes):
        chunk = data[off:off + chunk_bytes]
        yield _with_data(b"", 3, chunk)
        meter.add(len(chunk))


class RangeQueue:
    """The byte ranges of a parallel transfer, handed out in turn to its streams (from any
    thread); after stop() it hands out none, so the other streams end at their next range."""

    def __init__(self, total: int, range_bytes: int) -> None:
        if range_bytes <= 0:
            raise ValueError(f"range_bytes must be > 0, not {range_bytes}")
        self._lock = threading.Lock()
        self._next = 0
        self._total = total
        self._range = range_bytes
        self.stopped = False

    def count(self) -> int:
        return (self._total + self._range - 1) // self._range

    def take(self) -> Optional[Tuple[int, int]]:
        with self._lock:
            if self.stopped or self._next >= self._total:
                return None
            start = self._next
            self._next = min(self._total, start + self._range)
            return start, self._next

    def stop(self) -> None:
        with self._lock:
            self.stopped = True


def write_messages(upload_id: str, w: Wire, ranges: RangeQueue, meter: Meter,
                   first_range: Tuple[int, int]) -> Iterator[bytes]:
    """One WriteUpload stream's messages: first_range (taken before the stream opens: the
    server refuses a stream with no message), then the next range until none is left, in
    chunks sliced from the caller's bytes (a chunk's copy, never the tensor's); the first
    message names the upload."""
    data = w.data()
    first = True
    r: Optional[Tuple[int, int]] = first_range
    while r is not None:
        for off in range(r[0], r[1], TRANSFER_CHUNK_BYTES):
            chunk = data[off:min(r[1], off + TRANSFER_CHUNK_BYTES)]
            yield _with_data(pb.WriteUploadRequest(upload_id=upload_id if first else "",
                                                   offset=off).SerializeToString(), 3, chunk)
            first = False
            meter.add(len(chunk))
        r = ranges.take()


class RangedAssembly:
    """A download fetched as byte ranges in parallel, each written into place in the result's
    buffer (the tensor is held once)."""

    def __init__(self, info: pb.TensorInfo, progress: Progress, label: str) -> None:
        self.header = info
        self.buf = np.empty(int(info.size_bytes), dtype=np.uint8)
        self.meter = Meter(progress, int(info.size_bytes), label)

    def put(self, offset: int, end: int, msgs: Iterator[pb.DownloadResponse]) -> None:
        """Writes one ranged Download's messages at `offset`; checks they fill [offset, end)."""
        for msg in msgs:
            offset = self.write(offset, end, msg)
        self.check_end(offset, end)

    def write(self, offset: int, end: int, msg: pb.DownloadResponse) -> int:
        """Writes one message of the range [.., end) at `offset`; returns the next offset."""
        n = len(msg.data)
        if offset + n > end:
            raise FuseboxError(grpc.StatusCode.INTERNAL,
                               "a ranged download sent more bytes than it asked for")
        self.buf[offset:offset + n] = np.frombuffer(msg.data, dtype=np.uint8)
        self.meter.add(n)
        return offset + n

    @staticmethod
    def check_end(offset: int, end: int) -> None:
        if offset != end:
            raise FuseboxError(grpc.StatusCode.INTERNAL,
                               f"a ranged download ended {end - offset} bytes short")

    def result(self, output: OutputKind, bf16_output: Bf16Output) -> Any:
        self.meter.close()
        return decode(self.header.dtype, tuple(self.header.shape), self.buf, output=output,
                      bf16_output=bf16_output)


class DownloadAssembly:
    """Collects a Download's messages straight into the result's buffer (no list of chunks
    joined at the end, so the host holds the tensor once)."""

    def __init__(self, progress: Progress, label: str) -> None:
        self._progress = progress
        self._label = label
        self.header: Optional[pb.TensorInfo] = None
        self.buf: Optional[NDArray] = None
        self.filled = 0
        self.meter: Optional[Meter] = None

    def add(self, msg: pb.DownloadResponse) -> None:
        if self.header is None:
            if not msg.HasField("tensor"):
                raise FuseboxError(grpc.StatusCode.INTERNAL, "download carried no tensor header")
            self.header = msg.tensor
            n = element_bytes(msg.tensor.dtype)
            for d in msg.tensor.shape:
                n *= d
            self.buf = np.empty(n, dtype=np.uint8)
            self.meter = Meter(self._progress, n, self._label)
        assert self.buf is not None and self.meter is not None
        end = self.filled + len(msg.data)
        if end > len(self.buf):
            raise FuseboxError(grpc.StatusCode.INTERNAL, "download sent more bytes than its shape")
        self.buf[self.filled:end] = np.frombuffer(msg.data, dtype=np.uint8)
        self.filled = end
        self.meter.add(len(msg.data))

    def result(self, output: OutputKind, bf16_output: Bf16Output) -> Any:
        if self.meter is not None:
            self.meter.close()
        if self.header is None or self.buf is None:
            raise FuseboxError(grpc.StatusCode.INTERNAL, "download carried no tensor header")
        if self.filled != len(self.buf):
            raise FuseboxError(grpc.StatusCode.INTERNAL,
                               f"download ended after {self.filled} of {len(self.buf)} bytes")
        return decode(self.header.dtype, tuple(self.header.shape), self.buf, output=output,
                      bf16_output=bf16_output)


# --- op requests and replies -----------------------------------------------------------------

class Request:
    """An op request with what the call needs to know about it: the handles it names (for
    per-call metadata) and its inline bytes (for the message limit and error hints).

    The request is hand-encoded in ``body`` (see _wire): inline tensors stay references to
    the caller's arrays until ``serialize`` joins the pieces, the one copy of their bytes on
    this side of gRPC. A generated ``message`` given instead is sent as it is."""

    def __init__(self, method: str, message: Any = None) -> None:
        self.method = method
        self.message = message
        self.body = Pieces()
        self.handles: List[str] = []
        self.inline_bytes = 0

    def ref(self, x: Any, dtype: DTypeArg) -> Tuple[Pieces, Optional[int]]:
        """x as a TensorRef's pieces, and the wire dtype when it is inline."""
        if isinstance(x, SharedTensor):
            return message(pb.TensorRef(shared=x.message())), None
        if isinstance(x, (Handle, str)):
            hid = handle_id(x)
            self.handles.append(hid)
            return message(pb.TensorRef(handle=hid)), None
        w = to_wire(x, dtype)
        self.inline_bytes += w.nbytes
        return tensor_ref(w.dtype, w.shape, w.data()), int(w.dtype)

    def pieces(self) -> Pieces:
        return message(self.message) if self.message is not None else self.body

    def serialize(self) -> bytes:
        if self.message is not None:
            data: bytes = self.message.SerializeToString()
            return data
        return self.body.join()


def serialize_request(r: Request) -> bytes:
    """The op RPCs' request_serializer."""
    return r.serialize()


# The op RPCs: Requests in, OpReplies out (parse_op_response).
OP_METHODS = ("Gelu", "Softmax", "RowSum", "MatmulRelu")


REQUESTS: Dict[str, Any] = {
    "Gelu": (pb.GeluRequest, pb.GeluResponse),
    "Softmax": (pb.SoftmaxRequest, pb.SoftmaxResponse),
    "RowSum": (pb.RowSumRequest, pb.RowSumResponse),
    "MatmulRelu": (pb.MatmulReluRequest, pb.MatmulReluResponse),
    "FreeTensor": (pb.FreeTensorRequest, pb.FreeTensorResponse),
    "ListTensors": (pb.ListTensorsRequest, pb.ListTensorsResponse),
    "RegisterSharedMemory": (pb.RegisterSharedMemoryRequest, pb.RegisterSharedMemoryResponse),
    "UnregisterSharedMemory": (pb.UnregisterSharedMemoryRequest,
                               pb.UnregisterSharedMemoryResponse),
    "ListSharedMemory": (pb.ListSharedMemoryRequest, pb.ListSharedMemoryResponse),
    "CreateUpload": (pb.CreateUploadRequest, pb.CreateUploadResponse),
    "CommitUpload": (pb.CommitUploadRequest, pb.CommitUploadResponse),
    "AbortUpload": (pb.AbortUploadRequest, pb.AbortUploadResponse),
}

_IMPLS = {"default": 0, "cublaslt": 1, "tiled": 2}


def output_options(keep: bool, out: Optional["SharedOutput"]) -> pb.OutputOptions:
    if out is None:
        return pb.OutputOptions(keep_on_server=keep)
    return pb.OutputOptions(keep_on_server=keep,
                            shared=pb.SharedOutput(region=out.region, offset=out.offset))


# OutputOptions without a shared output, serialized: {} and {keep_on_server = 1: true}.
_KEEP_OPTIONS = {False: b"", True: b"\x08\x01"}


def unary_request(method: str, x: Any, dtype: DTypeArg, keep: bool,
                  out: Optional["SharedOutput"] = None) -> Request:
    """{input = 1, output_options = 15}, as GeluRequest, SoftmaxRequest and RowSumRequest
    are."""
    if method not in ("Gelu", "Softmax", "RowSum"):
        raise ValueError(f"{method} is not a one-input op")
    r = Request(method)
    ref, _ = r.ref(x, dtype)
    options = (Pieces().add(_KEEP_OPTIONS[bool(keep)]) if out is None
               else message(output_options(keep, out)))
    r.body.field(1, ref).field(15, options)
    return r


def matmul_request(a: Any, b: Any, bias: Any, dtype: DTypeArg, allow_tf32: bool,
                   impl: Union[int, str], keep: bool,
                   out: Optional["SharedOutput"] = None) -> Request:
    r = Request("MatmulRelu")
    ra, a_dtype = r.ref(a, dtype)
    want = dtype
    if want is None and a_dtype is not None:  # b and bias follow a's dtype
        want = dtype_name(a_dtype)
    impl_value = cast("pb.MatmulImpl", _IMPLS[impl] if isinstance(impl, str)
                      else int(impl))
    r.body.field(1, ra).field(2, r.ref(b, want)[0])
    if bias is not None:
        r.body.field(3, r.ref(bias, want)[0])
    # The rest (fields 4, 5 and 15) after a, b and bias, as protobuf orders them.
    r.body.add(pb.MatmulReluRequest(allow_tf32=allow_tf32, impl=impl_value,
                                    output_options=output_options(keep, out)
                                    ).SerializeToString())
    return r


# --- Execute: op calls on one stream ----------------------------------------------------------

# ExecuteRequest {uint64 id = 1; oneof op {gelu = 2; softmax = 3; row_sum = 4;
# matmul_relu = 5}}
_EXECUTE_FIELDS = {"gelu": 2, "softmax": 3, "rowsum": 4, "matmul_relu": 5}
_CODES = {c.value[0]: c for c in grpc.StatusCode}


@dataclass(frozen=True)
class StreamCall:
    """One op call for ``execute_many``: ``op`` is "gelu", "softmax", "rowsum" or
    "matmul_relu"; ``inputs`` what the op's method takes (x; or a, b and an optional bias), each
    an array, tensor or Handle; the other fields as the op's method has them."""
    op: str
    inputs: Tuple[Any, ...]
    dtype: DTypeArg = None
    keep: bool = False
    allow_tf32: bool = False
    impl: Union[int, str] = 0


@dataclass
class StreamResult:
    """One answer of ``execute_many``: the call's position in the calls given (``index``, its
    id on the stream), and its output (an array / tensor, or a Handle with keep=True) and
    timing, or its own error (``error`` set, ``value`` None): one failed call does not end the
    stream."""
    index: int
    value: Any
    timing: Optional[Timing]
    error: Optional[FuseboxError]


def execute_request(index: int, call: StreamCall) -> bytes:
    """The ExecuteRequest of call number ``index``, serialized (its inline tensors copied once,
    here); ValueError for an op it does not know."""
    field = _EXECUTE_FIELDS.get(call.op)
    if field is None:
        raise ValueError(f"unknown op {call.op!r}: gelu, softmax, rowsum or matmul_relu")
    if call.op == "matmul_relu":
        if len(call.inputs) not in (2, 3):
            raise ValueError("matmul_relu takes a, b and an optional bias")
        bias = call.inputs[2] if len(call.inputs) == 3 else None
        r = matmul_request(call.inputs[0], call.inputs[1], bias, call.dtype, call.allow_tf32,
                           call.impl, call.keep)
    else:
        if len(call.inputs) != 1:
            raise ValueError(f"{call.op} takes one input")
        r = unary_request({"gelu": "Gelu", "softmax": "Softmax", "rowsum": "RowSum"}[call.op],
                          call.inputs[0], call.dtype, call.keep)
    req = Pieces()
    if index:
        req.add(key(1, 0) + varint(index))
    return req.field(field, r.pieces()).join()


def stream_result(resp: pb.ExecuteResponse, rpc_us: float, freer: Freer, output: OutputKind,
                  bf16_output: Bf16Output, copy: bool = True) -> StreamResult:
    """An ExecuteResponse as a StreamResult; ``rpc_us`` runs from the call's send."""
    which = resp.WhichOneof("result")
    if which is None:
        return StreamResult(resp.id, None, None,
                            FuseboxError(grpc.StatusCode.INTERNAL, "the response has no result"))
    if which == "error":
        code = _CODES.get(resp.error.code, grpc.StatusCode.UNKNOWN)
        return StreamResult(resp.id, None, None, FuseboxError(code, resp.error.message))
    value, timing = op_result(getattr(resp, which), rpc_us, freer, output, bf16_output, True,
                              copy)
    return StreamResult(resp.id, value, timing, None)


def op_result(resp: Any, rpc_us: float, freer: Freer, output: OutputKind,
              bf16_output: Bf16Output, return_timing: bool, copy: bool = True) -> Any:
    """An op's reply (an OpReply, or a generated op response) as what the caller asked for: an
    array / tensor, or an owned Handle; with its Timing when return_timing. copy=False: a numpy
    result is a read-only view of the received bytes (see decode)."""
    r = resp if isinstance(resp, OpReply) else OpReply.from_message(resp)
    out: Any
    if r.kind == "handle":
        out = Handle(r.handle, _freer=freer)
    elif r.kind == "shared" and r.shared is not None:
        out = SharedTensor.from_message(r.shared)
    elif r.kind == "tensor":
        out = decode(r.dtype, r.shape, r.data, output=output, bf16_output=bf16_output, copy=copy)
    else:
        raise FuseboxError(grpc.StatusCode.INTERNAL, "response has no output")
    if not return_timing:
        return out
    t = r.timing
    return out, Timing(queue_us=t.queue_us, copy_in_us=t.copy_in_us, kernel_us=t.kernel_us,
                       copy_out_us=t.copy_out_us, total_us=t.total_us, backend=t.backend,
                       device=t.device, stream=t.stream, rpc_us=rpc_us, launch_us=t.launch_us)


REPLICA_HEADER = "fusebox-replica"


def replica_of(handle: object) -> Optional[str]:
    """The replica a handle names ("<replica>.<random>"); None for arrays and bare handles."""
    if isinstance(handle, Handle):
        handle = handle.id
    if not isinstance(handle, str):
        return None
    replica, dot, _ = handle.partition(".")
    return replica if dot and replica else None


def call_metadata(base: Metadata, handles: Sequence[str]) -> Optional[Metadata]:
    """The metadata of one call: the token, plus anything a call that names ``handles`` needs
    (the one place per-call headers are added): the replica of the first handle that names
    one, as ``fusebox-replica``, which a proxy (deploy/proxy) routes on."""
    replica = next((r for r in map(replica_of, handles) if r), None)
    if replica is None:
        return base or None
    return base + ((REPLICA_HEADER, replica),)


def now() -> float:
    return time.perf_counter()


# --- grpc.health.v1, hand-encoded (no grpcio-health-checking dependency) ---------------------

HEALTH = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
HEALTH_METHOD = "/grpc.health.v1.Health/Check"


def health_request(service: str) -> bytes:
    svc = service.encode()
    return (b"\x0a" + varint(len(svc)) + svc) if svc else b""


def health_status(buf: bytes) -> str:
    """Reads field 1 (varint) of a HealthCheckResponse; UNKNOWN when absent."""
    i, value = 0, 0

    def read_varint() -> int:
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
        key = read_varint()
        wire = key & 7
        if wire == 0:
            v = read_varint()
            if key >> 3 == 1:
                value = v
        elif wire == 2:
            i += read_varint()
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError("cannot parse health response")
    return HEALTH.get(value, "UNKNOWN")


def identity(b: bytes) -> bytes:
    return b


# --- shared memory ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SharedTensor:
    """A tensor in a shared-memory region registered with the server (``register_shared_memory``):
    ``region`` is the name it was registered under, the bytes start at ``offset``. Pass it
    wherever an input goes, and to ``upload``; ops that write into a region return one."""
    region: str
    offset: int
    dtype: str  # "float32", "float16" or "bfloat16"
    shape: Tuple[int, ...]

    def message(self) -> pb.SharedTensor:
        return pb.SharedTensor(region=self.region, offset=self.offset,
                               dtype=cast("pb.DType", DTYPE_VALUES[self.dtype]),
                               shape=list(self.shape))

    @staticmethod
    def from_message(m: pb.SharedTensor) -> "SharedTensor":
        return SharedTensor(m.region, int(m.offset), dtype_name(m.dtype),
                            tuple(int(d) for d in m.shape))

    @property
    def nbytes(self) -> int:
        n = element_bytes(DTYPE_VALUES[self.dtype])
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class SharedOutput:
    """Where an op writes its output: a registered region and a byte offset in it."""
    region: str
    offset: int = 0


@dataclass(frozen=True)
class SharedMemoryInfo:
    """A registered region as the server describes it. kind: "system" (POSIX shared memory:
    key, offset into the object) or "cuda" (an IPC handle: device)."""
    name: str
    kind: str
    size: int
    key: str = ""
    offset: int = 0
    device: int = 0
    pinned: bool = False
    registered_unix_ms: int = 0
    last_used_unix_ms: int = 0


DTYPE_VALUES = {"float32": 1, "float16": 2, "bfloat16": 3}


def shared_memory_info(m: pb.SharedMemoryInfo) -> SharedMemoryInfo:
    if m.HasField("cuda"):
        return SharedMemoryInfo(m.name, "cuda", int(m.cuda.size), device=int(m.cuda.device),
                                registered_unix_ms=int(m.registered_unix_ms),
                                last_used_unix_ms=int(m.last_used_unix_ms))
    return SharedMemoryInfo(m.name, "system", int(m.system.size), key=m.system.key,
                            offset=int(m.system.offset), pinned=m.pinned,
                            registered_unix_ms=int(m.registered_unix_ms),
                            last_used_unix_ms=int(m.last_used_unix_ms))


def register_request(name: str, key: str, offset: int, size: int
                     ) -> pb.RegisterSharedMemoryRequest:
    return pb.RegisterSharedMemoryRequest(
        name=name, system=pb.SystemSharedMemory(key=key, offset=offset, size=size))


def register_ipc_request(name: str, ipc_handle: bytes, device: int, size: int
                         ) -> pb.RegisterSharedMemoryRequest:
    return pb.RegisterSharedMemoryRequest(
        name=name, cuda=pb.CudaSharedMemory(ipc_handle=ipc_handle, device=device, size=size))


def shared_upload_messages(t: SharedTensor) -> Iterator[bytes]:
    """An upload whose bytes the server reads from a region: one message, no data."""
    yield pb.UploadRequest(shared=t.message()).SerializeToString()


def shared_key(region: Any, offset: int, size: Optional[int]) -> Tuple[str, int]:
    """The key and size to register for a SharedMemoryRegion (or a key string)."""
    if isinstance(region, str):
        if size is None:
            raise ValueError("size is needed when the region is given by its key")
        return region, size
    total = int(region.size)
    return str(region.key), total - offset if size is None else size


def shared_op_request(op: str, inputs: Sequence[Any], out: SharedOutput, allow_tf32: bool,
                      impl: Union[int, str]) -> Request:
    if op == "MatmulRelu":
        if len(inputs) not in (2, 3):
            raise ValueError("MatmulRelu takes a, b and an optional bias")
        bias = inputs[2] if len(inputs) == 3 else None
        return matmul_request(inputs[0], inputs[1], bias, None, allow_tf32, impl, False, out)
    if op not in ("Gelu", "Softmax", "RowSum") or len(inputs) != 1:
        raise ValueError(f"{op}: Gelu, Softmax and RowSum take one input; MatmulRelu two or three")
    return unary_request(op, inputs[0], None, False, out)
