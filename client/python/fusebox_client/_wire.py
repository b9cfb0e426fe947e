"""fusebox.v1 messages that carry tensor bytes, encoded and parsed by hand (as the C++ client
does), so the bytes are copied once on the way out and not at all on the way in.

Out: a request is a list of pieces (small headers serialized by the generated messages, the
tensor's ``bytes`` field's tag and length by hand, and a memoryview of the array itself) that
``b"".join`` turns into the message's wire form in one copy. The bytes are the ones protobuf
would write: fields in number order, a zero-length ``data`` left out as proto3 leaves it out.

In: an op response (GeluResponse, SoftmaxResponse, RowSumResponse, MatmulReluResponse, all
``{TensorRef output = 1; Timing timing = 2;}``) is read in place: the output tensor's data is a
memoryview into the received bytes; only the small Timing and SharedTensor parts go through
the generated messages.
"""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

from fusebox.v1 import kernel_service_pb2 as pb

Buf = Union[bytes, memoryview]

_LEN = 2  # wire type of length-delimited fields
_VARINT = 0


_ONE_BYTE = [bytes([i]) for i in range(0x80)]


def varint(n: int) -> bytes:
    """n (>= 0) as a protobuf varint."""
    if 0 <= n < 0x80:  # keys, dtypes, most dims and lengths of a small message
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(field: int, wire: int) -> bytes:
    return varint((field << 3) | wire)


class Pieces:
    """Parts of a message whose concatenation is its serialization; ``size`` is its length."""
    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: List[Buf] = []
        self.size = 0

    def add(self, b: Buf) -> "Pieces":
        if len(b):
            self.parts.append(b)
            self.size += len(b)
        return self

    def field(self, number: int, sub: "Pieces") -> "Pieces":
        """Appends ``sub`` as the length-delimited field ``number`` (a message field: written
        even when empty, as a set submessage is)."""
        self.add(key(number, _LEN) + varint(sub.size))
        self.parts.extend(sub.parts)
        self.size += sub.size
        return self

    def join(self) -> bytes:
        return b"".join(self.parts)


def tensor_ref(dtype: int, shape: Tuple[int, ...], data: memoryview) -> Pieces:
    """TensorRef{tensor = 1: Tensor{dtype = 1, shape = 2, data = 3}} with ``data`` by
    reference (a flat uint8 memoryview)."""
    # Tensor's dtype (1, left out when 0) and packed shape (2, left out when empty), encoded here
    # as protobuf does: building and serializing a message costs more than the rest of a
    # small call's encoding together.
    head = bytearray()
    if dtype:
        head += b"\x08" + varint(dtype)
    if shape:
        packed = b"".join([varint(d) for d in shape])
        head += b"\x12" + varint(len(packed)) + packed
    t = Pieces().add(bytes(head))
    n = len(data)
    if n:
        t.add(key(3, _LEN) + varint(n)).add(data)
    return Pieces().field(1, t)


def message(m: object) -> Pieces:
    """A generated message's serialization as pieces (one)."""
    return Pieces().add(m.SerializeToString())  # type: ignore[attr-defined]


# --- reading ---------------------------------------------------------------------------------

class ParseError(ValueError):
    pass


def _read_varint(buf: memoryview, i: int) -> Tuple[int, int]:
    if i < len(buf) and buf[i] < 0x80:  # keys and most small values: one byte
        return buf[i], i + 1
    v, shift = 0, 0
    n = len(buf)
    while i < n:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, i
        shift += 7
        if shift >= 70:
            break
    raise ParseError("bad varint")


def _skip(buf: memoryview, i: int, wire: int) -> int:
    if wire == _VARINT:
        return _read_varint(buf, i)[1]
    if wire == 1:
        i += 8
    elif wire == _LEN:
        n, i = _read_varint(buf, i)
        i += n
    elif wire == 5:
        i += 4
    else:
        raise ParseError(f"unexpected wire type {wire}")
    if i > len(buf):
        raise ParseError("truncated field")
    return i


def _length(buf: memoryview, i: int, end: int) -> Tuple[int, int]:
    """A length prefix at i: (start of the field's bytes, their end), checked against end."""
    n, i = _read_varint(buf, i)
    if i + n > end:
        raise ParseError("field past its message's end")
    return i, i + n


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v


class OpReply:
    """An op response, parsed: ``kind`` is "tensor", "handle", "shared" or None (no output);
    for a tensor its dtype, shape and data (a memoryview into the received bytes)."""
    __slots__ = ("kind", "dtype", "shape", "data", "handle", "shared", "timing")

    def __init__(self) -> None:
        self.kind: Optional[str] = None
        self.dtype = 0
        self.shape: Tuple[int, ...] = ()
        self.data: Buf = b""
        self.handle = ""
        self.shared: Optional[pb.SharedTensor] = None
        self.timing = pb.Timing()

    @staticmethod
    def from_message(resp: object) -> "OpReply":
        """The same from a generated op response (an Execute stream's)."""
        r = OpReply()
        out = resp.output  # type: ignore[attr-defined]
        which = out.WhichOneof("ref")
        if which == "tensor":
            r.kind = "tensor"
            r.dtype = int(out.tensor.dtype)
            r.shape = tuple(int(d) for d in out.tensor.shape)
            r.data = out.tensor.data
        elif which == "handle":
            r.kind, r.handle = "handle", str(out.handle)
        elif which == "shared":
            r.kind, r.shared = "shared", out.shared
        r.timing = resp.timing  # type: ignore[attr-defined]
        return r


def _parse_tensor(buf: memoryview, i: int, end: int, r: OpReply) -> None:
    dtype, shape, data = 0, [], memoryview(b"")
    while i < end:
        k, i = _read_varint(buf, i)
        field, wire = k >> 3, k & 7
        if field == 1 and wire == _VARINT:
            dtype, i = _read_varint(buf, i)
        elif field == 2 and wire == _LEN:  # packed
            s, e = _length(buf, i, end)
            i = s
            while i < e:
                v, i = _read_varint(buf, i)
                shape.append(_int64(v))
            if i != e:
                raise ParseError("bad packed shape")
        elif field == 2 and wire == _VARINT:  # unpacked
            v, i = _read_varint(buf, i)
            shape.append(_int64(v))
        elif field == 3 and wire == _LEN:
            s, i = _length(buf, i, end)
            data = buf[s:i]
        else:
            i = _skip(buf, i, wire)
    if i != end:
        raise ParseError("tensor past its end")
    r.kind, r.dtype, r.shape, r.data = "tensor", int(dtype), tuple(shape), data


def tensor_data_offset(prefix: Buf) -> Optional[int]:
    """Where an op response's output tensor data starts, from the response's first bytes:
    the offset of the data field's first byte, or None (no inline tensor, no data, or a
    header longer than ``prefix``). Lets a receiver place the data at an aligned address."""
    buf = memoryview(prefix)

    def value_of(i: int, want: int) -> Optional[int]:
        """Where the value of length-delimited field ``want`` starts, the fields before it
        skipped; None when the prefix ends first."""
        while i < len(buf):
            k, i = _read_varint(buf, i)
            if k == (want << 3) | _LEN:
                return _read_varint(buf, i)[1]
            i = _skip(buf, i, k & 7)
        return None

    try:
        ref = value_of(0, 1)  # the response's TensorRef output (Timing may come first)
        tensor = None if ref is None else value_of(ref, 1)  # TensorRef.tensor
        return None if tensor is None else value_of(tensor, 3)  # Tensor.data
    except ParseError:
        return None


def parse_op_response(raw: Buf) -> OpReply:
    """GeluResponse / SoftmaxResponse / RowSumResponse / MatmulReluResponse bytes -> OpReply,
    the tensor's data not copied. ParseError for bytes that are not one."""
    buf = memoryview(raw)
    r = OpReply()
    i, end = 0, len(buf)
    while i < end:
        k, i = _read_varint(buf, i)
        field, wire = k >> 3, k & 7
        if field == 1 and wire == _LEN:  # TensorRef output
            j, ref_end = _length(buf, i, end)
            while j < ref_end:
                k2, j = _read_varint(buf, j)
                f2, w2 = k2 >> 3, k2 & 7
                if f2 == 1 and w2 == _LEN:
                    s, j = _length(buf, j, ref_end)
                    _parse_tensor(buf, s, j, r)
                elif f2 == 2 and w2 == _LEN:
                    s, j = _length(buf, j, ref_end)
                    r.kind, r.handle = "handle", bytes(buf[s:j]).decode()
                elif f2 == 3 and w2 == _LEN:
                    s, j = _length(buf, j, ref_end)
                    r.kind, r.shared = "shared", pb.SharedTensor.FromString(bytes(buf[s:j]))
                else:
                    j = _skip(buf, j, w2)
            if j != ref_end:
                raise ParseError("output past its end")
            i = ref_end
        elif field == 2 and wire == _LEN:  # Timing
            s, i = _length(buf, i, end)
            r.timing = pb.Timing.FromString(bytes(buf[s:i]))
        else:
            i = _skip(buf, i, wire)
    if i != end:
        raise ParseError("response past its end")
    return r
