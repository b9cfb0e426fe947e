"""fusebox's synchronous Python client: numpy arrays, torch tensors or anything with
``__dlpack__`` in; numpy arrays (or torch tensors with ``output="torch"``) out, over gRPC.
``fusebox_client.aio.AsyncClient`` is the same surface for asyncio.

dtypes: float32 and float16 map directly to FLOAT32 / FLOAT16; bfloat16 comes from torch
tensors, ml_dtypes arrays, or ``dtype="bfloat16"`` (float input rounded on the client, to
nearest even; uint16 taken as raw bit patterns). A bfloat16 result comes back as float32
(exact widening), uint16 bits (``bf16_output="bits"``), ml_dtypes' bfloat16
(``bf16_output="bfloat16"``), or torch.bfloat16 with ``output="torch"``. float64 input
with no dtype is narrowed to float32.

Tensors can stay on the server: ``upload`` returns a Handle, any op accepts a Handle (or its id
as a string) in place of an array, and ``keep=True`` makes an op return a Handle to its output.
Handles this client creates free their tensors when they leave a ``with`` block, are garbage
collected, or their client closes (``Handle.release()`` keeps one).

Settings not given come from $FUSEBOX_SERVER (else localhost:50051), $FUSEBOX_TOKEN,
$FUSEBOX_TLS_CA, $FUSEBOX_TLS_CERT and $FUSEBOX_TLS_KEY. ``unix:/path`` targets work.

Several replicas: a handle starts with the id of the replica that holds it
("<replica>.<random>"), and every call naming one sends the header ``fusebox-replica:
<replica>``, which a proxy (deploy/proxy) routes on. Without a proxy, ``Router([...targets])``
keeps one Client per replica and sends each call naming a handle to the replica holding it, the
rest in turn.
"""
from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import (TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Literal, Optional, Set,
                    Tuple, Union, cast, overload)

import grpc

from fusebox.v1 import kernel_service_pb2 as pb

from ._common import (call_metadata, check_inline, credentials, DEFAULT_CHUNK_BYTES,
                      DEFAULT_CONNECTIONS, DownloadAssembly, execute_request, Freer, FuseboxError,
                      Handle, handle_id, HandleLike, health_request, health_status, identity,
                      matmul_request, Meter, now, op_result, PARALLEL_MIN_BYTES, Pem, Progress,
                      RANGE_BYTES, RangedAssembly, RangeQueue, register_ipc_request,
                      register_request, replica_of, Request, rpc_error, SERVICE, shared_key,
                      shared_memory_info, shared_op_request, shared_upload_messages,
                      SharedMemoryInfo, SharedOutput, SharedTensor, stream_result, StreamCall,
                      StreamResult, tensor_info, TensorInfo, Timing, transfer_channel_options,
                      unary_request, upload_messages, write_messages)
from ._base import ClientBase
from .shm import RegisteredRegion, SharedMemoryRegion
from ._native import NATIVE_MIN_BYTES, native_op, NativeCallError, use_native
from ._tensors import Bf16Output, DTypeArg, NDArray, OutputKind, Wire, to_wire

if TYPE_CHECKING:  # torch is optional; without it mypy sees its types as Any
    import torch  # type: ignore[import-not-found, unused-ignore]

TensorLike = Any
"""An input: a numpy array (or anything np.asarray takes), a torch tensor, an object with
``__dlpack__``, or a Handle / handle id string naming a tensor the server holds."""


class Client(ClientBase[grpc.Channel]):
    """A connection to one fusebox server. Thread-safe; use as a context manager."""

    def __init__(self, target: Optional[str] = None, timeout: float = 60.0,
                 max_message_bytes: int = -1, token: Optional[str] = None, *, tls: bool = False,
                 root_certificates: Optional[Pem] = None, certificate_chain: Optional[Pem] = None,
                 private_key: Optional[Pem] = None, server_name: Optional[str] = None,
                 progress: Progress = None, connections: int = DEFAULT_CONNECTIONS,
                 parallel_min_bytes: int = PARALLEL_MIN_BYTES,
                 range_bytes: int = RANGE_BYTES, copy_results: bool = True,
                 keep_freed_memory: bool = True, native: Optional[bool] = None,
                 native_min_bytes: int = NATIVE_MIN_BYTES) -> None:
        """target: "host:port", "unix:/path" (default $FUSEBOX_SERVER, else localhost:50051);
        timeout: each call's deadline in seconds; max_message_bytes: this side's limit on one
        message (-1: none but protobuf's 2 GiB); token: bearer token for a server started with
        a token file (default $FUSEBOX_TOKEN).

        TLS is off unless ``tls=True`` or a PEM below is given (or $FUSEBOX_TLS_CA,
        $FUSEBOX_TLS_CERT, $FUSEBOX_TLS_KEY). Each PEM is bytes (its contents) or a str /
        path-like (a file to read): root_certificates, the CA(s) that sign the server's
        certificate (None: gRPC's default roots); certificate_chain and private_key, the
        client's certificate and key for mTLS, both or neither. server_name: the name the
        server's certificate carries when it is not the target's host.

        progress: for uploads and downloads, None shows a tqdm bar on stderr (when tqdm is
        installed) once a transfer has taken a second; False shows none; a callable is called
        with (bytes done, bytes in all) after every chunk. Each transfer can override it.

        Parallel transfers: an upload or download of at least parallel_min_bytes goes as byte
        ranges of range_bytes on `connections` connections at once (this client's channel and
        others opened for transfers on first use); connections=1: one stream, always.

        copy_results: an op's numpy result is copied out of the received message into a
        writable array (True), or is a read-only view of the message's bytes, with no copy
        (False: one copy fewer; the view may not be aligned to its dtype). torch
        results (output="torch") and bfloat16 widened to float32 are new memory either way.

        keep_freed_memory: on first use, let this process's malloc keep up to 1 GiB of freed
        memory and serve large blocks from its heap, so large calls do not fault in fresh
        pages for every buffer (process-wide; fusebox_client.keep_freed_memory says more;
        $FUSEBOX_KEEP_FREED_MEMORY=0 also turns it off).

        native: an op call with at least native_min_bytes of inline tensors goes through the
        native transport (libfusebox_native, the C++ client under this one: no copy of the
        request, one of the reply, into an aligned writable array), where grpcio would copy
        each several times; same messages, errors and results. None: when the library is
        there (a CMake build puts it next to this package; a pip-only install has none;
        $FUSEBOX_NATIVE=0 turns it off); True: it must be; False: grpcio always."""
        super().__init__(target, timeout, max_message_bytes, token, tls, root_certificates,
                         certificate_chain, private_key, server_name, progress, connections,
                         parallel_min_bytes, range_bytes, copy_results, keep_freed_memory,
                         native, native_min_bytes)
        self._transfer_lock = threading.Lock()
        self._pending: "Set[grpc.Future[Any]]" = set()
        self._pending_lock = threading.Lock()
        self._freer = Freer(self._free_later, self._free_now)

    def _new_channel(self, options: List[Tuple[str, Any]]) -> grpc.Channel:
        if self._settings.tls:
            return grpc.secure_channel(self._settings.target, credentials(self._settings),
                                       options=options)
        return grpc.insecure_channel(self._settings.target, options=options)

    def _channels(self, n: int) -> List[grpc.Channel]:
        """n channels for a parallel transfer: this client's own, then ones made (once) for
        transfers, each a connection of its own."""
        with self._transfer_lock:
            while len(self._transfer_channels) < n - 1:
                i = len(self._transfer_channels)
                self._transfer_channels.append(
                    self._new_channel(transfer_channel_options(self._options, i)))
            return [self.channel] + self._transfer_channels[:n - 1]

    def close(self) -> None:
        """Frees the tensors of the handles this client still owns, then closes the channel."""
        with self._pending_lock:
            pending = list(self._pending)
        for future in pending:  # frees already on their way finish first
            try:
                future.result(timeout=5)
            except Exception:
                pass
        for h in self._freer.take_live():
            try:
                self._unary["FreeTensor"](pb.FreeTensorRequest(handle=h.id), timeout=5,
                                          metadata=call_metadata(self._metadata, [h.id]))
            except grpc.RpcError:
                pass
        self._freer.closed = True
        self.channel.close()
        for ch in self._transfer_channels:
            ch.close()
        if self._native is not None:
            self._native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _free_now(self, handle: str) -> None:
        self._unary["FreeTensor"](pb.FreeTensorRequest(handle=handle), timeout=10,
                                  metadata=call_metadata(self._metadata, [handle]))

    def _free_later(self, handle: str) -> None:
        """A finaliser's free: sent without waiting for the reply. The call's future is kept
        until it is done: gRPC cancels a call whose future is garbage collected."""
        future = self._unary["FreeTensor"].future(
            pb.FreeTensorRequest(handle=handle), timeout=10,
            metadata=call_metadata(self._metadata, [handle]))
        with self._pending_lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: "grpc.Future[Any]") -> None:
        with self._pending_lock:
            self._pending.discard(future)

    def wait_for_ready(self, timeout: float = 10.0) -> bool:
        """True when the channel connects within timeout seconds."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
            return True
        except grpc.FutureTimeoutError:
            return False

    def health(self, service: str = "", timeout: float = 5.0) -> str:
        """grpc.health.v1 Check: 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN' or 'UNKNOWN'."""
        try:
            resp: bytes = self._health(health_request(service), timeout=timeout,
                                       metadata=call_metadata(self._metadata, []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return health_status(resp)

    # --- ops -------------------------------------------------------------------------------

    @overload
    def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
             output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
             return_timing: Literal[False] = False, timeout: Optional[float] = None) -> NDArray: ...
    @overload
    def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
             output: Literal["torch"], bf16_output: Bf16Output = "float32",
             return_timing: Literal[False] = False,
             timeout: Optional[float] = None) -> "torch.Tensor": ...
    @overload
    def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[True],
             output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
             return_timing: Literal[False] = False, timeout: Optional[float] = None) -> Handle: ...
    @overload
    def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
             output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
             return_timing: Literal[True],
             timeout: Optional[float] = None) -> Tuple[NDArray, Timing]: ...
    @overload
    def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
             output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
             return_timing: bool = False, timeout: Optional[float] = None) -> Any: ...
    def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
             output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
             return_timing: bool = False, timeout: Optional[float] = None) -> Any:
        """Tanh-form GeLU of x, elementwise, any shape."""
        return self._op(unary_request("Gelu", x, dtype, keep), timeout, output, bf16_output,
                       return_timing)

    @overload
    def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                return_timing: Literal[False] = False,
                timeout: Optional[float] = None) -> NDArray: ...
    @overload
    def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                output: Literal["torch"], bf16_output: Bf16Output = "float32",
                return_timing: Literal[False] = False,
                timeout: Optional[float] = None) -> "torch.Tensor": ...
    @overload
    def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[True],
                output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                return_timing: Literal[False] = False,
                timeout: Optional[float] = None) -> Handle: ...
    @overload
    def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                return_timing: Literal[True],
                timeout: Optional[float] = None) -> Tuple[NDArray, Timing]: ...
    @overload
    def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
                output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                return_timing: bool = False, timeout: Optional[float] = None) -> Any: ...
    def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
                output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                return_timing: bool = False, timeout: Optional[float] = None) -> Any:
        """Softmax over the last axis (rank >= 1)."""
        return self._op(unary_request("Softmax", x, dtype, keep), timeout, output, bf16_output,
                       return_timing)

    @overload
    def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
               output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
               return_timing: Literal[False] = False,
               timeout: Optional[float] = None) -> NDArray: ...
    @overload
    def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
               output: Literal["torch"], bf16_output: Bf16Output = "float32",
               return_timing: Literal[False] = False,
               timeout: Optional[float] = None) -> "torch.Tensor": ...
    @overload
    def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[True],
               output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
               return_timing: Literal[False] = False,
               timeout: Optional[float] = None) -> Handle: ...
    @overload
    def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
               output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
               return_timing: Literal[True],
               timeout: Optional[float] = None) -> Tuple[NDArray, Timing]: ...
    @overload
    def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
               output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
               return_timing: bool = False, timeout: Optional[float] = None) -> Any: ...
    def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
               output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
               return_timing: bool = False, timeout: Optional[float] = None) -> Any:
        """Sum over the last axis (rank >= 1); the result is float32."""
        return self._op(unary_request("RowSum", x, dtype, keep), timeout, output, bf16_output,
                       return_timing)

    @overload
    def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                    dtype: DTypeArg = None, allow_tf32: bool = False, impl: Union[int, str] = 0,
                    keep: Literal[False] = False, output: Literal["numpy"] = "numpy",
                    bf16_output: Bf16Output = "float32", return_timing: Literal[False] = False,
                    timeout: Optional[float] = None) -> NDArray: ...
    @overload
    def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                    dtype: DTypeArg = None, allow_tf32: bool = False, impl: Union[int, str] = 0,
                    keep: Literal[False] = False, output: Literal["torch"],
                    bf16_output: Bf16Output = "float32", return_timing: Literal[False] = False,
                    timeout: Optional[float] = None) -> "torch.Tensor": ...
    @overload
    def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                    dtype: DTypeArg = None, allow_tf32: bool = False, impl: Union[int, str] = 0,
                    keep: Literal[True], output: OutputKind = "numpy",
                    bf16_output: Bf16Output = "float32", return_timing: Literal[False] = False,
                    timeout: Optional[float] = None) -> Handle: ...
    @overload
    def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                    dtype: DTypeArg = None, allow_tf32: bool = False, impl: Union[int, str] = 0,
                    keep: Literal[False] = False, output: Literal["numpy"] = "numpy",
                    bf16_output: Bf16Output = "float32", return_timing: Literal[True],
                    timeout: Optional[float] = None) -> Tuple[NDArray, Timing]: ...
    @overload
    def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                    dtype: DTypeArg = None, allow_tf32: bool = False, impl: Union[int, str] = 0,
                    keep: bool = False, output: OutputKind = "numpy",
                    bf16_output: Bf16Output = "float32", return_timing: bool = False,
                    timeout: Optional[float] = None) -> Any: ...
    def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                    dtype: DTypeArg = None, allow_tf32: bool = False, impl: Union[int, str] = 0,
                    keep: bool = False, output: OutputKind = "numpy",
                    bf16_output: Bf16Output = "float32", return_timing: bool = False,
                    timeout: Optional[float] = None) -> Any:
        """relu(a @ b + bias): a [M,K], b [K,N], bias [N] or None (inputs or handles), one
        dtype for all: a's unless ``dtype`` says. ``impl``: "default", "cublaslt" or "tiled" (the
        GPU's; the CPU ignores it); ``allow_tf32`` lets float32 use TF32 tensor cores on the GPU."""
        return self._op(matmul_request(a, b, bias, dtype, allow_tf32, impl, keep), timeout,
                       output, bf16_output, return_timing)


    def _op(self, req: Request, timeout: Optional[float], output: OutputKind,
            bf16_output: Bf16Output, return_timing: bool) -> Any:
        check_inline(req.inline_bytes, self._max_message_bytes)
        start = now()
        try:
            if self._native is not None and use_native(req, self.native_min_bytes):
                resp = native_op(self._native, req, self._deadline(timeout))
            else:
                resp = self._ops[req.method](req, timeout=self._deadline(timeout),
                                               metadata=call_metadata(self._metadata, req.handles))
        except (grpc.RpcError, NativeCallError) as e:
            raise rpc_error(e, req.inline_bytes) from None
        return op_result(resp, (now() - start) * 1e6, self._freer, output, bf16_output,
                         return_timing, self.copy_results)

    def execute_many(self, calls: Iterable[StreamCall], *, window: int = 64,
                     output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                     timeout: Optional[float] = None) -> Iterator[StreamResult]:
        """Runs many op calls over one Execute stream and yields a StreamResult per call as
        the server answers: in the order the ops finish, not the order given (``index`` says
        which call). At most ``window`` calls are unanswered at once; the calls are taken from
        the iterable (and converted) only as the window allows. A failed call yields its error
        and the stream goes on; a stream that ends early (the server shutting down,
        UNAUTHENTICATED, ``timeout`` seconds for the whole stream passing; None: no deadline)
        raises FuseboxError after the answers that came, and the calls without one were not
        run. Leaving the loop early cancels the stream."""
        if window < 1:
            raise ValueError("window must be at least 1")
        room = threading.Semaphore(window)
        sent_at: Dict[int, float] = {}
        failure: List[BaseException] = []
        stop = threading.Event()

        def requests() -> Iterator[bytes]:
            try:
                for index, call in enumerate(calls):
                    while not room.acquire(timeout=0.1):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    req = execute_request(index, call)
                    sent_at[index] = now()
                    yield req
            except Exception as e:  # gRPC's thread would swallow it: hand it to the caller
                failure.append(e)

        stream = self._execute(requests(), timeout=timeout, metadata=self._metadata or None)
        try:
            for resp in stream:
                room.release()
                start = sent_at.pop(resp.id, None)
                rpc_us = (now() - start) * 1e6 if start is not None else 0.0
                yield stream_result(resp, rpc_us, self._freer, output, bf16_output,
                                    self.copy_results)
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            stop.set()
            stream.cancel()  # a no-op once the stream has ended
        if failure:
            raise failure[0]

    # --- tensors held by the server --------------------------------------------------------

    def upload(self, x: TensorLike, *, dtype: DTypeArg = None,
               chunk_bytes: int = DEFAULT_CHUNK_BYTES, timeout: Optional[float] = None,
               progress: Progress = None) -> Handle:
        """Streams x to the server in chunks; returns a Handle that owns the tensor. One of at
        least parallel_min_bytes goes as ranges on several connections (see __init__). A
        SharedTensor is read by the server from its region instead."""
        if isinstance(x, SharedTensor):
            try:
                resp = self._upload(shared_upload_messages(x), timeout=self._deadline(timeout),
                                    metadata=call_metadata(self._metadata, []))
            except grpc.RpcError as e:
                raise rpc_error(e) from None
            return Handle(resp.tensor.handle, _freer=self._freer)
        w = to_wire(x, dtype)
        meter = Meter(self.progress if progress is None else progress, w.nbytes, "upload")
        if self.connections > 1 and w.nbytes >= self.parallel_min_bytes:
            try:
                return self._upload_ranged(w, meter, self._deadline(timeout))
            finally:
                meter.close()
        try:
            resp = self._upload(upload_messages(w, chunk_bytes, meter),
                                timeout=self._deadline(timeout),
                                metadata=call_metadata(self._metadata, []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            meter.close()
        return Handle(resp.tensor.handle, _freer=self._freer)

    @overload
    def download(self, handle: HandleLike, *, output: Literal["numpy"] = "numpy",
                 bf16_output: Bf16Output = "float32", timeout: Optional[float] = None,
                 progress: Progress = None, chunk_bytes: int = 0) -> NDArray: ...
    @overload
    def download(self, handle: HandleLike, *, output: Literal["torch"],
                 bf16_output: Bf16Output = "float32", timeout: Optional[float] = None,
                 progress: Progress = None, chunk_bytes: int = 0) -> "torch.Tensor": ...
    def download(self, handle: HandleLike, *, output: OutputKind = "numpy",
                 bf16_output: Bf16Output = "float32", timeout: Optional[float] = None,
                 progress: Progress = None, chunk_bytes: int = 0) -> Any:
        """Fetches a held tensor (bfloat16 as the ops return it); it stays on the server.
        chunk_bytes: bytes per message (0: the server's default, which fits gRPC's 4 MiB)."""
        hid = handle_id(handle)
        if self.connections > 1:  # the size decides: one small call, against a large transfer
            info = self._stat(hid)
            if info.size_bytes >= self.parallel_min_bytes:
                return self._download_ranged(info, self.progress if progress is None
                                             else progress, self._deadline(timeout),
                                             chunk_bytes).result(output, bf16_output)
        asm = DownloadAssembly(self.progress if progress is None else progress, "download")
        try:
            for msg in self._download(pb.DownloadRequest(handle=hid, chunk_bytes=chunk_bytes),
                                      timeout=self._deadline(timeout),
                                      metadata=call_metadata(self._metadata, [hid])):
                asm.add(msg)
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            if asm.meter is not None:
                asm.meter.close()
        return asm.result(output, bf16_output)

    def _stat(self, hid: str) -> pb.TensorInfo:
        try:
            r = self._unary["ListTensors"](pb.ListTensorsRequest(handle=hid), timeout=self.timeout,
                                           metadata=call_metadata(self._metadata, [hid]))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        if len(r.tensors) != 1:
            raise FuseboxError(grpc.StatusCode.NOT_FOUND, f"no tensor {hid}")
        info: pb.TensorInfo = r.tensors[0]
        return info

    def _upload_ranged(self, w: Wire, meter: Meter, timeout: float) -> Handle:
        """CreateUpload, then one WriteUpload stream per connection taking ranges in turn, then
        CommitUpload; on any failure the upload is aborted (nothing left behind)."""
        try:
            created = self._unary["CreateUpload"](
                pb.CreateUploadRequest(dtype=w.dtype, shape=list(w.shape)), timeout=timeout,
                metadata=call_metadata(self._metadata, []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        uid = created.upload_id
        md = call_metadata(self._metadata, [uid])
        ranges = RangeQueue(w.nbytes, self.range_bytes)
        channels = self._channels(max(1, min(self.connections, ranges.count())))

        def stream(channel: grpc.Channel) -> None:
            write = channel.stream_unary(
                SERVICE + "WriteUpload",
                request_serializer=identity,
                response_deserializer=pb.WriteUploadResponse.FromString)
            first = ranges.take()
            if first is None:  # the other streams took every range: open none
                return
            try:
                write(write_messages(uid, w, ranges, meter, first), timeout=timeout,
                      metadata=md, wait_for_ready=channel is not self.channel)
            except BaseException:
                ranges.stop()  # the other streams end at their next range
                raise

        try:
            with ThreadPoolExecutor(len(channels)) as pool:
                for f in [pool.submit(stream, ch) for ch in channels]:
                    f.result()
            resp = self._unary["CommitUpload"](pb.CommitUploadRequest(upload_id=uid),
                                               timeout=timeout, metadata=md)
        except BaseException as e:
            try:  # the reservation back now, not after the server's idle timeout
                self._unary["AbortUpload"](pb.AbortUploadRequest(upload_id=uid), timeout=10,
                                           metadata=md)
            except grpc.RpcError:
                pass
            if isinstance(e, grpc.RpcError):
                raise rpc_error(e) from None
            raise
        return Handle(resp.tensor.handle, _freer=self._freer)

    def _download_ranged(self, info: pb.TensorInfo, progress: Progress, timeout: float,
                         chunk_bytes: int) -> RangedAssembly:
        """One ranged Download at a time per connection, each written into place. As for
        uploads, a call on a connection opened for transfers waits for it to connect (within
        its deadline): one fresh connection failing its first attempt does not fail it all."""
        asm = RangedAssembly(info, progress, "download")
        ranges = RangeQueue(int(info.size_bytes), self.range_bytes)
        channels = self._channels(max(1, min(self.connections, ranges.count())))
        md = call_metadata(self._metadata, [info.handle])

        def fetch(channel: grpc.Channel) -> None:
            download = channel.unary_stream(
                SERVICE + "Download", request_serializer=pb.DownloadRequest.SerializeToString,
                response_deserializer=pb.DownloadResponse.FromString)
            try:
                while True:
                    r = ranges.take()
                    if r is None:
                        return
                    asm.put(r[0], r[1], download(
                        pb.DownloadRequest(handle=info.handle, offset=r[0], length=r[1] - r[0],
                                           chunk_bytes=chunk_bytes),
                        timeout=timeout, metadata=md,
                        wait_for_ready=channel is not self.channel))
            except BaseException:
                ranges.stop()
                raise

        try:
            with ThreadPoolExecutor(len(channels)) as pool:
                for f in [pool.submit(fetch, ch) for ch in channels]:
                    f.result()
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            asm.meter.close()
        return asm

    def free(self, handle: HandleLike) -> int:
        """Frees a held tensor now; returns the bytes freed. A Handle stops owning it."""
        if isinstance(handle, Handle):
            handle.release()
        hid = handle_id(handle)
        try:
            resp = self._unary["FreeTensor"](pb.FreeTensorRequest(handle=hid),
                                             timeout=self.timeout,
                                             metadata=call_metadata(self._metadata, [hid]))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return int(resp.freed_bytes)

    def list_tensors(self, handle: Optional[HandleLike] = None
                     ) -> Tuple[List[TensorInfo], int, int]:
        """This caller's held tensors (or only ``handle``'s): (infos, used_bytes, quota_bytes).
        The listed Handles do not own their tensors."""
        hid = "" if handle is None else handle_id(handle)
        try:
            r = self._unary["ListTensors"](pb.ListTensorsRequest(handle=hid), timeout=self.timeout,
                                           metadata=call_metadata(self._metadata,
                                                                  [hid] if hid else []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return [tensor_info(t) for t in r.tensors], int(r.used_bytes), int(r.quota_bytes)

    # --- shared memory (same node; the server needs --allow_shared_memory) ------------------

    def register_shared_memory(self, name: str, region: Union[SharedMemoryRegion, str], *,
                               offset: int = 0, size: Optional[int] = None) -> SharedMemoryInfo:
        """Registers [offset, offset + size) of a POSIX shared-memory object (a
        SharedMemoryRegion, or its key "/name") under ``name``; size defaults to the rest of
        the region."""
        key, size = shared_key(region, offset, size)
        return shared_memory_info(self._call("RegisterSharedMemory",
                                             register_request(name, key, offset, size)).region)

    def register_cuda_ipc(self, name: str, ipc_handle: bytes, device: int, size: int
                          ) -> SharedMemoryInfo:
        """Registers device memory exported with cudaIpcGetMemHandle (CUDA backend only)."""
        return shared_memory_info(self._call(
            "RegisterSharedMemory", register_ipc_request(name, ipc_handle, device, size)).region)

    def unregister_shared_memory(self, name: str) -> None:
        self._call("UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest(name=name))

    def list_shared_memory(self, name: Optional[str] = None
                           ) -> Tuple[List[SharedMemoryInfo], int, int]:
        """This caller's regions (or only ``name``): (infos, used_bytes, quota_bytes)."""
        r = self._call("ListSharedMemory", pb.ListSharedMemoryRequest(name=name or ""))
        return [shared_memory_info(m) for m in r.regions], int(r.used_bytes), int(r.quota_bytes)

    def shared_memory(self, name: str, region: Union[SharedMemoryRegion, str], *,
                      offset: int = 0, size: Optional[int] = None) -> RegisteredRegion:
        """register_shared_memory, as a RegisteredRegion that unregisters at the end of a with."""
        info = self.register_shared_memory(name, region, offset=offset, size=size)

        def unregister() -> None:
            try:
                self.unregister_shared_memory(name)
            except FuseboxError as e:  # expired, or unregistered already
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise
        return RegisteredRegion(name, info.size, unregister)

    def run_shared(self, op: str, *inputs: TensorLike, out: SharedOutput,
                   allow_tf32: bool = False, impl: Union[int, str] = "default",
                   timeout: Optional[float] = None) -> Tuple[SharedTensor, Timing]:
        """Runs op ("Gelu", "Softmax", "RowSum", "MatmulRelu") with its output written into a
        registered region; inputs may be SharedTensors, arrays or handles. Returns where the
        output is, and the call's timing."""
        req = shared_op_request(op, inputs, out, allow_tf32, impl)
        res = self._op(req, timeout, "numpy", "float32", True)
        return cast(Tuple[SharedTensor, Timing], res)

    def _call(self, method: str, msg: Any) -> Any:
        try:
            return self._unary[method](msg, timeout=self.timeout,
                                       metadata=call_metadata(self._metadata, []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None


__all__ = ["Client", "FuseboxError", "Handle", "TensorInfo", "Timing", "TensorLike"]


class Router:
    """Several replicas without a proxy: one Client per target. A call naming a handle goes to
    the replica whose id the handle starts with; other calls (uploads, inline ops) go to the
    targets in turn. Replica ids are learned from the handles each target mints, or given:
    ``Router({"fusebox-0": "fusebox-0.fusebox-pods:50051", ...})``. Keyword arguments are
    Client's (token, TLS, timeout). A handle of a replica no target is known for is NOT_FOUND,
    as is one whose replica is gone. Thread-safe; use as a context manager."""

    def __init__(self, targets: Union[Iterable[str], Dict[str, str]], **client_kwargs: Any) -> None:
        named = dict(targets) if isinstance(targets, dict) else {}
        addresses = list(named.values()) if named else list(targets)
        if not addresses:
            raise ValueError("Router needs at least one target")
        self.clients = [Client(t, **client_kwargs) for t in addresses]
        self._by_replica = {r: self.clients[i] for i, r in enumerate(named)}
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client_for(self, *refs: object) -> Client:
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

    def _learn(self, client: Client, out: Any) -> Any:
        held = out[0] if isinstance(out, tuple) else out  # (out, timing) with return_timing
        replica = replica_of(held) if isinstance(held, Handle) else None
        if replica:
            with self._lock:
                self._by_replica.setdefault(replica, client)
        return out

    def gelu(self, x: TensorLike, **kw: Any) -> Any:
        c = self.client_for(x)
        return self._learn(c, c.gelu(x, **kw))

    def softmax(self, x: TensorLike, **kw: Any) -> Any:
        c = self.client_for(x)
        return self._learn(c, c.softmax(x, **kw))

    def rowsum(self, x: TensorLike, **kw: Any) -> Any:
        c = self.client_for(x)
        return self._learn(c, c.rowsum(x, **kw))

    def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None,
                    **kw: Any) -> Any:
        c = self.client_for(a, b, bias)
        return self._learn(c, c.matmul_relu(a, b, bias, **kw))

    def upload(self, x: TensorLike, **kw: Any) -> Handle:
        c = self.client_for()
        out: Handle = self._learn(c, c.upload(x, **kw))
        return out

    def download(self, handle: HandleLike, **kw: Any) -> Any:
        return self.client_for(handle).download(handle, **kw)

    def free(self, handle: HandleLike) -> int:
        return self.client_for(handle).free(handle)

    def list_tensors(self) -> Tuple[List[TensorInfo], int, int]:
        """Every target's list_tensors together: (TensorInfos, used_bytes, quota_bytes), the
        bytes summed over the targets."""
        infos: List[TensorInfo] = []
        used = quota = 0
        for c in self.clients:
            i, u, q = c.list_tensors()
            infos += i
            used += u
            quota += q
        return infos, used, quota
