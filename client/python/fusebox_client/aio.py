"""fusebox's asyncio client: the same surface as ``fusebox_client.Client``, every call a
coroutine, over grpc.aio. Create it inside the event loop that will use it.

Handles it creates free their tensors when they leave a ``with`` block, when garbage collected
(the free is scheduled on the client's loop), or when ``await client.close()`` runs.
"""
from __future__ import annotations

import asyncio
from typing import (TYPE_CHECKING, Any, AsyncIterator, Dict, Iterable, List, Literal, Optional,
                    Set, Tuple, Union, cast, overload)

import grpc
import grpc.aio

from fusebox.v1 import kernel_service_pb2 as pb

from ._common import (call_metadata, check_inline, credentials, DEFAULT_CHUNK_BYTES,
                      DEFAULT_CONNECTIONS, DownloadAssembly, execute_request, Freer, FuseboxError,
                      Handle, handle_id, HandleLike, health_request, health_status, identity,
                      matmul_request, Meter, now, op_result, PARALLEL_MIN_BYTES, Pem, Progress,
                      RANGE_BYTES, RangedAssembly, RangeQueue, register_ipc_request,
                      register_request, Request, rpc_error, SERVICE, shared_key,
                      shared_memory_info, shared_op_request, shared_upload_messages,
                      SharedMemoryInfo, SharedOutput, SharedTensor, stream_result, StreamCall,
                      StreamResult, tensor_info, TensorInfo, Timing, transfer_channel_options,
                      unary_request, upload_messages, write_messages)
from ._tensors import Bf16Output, DTypeArg, NDArray, OutputKind, Wire, to_wire
from .client import TensorLike
from ._base import ClientBase
from .shm import RegisteredRegion, SharedMemoryRegion
from ._native import NATIVE_MIN_BYTES, native_op, NativeCallError, use_native

if TYPE_CHECKING:  # torch is optional; without it mypy sees its types as Any
    import torch  # type: ignore[import-not-found, unused-ignore]


class AsyncClient(ClientBase[grpc.aio.Channel]):
    """A grpc.aio connection to one fusebox server; ``async with AsyncClient() as c:``."""

    def __init__(self, target: Optional[str] = None, timeout: float = 60.0,
                 max_message_bytes: int = -1, token: Optional[str] = None, *, tls: bool = False,
                 root_certificates: Optional[Pem] = None, certificate_chain: Optional[Pem] = None,
                 private_key: Optional[Pem] = None, server_name: Optional[str] = None,
                 progress: Progress = None, connections: int = DEFAULT_CONNECTIONS,
                 parallel_min_bytes: int = PARALLEL_MIN_BYTES,
                 range_bytes: int = RANGE_BYTES, copy_results: bool = True,
                 keep_freed_memory: bool = True, native: Optional[bool] = None,
                 native_min_bytes: int = NATIVE_MIN_BYTES) -> None:
        """The arguments and their defaults are Client's. A call through the native transport
        runs on the loop's default executor (a thread), so the loop goes on meanwhile; a
        cancelled task's native call still runs to its end or its deadline."""
        super().__init__(target, timeout, max_message_bytes, token, tls, root_certificates,
                         certificate_chain, private_key, server_name, progress, connections,
                         parallel_min_bytes, range_bytes, copy_results, keep_freed_memory,
                         native, native_min_bytes)
        try:
            self._loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._frees: Set["asyncio.Task[None]"] = set()
        self._freer = Freer(self._free_later)

    def _new_channel(self, options: List[Tuple[str, Any]]) -> grpc.aio.Channel:
        if self._settings.tls:
            return grpc.aio.secure_channel(self._settings.target, credentials(self._settings),
                                           options=options)
        return grpc.aio.insecure_channel(self._settings.target, options=options)

    def _channels(self, n: int) -> List[grpc.aio.Channel]:
        """n channels for a parallel transfer: this client's own, then ones made (once) for
        transfers, each a connection of its own."""
        while len(self._transfer_channels) < n - 1:
            self._transfer_channels.append(self._new_channel(
                transfer_channel_options(self._options, len(self._transfer_channels))))
        return [self.channel] + self._transfer_channels[:n - 1]

    async def close(self) -> None:
        """Frees the tensors of the handles this client still owns, then closes the channel."""
        live = self._freer.take_live()
        self._freer.closed = True
        await asyncio.gather(*(self._free_quietly(h.id) for h in live), *self._frees)
        await self.channel.close()
        for ch in self._transfer_channels:
            await ch.close()
        if self._native is not None:
            self._native.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _free_later(self, handle: str) -> None:
        """A finaliser's free: scheduled on the client's loop (any thread may collect)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def spawn() -> None:
            task = loop.create_task(self._free_quietly(handle))
            self._frees.add(task)
            task.add_done_callback(self._frees.discard)

        loop.call_soon_threadsafe(spawn)

    async def _free_quietly(self, handle: str) -> None:
        try:
            await self._unary["FreeTensor"](pb.FreeTensorRequest(handle=handle), timeout=10,
                                            metadata=call_metadata(self._metadata, [handle]))
        except grpc.RpcError:
            pass

    def _bind_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    async def wait_for_ready(self, timeout: float = 10.0) -> bool:
        """True when the channel connects within timeout seconds."""
        self._bind_loop()
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def health(self, service: str = "", timeout: float = 5.0) -> str:
        """grpc.health.v1 Check: 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN' or 'UNKNOWN'."""
        self._bind_loop()
        try:
            resp: bytes = await self._health(health_request(service), timeout=timeout,
                                             metadata=call_metadata(self._metadata, []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return health_status(resp)

    # --- ops -------------------------------------------------------------------------------

    @overload
    async def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                   output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                   return_timing: Literal[False] = False,
                   timeout: Optional[float] = None) -> NDArray: ...
    @overload
    async def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                   output: Literal["torch"], bf16_output: Bf16Output = "float32",
                   return_timing: Literal[False] = False,
                   timeout: Optional[float] = None) -> "torch.Tensor": ...
    @overload
    async def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[True],
                   output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                   return_timing: Literal[False] = False,
                   timeout: Optional[float] = None) -> Handle: ...
    @overload
    async def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                   output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                   return_timing: Literal[True],
                   timeout: Optional[float] = None) -> Tuple[NDArray, Timing]: ...
    @overload
    async def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
                   output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                   return_timing: bool = False, timeout: Optional[float] = None) -> Any: ...
    async def gelu(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
                   output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                   return_timing: bool = False, timeout: Optional[float] = None) -> Any:
        """Tanh-form GeLU of x, elementwise, any shape."""
        return await self._op(unary_request("Gelu", x, dtype, keep), timeout, output,
                              bf16_output, return_timing)

    @overload
    async def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                      output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                      return_timing: Literal[False] = False,
                      timeout: Optional[float] = None) -> NDArray: ...
    @overload
    async def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                      output: Literal["torch"], bf16_output: Bf16Output = "float32",
                      return_timing: Literal[False] = False,
                      timeout: Optional[float] = None) -> "torch.Tensor": ...
    @overload
    async def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[True],
                      output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                      return_timing: Literal[False] = False,
                      timeout: Optional[float] = None) -> Handle: ...
    @overload
    async def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                      output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                      return_timing: Literal[True],
                      timeout: Optional[float] = None) -> Tuple[NDArray, Timing]: ...
    @overload
    async def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
                      output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                      return_timing: bool = False, timeout: Optional[float] = None) -> Any: ...
    async def softmax(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
                      output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                      return_timing: bool = False, timeout: Optional[float] = None) -> Any:
        """Softmax over the last axis (rank >= 1)."""
        return await self._op(unary_request("Softmax", x, dtype, keep), timeout, output,
                              bf16_output, return_timing)

    @overload
    async def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                     output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                     return_timing: Literal[False] = False,
                     timeout: Optional[float] = None) -> NDArray: ...
    @overload
    async def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                     output: Literal["torch"], bf16_output: Bf16Output = "float32",
                     return_timing: Literal[False] = False,
                     timeout: Optional[float] = None) -> "torch.Tensor": ...
    @overload
    async def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[True],
                     output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                     return_timing: Literal[False] = False,
                     timeout: Optional[float] = None) -> Handle: ...
    @overload
    async def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: Literal[False] = False,
                     output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                     return_timing: Literal[True],
                     timeout: Optional[float] = None) -> Tuple[NDArray, Timing]: ...
    @overload
    async def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
                     output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                     return_timing: bool = False, timeout: Optional[float] = None) -> Any: ...
    async def rowsum(self, x: TensorLike, *, dtype: DTypeArg = None, keep: bool = False,
                     output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                     return_timing: bool = False, timeout: Optional[float] = None) -> Any:
        """Sum over the last axis (rank >= 1); the result is float32."""
        return await self._op(unary_request("RowSum", x, dtype, keep), timeout, output,
                              bf16_output, return_timing)

    @overload
    async def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                          dtype: DTypeArg = None, allow_tf32: bool = False,
                          impl: Union[int, str] = 0, keep: Literal[False] = False,
                          output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                          return_timing: Literal[False] = False,
                          timeout: Optional[float] = None) -> NDArray: ...
    @overload
    async def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                          dtype: DTypeArg = None, allow_tf32: bool = False,
                          impl: Union[int, str] = 0, keep: Literal[False] = False,
                          output: Literal["torch"], bf16_output: Bf16Output = "float32",
                          return_timing: Literal[False] = False,
                          timeout: Optional[float] = None) -> "torch.Tensor": ...
    @overload
    async def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                          dtype: DTypeArg = None, allow_tf32: bool = False,
                          impl: Union[int, str] = 0, keep: Literal[True],
                          output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                          return_timing: Literal[False] = False,
                          timeout: Optional[float] = None) -> Handle: ...
    @overload
    async def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                          dtype: DTypeArg = None, allow_tf32: bool = False,
                          impl: Union[int, str] = 0, keep: Literal[False] = False,
                          output: Literal["numpy"] = "numpy", bf16_output: Bf16Output = "float32",
                          return_timing: Literal[True],
                          timeout: Optional[float] = None) -> Tuple[NDArray, Timing]: ...
    @overload
    async def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                          dtype: DTypeArg = None, allow_tf32: bool = False,
                          impl: Union[int, str] = 0, keep: bool = False,
                          output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                          return_timing: bool = False, timeout: Optional[float] = None) -> Any: ...
    async def matmul_relu(self, a: TensorLike, b: TensorLike, bias: Optional[TensorLike] = None, *,
                          dtype: DTypeArg = None, allow_tf32: bool = False,
                          impl: Union[int, str] = 0, keep: bool = False,
                          output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                          return_timing: bool = False, timeout: Optional[float] = None) -> Any:
        """relu(a @ b + bias): a [M,K], b [K,N], bias [N] or None (inputs or handles), one
        dtype for all: a's unless ``dtype`` says. ``impl``: "default", "cublaslt" or "tiled" (the
        GPU's; the CPU ignores it); ``allow_tf32`` lets float32 use TF32 tensor cores on the GPU."""
        return await self._op(matmul_request(a, b, bias, dtype, allow_tf32, impl, keep), timeout,
                             output, bf16_output, return_timing)


    async def _op(self, req: Request, timeout: Optional[float], output: OutputKind,
                  bf16_output: Bf16Output, return_timing: bool) -> Any:
        self._bind_loop()
        check_inline(req.inline_bytes, self._max_message_bytes)
        start = now()
        try:
            if self._native is not None and use_native(req, self.native_min_bytes):
                resp = await asyncio.get_running_loop().run_in_executor(
                    None, native_op, self._native, req, self._deadline(timeout))
            else:
                resp = await self._ops[req.method](
                    req, timeout=self._deadline(timeout),
                    metadata=call_metadata(self._metadata, req.handles))
        except (grpc.RpcError, NativeCallError) as e:
            raise rpc_error(e, req.inline_bytes) from None
        return op_result(resp, (now() - start) * 1e6, self._freer, output, bf16_output,
                         return_timing, self.copy_results)

    async def execute_many(self, calls: Iterable[StreamCall], *, window: int = 64,
                           output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
                           timeout: Optional[float] = None) -> AsyncIterator[StreamResult]:
        """Client.execute_many for asyncio: ``async for r in client.execute_many(calls):``.
        The same window, order, errors and end as there."""
        if window < 1:
            raise ValueError("window must be at least 1")
        self._bind_loop()
        room = asyncio.Semaphore(window)
        sent_at: Dict[int, float] = {}
        call = self._execute(timeout=timeout, metadata=self._metadata or None)

        async def send() -> None:
            for index, c in enumerate(calls):
                await room.acquire()
                req = execute_request(index, c)
                sent_at[index] = now()
                await call.write(req)
            await call.done_writing()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                read = asyncio.ensure_future(call.read())
                if not sender.done():  # a call that cannot be sent ends the stream at once
                    await asyncio.wait({read, sender}, return_when=asyncio.FIRST_COMPLETED)
                    failed = sender.exception() if sender.done() else None
                    if failed is not None:
                        read.cancel()
                        raise failed
                got = await read
                if got is grpc.aio.EOF:
                    break
                resp = cast(pb.ExecuteResponse, got)
                room.release()
                start = sent_at.pop(resp.id, None)
                rpc_us = (now() - start) * 1e6 if start is not None else 0.0
                yield stream_result(resp, rpc_us, self._freer, output, bf16_output,
                                    self.copy_results)
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            if not sender.done():
                sender.cancel()
            call.cancel()  # a no-op once the stream has ended

    # --- tensors held by the server --------------------------------------------------------

    async def upload(self, x: TensorLike, *, dtype: DTypeArg = None,
                     chunk_bytes: int = DEFAULT_CHUNK_BYTES, timeout: Optional[float] = None,
                     progress: Progress = None) -> Handle:
        """Streams x to the server in chunks; returns a Handle that owns the tensor. A
        SharedTensor is read by the server from its region instead."""
        self._bind_loop()
        if isinstance(x, SharedTensor):
            try:
                resp = await self._upload(shared_upload_messages(x),
                                          timeout=self._deadline(timeout),
                                          metadata=call_metadata(self._metadata, []))
            except grpc.RpcError as e:
                raise rpc_error(e) from None
            return Handle(resp.tensor.handle, _freer=self._freer)
        w = to_wire(x, dtype)
        meter = Meter(self.progress if progress is None else progress, w.nbytes, "upload")
        if self.connections > 1 and w.nbytes >= self.parallel_min_bytes:
            try:
                return await self._upload_ranged(w, meter, self._deadline(timeout))
            finally:
                meter.close()
        try:
            resp = await self._upload(upload_messages(w, chunk_bytes, meter),
                                      timeout=self._deadline(timeout),
                                      metadata=call_metadata(self._metadata, []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            meter.close()
        return Handle(resp.tensor.handle, _freer=self._freer)

    @overload
    async def download(self, handle: HandleLike, *, output: Literal["numpy"] = "numpy",
                       bf16_output: Bf16Output = "float32", timeout: Optional[float] = None,
                       progress: Progress = None, chunk_bytes: int = 0) -> NDArray: ...
    @overload
    async def download(self, handle: HandleLike, *, output: Literal["torch"],
                       bf16_output: Bf16Output = "float32", timeout: Optional[float] = None,
                       progress: Progress = None, chunk_bytes: int = 0) -> "torch.Tensor": ...
    async def download(self, handle: HandleLike, *, output: OutputKind = "numpy",
                       bf16_output: Bf16Output = "float32", timeout: Optional[float] = None,
                       progress: Progress = None, chunk_bytes: int = 0) -> Any:
        """Fetches a held tensor (bfloat16 as the ops return it); it stays on the server."""
        self._bind_loop()
        hid = handle_id(handle)
        if self.connections > 1:  # the size decides: one small call, against a large transfer
            info = await self._stat(hid)
            if info.size_bytes >= self.parallel_min_bytes:
                ranged = await self._download_ranged(
                    info, self.progress if progress is None else progress,
                    self._deadline(timeout), chunk_bytes)
                return ranged.result(output, bf16_output)
        asm = DownloadAssembly(self.progress if progress is None else progress, "download")
        try:
            call = self._download(pb.DownloadRequest(handle=hid, chunk_bytes=chunk_bytes),
                                  timeout=self._deadline(timeout),
                                  metadata=call_metadata(self._metadata, [hid]))
            async for msg in call:
                asm.add(msg)
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            if asm.meter is not None:
                asm.meter.close()
        return asm.result(output, bf16_output)

    async def _stat(self, hid: str) -> pb.TensorInfo:
        try:
            r = await self._unary["ListTensors"](pb.ListTensorsRequest(handle=hid),
                                                 timeout=self.timeout,
                                                 metadata=call_metadata(self._metadata, [hid]))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        if len(r.tensors) != 1:
            raise FuseboxError(grpc.StatusCode.NOT_FOUND, f"no tensor {hid}")
        info: pb.TensorInfo = r.tensors[0]
        return info

    async def _upload_ranged(self, w: Wire, meter: Meter, timeout: float) -> Handle:
        """Client._upload_ranged's steps, the streams as tasks of one gather."""
        try:
            created = await self._unary["CreateUpload"](
                pb.CreateUploadRequest(dtype=w.dtype, shape=list(w.shape)), timeout=timeout,
                metadata=call_metadata(self._metadata, []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        uid = created.upload_id
        md = call_metadata(self._metadata, [uid])
        ranges = RangeQueue(w.nbytes, self.range_bytes)
        channels = self._channels(max(1, min(self.connections, ranges.count())))

        async def stream(channel: grpc.aio.Channel) -> None:
            write = channel.stream_unary(
                SERVICE + "WriteUpload",
                request_serializer=identity,
                response_deserializer=pb.WriteUploadResponse.FromString)
            first = ranges.take()
            if first is None:  # the other streams took every range: open none
                return
            try:
                await write(write_messages(uid, w, ranges, meter, first), timeout=timeout,
                            metadata=md, wait_for_ready=channel is not self.channel)
            except BaseException:
                ranges.stop()  # the other streams end at their next range
                raise

        try:
            await asyncio.gather(*(stream(ch) for ch in channels))
            resp = await self._unary["CommitUpload"](pb.CommitUploadRequest(upload_id=uid),
                                                     timeout=timeout, metadata=md)
        except BaseException as e:
            try:  # the reservation back now, not after the server's idle timeout
                await self._unary["AbortUpload"](pb.AbortUploadRequest(upload_id=uid),
                                                 timeout=10, metadata=md)
            except grpc.RpcError:
                pass
            if isinstance(e, grpc.RpcError):
                raise rpc_error(e) from None
            raise
        return Handle(resp.tensor.handle, _freer=self._freer)

    async def _download_ranged(self, info: pb.TensorInfo, progress: Progress, timeout: float,
                               chunk_bytes: int) -> RangedAssembly:
        """One ranged Download at a time per connection, each written into place."""
        asm = RangedAssembly(info, progress, "download")
        ranges = RangeQueue(int(info.size_bytes), self.range_bytes)
        channels = self._channels(max(1, min(self.connections, ranges.count())))
        md = call_metadata(self._metadata, [info.handle])

        async def fetch(channel: grpc.aio.Channel) -> None:
            download = channel.unary_stream(
                SERVICE + "Download", request_serializer=pb.DownloadRequest.SerializeToString,
                response_deserializer=pb.DownloadResponse.FromString)
            try:
                while True:
                    r = ranges.take()
                    if r is None:
                        return
                    offset = r[0]
                    async for msg in download(
                            pb.DownloadRequest(handle=info.handle, offset=r[0],
                                               length=r[1] - r[0], chunk_bytes=chunk_bytes),
                            timeout=timeout, metadata=md,
                            wait_for_ready=channel is not self.channel):
                        offset = asm.write(offset, r[1], msg)
                    asm.check_end(offset, r[1])
            except BaseException:
                ranges.stop()
                raise

        try:
            await asyncio.gather(*(fetch(ch) for ch in channels))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        finally:
            asm.meter.close()
        return asm

    async def free(self, handle: HandleLike) -> int:
        """Frees a held tensor now; returns the bytes freed. A Handle stops owning it."""
        self._bind_loop()
        if isinstance(handle, Handle):
            handle.release()
        hid = handle_id(handle)
        try:
            resp = await self._unary["FreeTensor"](pb.FreeTensorRequest(handle=hid),
                                                   timeout=self.timeout,
                                                   metadata=call_metadata(self._metadata, [hid]))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return int(resp.freed_bytes)

    async def list_tensors(self, handle: Optional[HandleLike] = None
                           ) -> Tuple[List[TensorInfo], int, int]:
        """This caller's held tensors (or only ``handle``'s): (infos, used_bytes, quota_bytes)."""
        self._bind_loop()
        hid = "" if handle is None else handle_id(handle)
        try:
            r = await self._unary["ListTensors"](
                pb.ListTensorsRequest(handle=hid), timeout=self.timeout,
                metadata=call_metadata(self._metadata, [hid] if hid else []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None
        return [tensor_info(t) for t in r.tensors], int(r.used_bytes), int(r.quota_bytes)

    # --- shared memory (same node; the server needs --allow_shared_memory) ------------------

    async def register_shared_memory(self, name: str, region: Union[SharedMemoryRegion, str], *,
                                     offset: int = 0, size: Optional[int] = None
                                     ) -> SharedMemoryInfo:
        """Registers [offset, offset + size) of a POSIX shared-memory object (a
        SharedMemoryRegion, or its key "/name") under ``name``; size defaults to the rest of
        the region."""
        key, size = shared_key(region, offset, size)
        r = await self._call("RegisterSharedMemory", register_request(name, key, offset, size))
        return shared_memory_info(r.region)

    async def register_cuda_ipc(self, name: str, ipc_handle: bytes, device: int, size: int
                                ) -> SharedMemoryInfo:
        """Registers device memory exported with cudaIpcGetMemHandle (CUDA backend only)."""
        r = await self._call("RegisterSharedMemory",
                             register_ipc_request(name, ipc_handle, device, size))
        return shared_memory_info(r.region)

    async def unregister_shared_memory(self, name: str) -> None:
        await self._call("UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest(name=name))

    async def list_shared_memory(self, name: Optional[str] = None
                                 ) -> Tuple[List[SharedMemoryInfo], int, int]:
        """This caller's regions (or only ``name``): (infos, used_bytes, quota_bytes)."""
        r = await self._call("ListSharedMemory", pb.ListSharedMemoryRequest(name=name or ""))
        return [shared_memory_info(m) for m in r.regions], int(r.used_bytes), int(r.quota_bytes)

    async def shared_memory(self, name: str, region: Union[SharedMemoryRegion, str], *,
                            offset: int = 0, size: Optional[int] = None) -> RegisteredRegion:
        """register_shared_memory, as a RegisteredRegion (unregister it with
        unregister_shared_memory: its with block cannot await)."""
        info = await self.register_shared_memory(name, region, offset=offset, size=size)
        return RegisteredRegion(name, info.size)

    async def run_shared(self, op: str, *inputs: TensorLike, out: SharedOutput,
                         allow_tf32: bool = False, impl: Union[int, str] = "default",
                         timeout: Optional[float] = None) -> Tuple[SharedTensor, Timing]:
        """Runs op ("Gelu", "Softmax", "RowSum", "MatmulRelu") with its output written into a
        registered region; inputs may be SharedTensors, arrays or handles. Returns where the
        output is, and the call's timing."""
        req = shared_op_request(op, inputs, out, allow_tf32, impl)
        res = await self._op(req, timeout, "numpy", "float32", True)
        return cast(Tuple[SharedTensor, Timing], res)

    async def _call(self, method: str, msg: Any) -> Any:
        self._bind_loop()
        try:
            return await self._unary[method](msg, timeout=self.timeout,
                                             metadata=call_metadata(self._metadata, []))
        except grpc.RpcError as e:
            raise rpc_error(e) from None



__all__ = ["AsyncClient"]
