"""The native transport: large op calls through libfusebox_native (client/python/native), the
C++ client under a C ABI, loaded with ctypes. grpcio copies a message's bytes several times on
each side (lab/notes/python-client.md); through this library the request goes out as slices that
point at the caller's arrays, and the reply is gathered once, by the C++ client's copy threads,
into a numpy buffer placed so that the result's data is 64-byte aligned. ctypes releases the GIL
for the call.

The library is found at $FUSEBOX_NATIVE_LIB, else next to this module (where the CMake build
puts it); a package installed with pip alone has none and every call goes through grpcio.
$FUSEBOX_NATIVE=0 turns the transport off."""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import grpc
import numpy as np

from ._common import replica_of, Request, SERVICE, Settings
from ._wire import Buf, OpReply, parse_op_response, tensor_data_offset

LIBRARY = "libfusebox_native.so"
# Op calls with at least this many bytes of inline tensors take the native transport (Client's
# native_min_bytes): where grpcio's copies cost more than a millisecond.
NATIVE_MIN_BYTES = 1 << 20
_PREFIX = 512  # bytes read first to find where the result's data starts
_ALIGN = 64

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_tried = False


def library() -> Optional[ctypes.CDLL]:
    """The loaded library, or None when it is off or not there (then grpcio carries every
    call). A library named by $FUSEBOX_NATIVE_LIB that cannot be loaded is an error; the one
    next to this module that cannot (its gRPC libraries missing: a copied build tree) is
    warned about once, and grpcio is used."""
    global _lib, _tried
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("FUSEBOX_NATIVE", "1") == "0":
            return None
        named = os.environ.get("FUSEBOX_NATIVE_LIB")
        path = Path(named) if named else Path(__file__).resolve().parent / LIBRARY
        if not named and not path.is_file():
            return None
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            if named:
                raise
            warnings.warn(f"fusebox_client: {path} cannot be loaded ({e}); op calls use grpcio",
                          RuntimeWarning, stacklevel=3)
            return None
        vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        lib.fbx_open.restype = vp
        lib.fbx_open.argtypes = [cp, cp, cp, sz, cp, sz, cp, sz, cp, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_int]
        lib.fbx_close.restype = None
        lib.fbx_close.argtypes = [vp]
        lib.fbx_call.restype = ctypes.c_int
        lib.fbx_call.argtypes = [vp, cp, ctypes.POINTER(vp), ctypes.POINTER(sz), ctypes.c_int,
                                 cp, ctypes.c_double, ctypes.POINTER(vp), ctypes.c_char_p, sz]
        lib.fbx_reply_size.restype = sz
        lib.fbx_reply_size.argtypes = [vp]
        lib.fbx_reply_copy.restype = ctypes.c_int
        lib.fbx_reply_copy.argtypes = [vp, sz, vp, sz]
        lib.fbx_reply_free.restype = None
        lib.fbx_reply_free.argtypes = [vp]
        _lib = lib
        return lib


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class NativeCallError(Exception):
    """A call that failed, read like a grpc.RpcError: code() and details()."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _pem(b: Optional[bytes]) -> Tuple[Optional[bytes], int]:
    return (b, len(b)) if b else (None, 0)


class NativeChannel:
    """One C++ client (one connection) to a server; thread-safe, as the C++ client is."""

    def __init__(self, lib: ctypes.CDLL, target: str, token: Optional[str], tls: bool,
                 root: Optional[bytes], chain: Optional[bytes], key: Optional[bytes],
                 server_name: Optional[str], max_message_bytes: int,
                 copy_threads: int = 0) -> None:
        self._lib = lib
        r, c, k = _pem(root), _pem(chain), _pem(key)
        self._h: Optional[int] = lib.fbx_open(
            target.encode(), token.encode() if token else None, r[0], r[1], c[0], c[1], k[0],
            k[1], server_name.encode() if server_name else None, int(tls), max_message_bytes,
            copy_threads)

    def close(self) -> None:
        h, self._h = self._h, None
        if h:
            self._lib.fbx_close(h)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def call(self, method: str, parts: Sequence[Buf], handle: Optional[str],
             timeout: float) -> np.ndarray:
        """The reply's bytes for a request made of ``parts`` (sent in place), as a uint8 array
        of its own whose tensor data, if any, starts 64-byte aligned."""
        if not self._h:
            raise ValueError("the client is closed")
        keep: List[np.ndarray] = []  # the parts' memory, referenced until the call returns
        n = len(parts)
        ptrs = (ctypes.c_void_p * max(n, 1))()
        sizes = (ctypes.c_size_t * max(n, 1))()
        for i, p in enumerate(parts):
            a = np.frombuffer(p, dtype=np.uint8)
            keep.append(a)
            ptrs[i] = a.ctypes.data
            sizes[i] = a.nbytes
        reply = ctypes.c_void_p()
        msg = ctypes.create_string_buffer(1024)
        code = self._lib.fbx_call(self._h, method.encode(), ptrs, sizes, n,
                                  handle.encode() if handle else None, float(timeout),
                                  ctypes.byref(reply), msg, len(msg))
        del keep
        if code != 0:
            raise NativeCallError(_CODES.get(code, grpc.StatusCode.UNKNOWN),
                                  msg.value.decode(errors="replace"))
        try:
            size = self._lib.fbx_reply_size(reply)
            head = np.empty(min(size, _PREFIX), dtype=np.uint8)
            if head.nbytes and not self._lib.fbx_reply_copy(reply, 0, head.ctypes.data,
                                                            head.nbytes):
                raise NativeCallError(grpc.StatusCode.INTERNAL, "the reply could not be read")
            at = tensor_data_offset(head.data) or 0
            room = np.empty(size + _ALIGN, dtype=np.uint8)
            pad = -(room.ctypes.data + at) % _ALIGN
            out = room[pad:pad + size]
            if size and not self._lib.fbx_reply_copy(reply, 0, out.ctypes.data, size):
                raise NativeCallError(grpc.StatusCode.INTERNAL, "the reply could not be read")
            return out
        finally:
            self._lib.fbx_reply_free(reply)


def open_native(native: Optional[bool], s: "Settings", server_name: Optional[str],
                max_message_bytes: int) -> Optional[NativeChannel]:
    """A client's native channel: None for native=False or (native=None) no library; for
    native=True a missing library is a ValueError."""
    if native is False:
        return None
    lib = library()
    if lib is None:
        if native:
            raise ValueError("native=True, but libfusebox_native is not here or cannot be loaded "
                             "(a CMake build puts it next to fusebox_client; "
                             "$FUSEBOX_NATIVE_LIB names it)")
        return None
    return NativeChannel(lib, s.target, s.token, s.tls, s.root_certificates,
                         s.certificate_chain, s.private_key, server_name, max_message_bytes)


def use_native(req: Request, min_bytes: int) -> bool:
    """Whether an op call goes through the native transport (on a client that has it): a
    hand-encoded request with at least min_bytes of inline tensors."""
    return req.message is None and req.inline_bytes >= min_bytes


def native_op(ch: NativeChannel, req: Request, timeout: float) -> OpReply:
    """An op call through the native transport, its reply parsed in place: the output tensor's
    data is a writable, aligned uint8 array that decode() uses without a copy."""
    handle = next((h for h in req.handles if replica_of(h)), None)
    raw = ch.call(SERVICE + req.method, req.body.parts, handle, timeout)
    r = parse_op_response(raw.data)
    if r.kind == "tensor":  # a uint8 array: decode() uses it in place
        r.data = np.frombuffer(r.data, dtype=np.uint8)  # type: ignore[assignment]
    return r
