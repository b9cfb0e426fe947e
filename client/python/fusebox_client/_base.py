"""What Client and AsyncClient set up alike: settings, limits and token, the native transport,
and the method handles on their channel. Each subclass makes its own kind of channel
(grpc.Channel or grpc.aio.Channel, whose handle-making methods are the same)."""
from __future__ import annotations

from typing import Any, Generic, List, Optional, Tuple, TypeVar

from fusebox.v1 import kernel_service_pb2 as pb

from ._common import (channel_options, HEALTH_METHOD, identity, Metadata, OP_METHODS, Pem,
                      Progress, REQUESTS, SERVICE, settings, Settings, serialize_request)
from ._common import keep_freed_memory as _keep_freed_memory
from ._native import open_native
from ._wire import parse_op_response

ChannelT = TypeVar("ChannelT")


class ClientBase(Generic[ChannelT]):
    def __init__(self, target: Optional[str], timeout: float, max_message_bytes: int,
                 token: Optional[str], tls: bool, root_certificates: Optional[Pem],
                 certificate_chain: Optional[Pem], private_key: Optional[Pem],
                 server_name: Optional[str], progress: Progress, connections: int,
                 parallel_min_bytes: int, range_bytes: int, copy_results: bool,
                 keep_freed_memory: bool, native: Optional[bool], native_min_bytes: int) -> None:
        if connections < 1:
            raise ValueError(f"connections must be >= 1, not {connections}")
        if keep_freed_memory:
            _keep_freed_memory()
        s = settings(target, token, tls, root_certificates, certificate_chain, private_key,
                     server_name)
        self._settings: Settings = s
        self.target = s.target
        self.timeout = timeout
        self.progress = progress
        self.connections = connections
        self.parallel_min_bytes = parallel_min_bytes
        self.range_bytes = range_bytes
        self.copy_results = copy_results
        self.native_min_bytes = native_min_bytes
        self._max_message_bytes = max_message_bytes
        self._metadata: Metadata = (("authorization", f"Bearer {s.token}"),) if s.token else ()
        self._stub: Any = None
        # Before the channel: a native transport that must be there and is not raises here.
        self._native = open_native(native, s, server_name, max_message_bytes)
        self._options = channel_options(max_message_bytes, server_name)
        self.channel: ChannelT = self._new_channel(self._options)
        self._transfer_channels: List[ChannelT] = []
        ch: Any = self.channel
        self._unary = {name: ch.unary_unary(SERVICE + name,
                                            request_serializer=req.SerializeToString,
                                            response_deserializer=resp.FromString)
                       for name, (req, resp) in REQUESTS.items() if name not in OP_METHODS}
        # The op RPCs encode their requests and parse their replies by hand (_wire.py): the
        # tensors' bytes are joined into the request once, and read in place from the reply.
        self._ops = {name: ch.unary_unary(SERVICE + name, request_serializer=serialize_request,
                                          response_deserializer=parse_op_response)
                     for name in OP_METHODS}
        self._upload = ch.stream_unary(SERVICE + "Upload", request_serializer=identity,
                                       response_deserializer=pb.UploadResponse.FromString)
        self._download = ch.unary_stream(
            SERVICE + "Download", request_serializer=pb.DownloadRequest.SerializeToString,
            response_deserializer=pb.DownloadResponse.FromString)
        self._health = ch.unary_unary(HEALTH_METHOD, request_serializer=identity,
                                      response_deserializer=identity)
        self._execute = ch.stream_stream(SERVICE + "Execute", request_serializer=identity,
                                         response_deserializer=pb.ExecuteResponse.FromString)

    def _new_channel(self, options: List[Tuple[str, Any]]) -> ChannelT:
        raise NotImplementedError

    @property
    def stub(self) -> Any:
        """The generated fusebox.v1 KernelServiceStub on this channel, for raw calls (pass
        ``metadata=client.metadata``)."""
        if self._stub is None:
            from fusebox.v1 import kernel_service_pb2_grpc as pb_grpc
            make = pb_grpc.KernelServiceStub  # generated without type annotations
            self._stub = make(self.channel)  # type: ignore[no-untyped-call, unused-ignore]
        return self._stub

    @property
    def metadata(self) -> Metadata:
        """The metadata every call carries (the token), for raw calls."""
        return self._metadata

    def _deadline(self, timeout: Optional[float]) -> float:
        return self.timeout if timeout is None else timeout
