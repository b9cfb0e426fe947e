"""Tensors in and out of fusebox.v1's wire form: numpy arrays (float32, float16, and bfloat16 from
ml_dtypes), torch tensors on any device, and anything with ``__dlpack__`` in; numpy arrays, or
torch tensors on request, out. bfloat16 rounding (nearest even) and widening live here.

torch and ml_dtypes are optional: nothing here imports them until a caller passes or asks for
one of their types.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

from fusebox.v1 import kernel_service_pb2 as pb

NDArray = npt.NDArray[Any]
DTypeName = Literal["float32", "float16", "bfloat16"]
DTypeArg = Union[str, "npt.DTypeLike", None]
Bf16Output = Literal["float32", "bits", "bfloat16"]
OutputKind = Literal["numpy", "torch"]

_WIRE: Dict[str, pb.DType] = {"float32": pb.FLOAT32, "float16": pb.FLOAT16,
                               "bfloat16": pb.BFLOAT16}
_NAMES: Dict[int, str] = {int(v): k for k, v in _WIRE.items()}
_ALIASES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
            "half": "float16", "bf16": "bfloat16"}
_ELEMENT_BYTES: Dict[int, int] = {pb.FLOAT32: 4, pb.FLOAT16: 2, pb.BFLOAT16: 2}


@dataclass(frozen=True)
class Wire:
    """A tensor ready to send: its fusebox.v1 dtype, shape, and little-endian bytes as a
    contiguous array (never copied again until gRPC serializes it)."""
    dtype: pb.DType
    shape: Tuple[int, ...]
    array: NDArray

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def data(self) -> memoryview:
        """The bytes, without a copy."""
        return self.array.reshape(-1).view(np.uint8).data


def element_bytes(dtype: int) -> int:
    """Bytes per element of a fusebox.v1 DType; ValueError for one this client does not know."""
    if dtype not in _ELEMENT_BYTES:
        raise ValueError(f"unknown fusebox.v1 dtype {dtype}")
    return _ELEMENT_BYTES[dtype]


def dtype_name(dtype: int) -> str:
    """'float32', 'float16' or 'bfloat16' for a fusebox.v1 DType value."""
    return _NAMES.get(dtype, f"dtype({dtype})")


def _float32_rounded_to_odd(x: NDArray) -> NDArray:
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


def float_to_bfloat16_bits(x: npt.ArrayLike) -> NDArray:
    """Rounds float values to bfloat16 (nearest even, NaN stays NaN); returns uint16 bits.
    float64 input is rounded once, not through float32's rounding first."""
    a = np.asarray(x)
    if a.dtype == np.float64:
        f = _float32_rounded_to_odd(a)
    else:
        f = np.ascontiguousarray(a, dtype=np.float32)
    u = f.view(np.uint32)
    bits = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = bits.astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def bfloat16_bits_to_float(bits: npt.ArrayLike) -> NDArray:
    """Widens uint16 bfloat16 bit patterns to float32 (exact)."""
    b = np.ascontiguousarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def canonical_dtype(dtype: DTypeArg) -> Optional[str]:
    """A dtype argument ('bf16', np.float16, ...) as 'float32' / 'float16' / 'bfloat16'."""
    if dtype is None:
        return None
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    name = _ALIASES.get(name, name)
    if name not in _WIRE:
        raise ValueError(f"unsupported dtype {dtype!r}: use float32, float16 or bfloat16")
    return name


def _is_torch_tensor(x: object) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype")


def _from_torch(t: Any) -> Tuple[NDArray, bool]:
    """A torch tensor (any device) as a host array; True when it holds bfloat16 bit patterns."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), True
    if t.dtype in (torch.float32, torch.float16, torch.float64):
        return np.asarray(t.numpy()), False
    raise TypeError(f"unsupported torch dtype {t.dtype}: use float32, float16 or bfloat16")


def _host_array(x: Any) -> Tuple[NDArray, bool]:
    """numpy, torch or DLPack input as a host array (+ whether it is bfloat16 bits)."""
    if isinstance(x, np.ndarray):
        return x, False
    if _is_torch_tensor(x):
        return _from_torch(x)
    if hasattr(x, "__dlpack__"):
        try:  # torch reads bfloat16 and device memory through DLPack; numpy reads neither
            import torch  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            try:
                return np.from_dlpack(x), False
            except (TypeError, BufferError, RuntimeError) as e:
                raise TypeError(f"cannot read {type(x).__name__} through DLPack with numpy ({e});"
                                " install torch to read bfloat16 or device memory") from e
        return _from_torch(torch.from_dlpack(x))
    return np.asarray(x), False


# Arrays sent as they are: C-contiguous, little-endian float32 / float16.
_AS_IS: Dict[np.dtype[Any], str] = {np.dtype("<f4"): "float32", np.dtype("<f2"): "float16"}


def to_wire(x: Any, dtype: DTypeArg = None) -> Wire:
    """An input (numpy array, torch tensor, DLPack object, nested lists) and an optional target
    dtype -> its wire form. Without a dtype: float32, float16 and bfloat16 map directly,
    float64 narrows to float32; uint16 must say dtype='bfloat16' (raw bit patterns)."""
    if type(x) is np.ndarray and x.flags.c_contiguous:  # the common case, without the checks
        name = _AS_IS.get(x.dtype)
        if name is not None and (dtype is None or canonical_dtype(dtype) == name):
            return Wire(_WIRE[name], x.shape, x)
    arr, bf16_bits = _host_array(x)
    if arr.dtype.byteorder == ">":  # big-endian floats: the same values, little-endian
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    is_bf16 = bf16_bits or arr.dtype.name == "bfloat16"
    want = canonical_dtype(dtype)
    if want is None:
        if is_bf16:
            want = "bfloat16"
        elif arr.dtype in (np.float32, np.float64):
            want = "float32"
        elif arr.dtype == np.float16:
            want = "float16"
        elif arr.dtype == np.uint16:
            raise TypeError("uint16 input: pass dtype='bfloat16' to send it as bfloat16 bit "
                            "patterns")
        else:
            raise TypeError(f"unsupported array dtype {arr.dtype}: use float32, float16 or "
                            "bfloat16")
    if want == "bfloat16":
        if is_bf16 or arr.dtype == np.uint16:
            data = np.ascontiguousarray(arr).view(np.uint16)
        else:
            data = float_to_bfloat16_bits(arr)
    else:
        if is_bf16:  # bfloat16 widened exactly before any narrowing
            arr = bfloat16_bits_to_float(np.ascontiguousarray(arr).view(np.uint16))
        data = np.ascontiguousarray(arr, dtype=np.dtype(want).newbyteorder("<"))
    return Wire(_WIRE[want], tuple(int(d) for d in arr.shape), data)


def to_tensor(x: Any, dtype: DTypeArg = None) -> pb.Tensor:
    """An input as a fusebox.v1.Tensor message (its bytes copied into the message)."""
    w = to_wire(x, dtype)
    return pb.Tensor(dtype=w.dtype, shape=list(w.shape), data=w.data().tobytes())


def decode(dtype: int, shape: Tuple[int, ...], data: Union[bytes, memoryview, NDArray], *,
           output: OutputKind = "numpy", bf16_output: Bf16Output = "float32",
           copy: bool = True) -> Any:
    """Bytes of a result -> a numpy array (bfloat16 as float32, uint16 bits or ml_dtypes'
    bfloat16) or, with output='torch', a CPU torch tensor of the same dtype (bfloat16 too).
    ``data`` that is a uint8 array is used in place. Other bytes (a received message's) are
    copied once into a writable array, or with copy=False not at all: the numpy array is then
    a read-only view of them (maybe not aligned to its dtype). torch tensors and bfloat16
    widened to float32 are always new, writable memory."""
    if output not in ("numpy", "torch"):
        raise ValueError("output must be 'numpy' or 'torch'")
    if bf16_output not in ("float32", "bits", "bfloat16"):
        raise ValueError("bf16_output must be 'float32', 'bits' or 'bfloat16'")
    owned = isinstance(data, np.ndarray)
    buf = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    # Copied only where the result would otherwise be a view of bytes it does not own.
    copy = not owned and (copy or output == "torch")
    if dtype == pb.FLOAT32:
        arr = buf.view("<f4").reshape(shape)
    elif dtype == pb.FLOAT16:
        arr = buf.view("<f2").reshape(shape)
    elif dtype == pb.BFLOAT16:
        bits = buf.view("<u2").reshape(shape)
        if output == "numpy" and bf16_output == "float32":  # a new array: no copy first
            return bfloat16_bits_to_float(bits).reshape(shape)
        if copy:
            bits = bits.copy()
        if output == "torch":
            import torch  # type: ignore[import-not-found, unused-ignore]
            return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
        if bf16_output == "bits":
            return bits
        import ml_dtypes  # type: ignore[import-not-found, unused-ignore]
        return bits.view(ml_dtypes.bfloat16)
    else:
        raise ValueError(f"the server returned an unknown dtype {dtype}")
    if copy:
        arr = arr.copy()
    if output == "torch":
        import torch  # type: ignore[import-not-found, unused-ignore]
        return torch.from_numpy(arr)
    return arr


def from_tensor(t: pb.Tensor, bf16_output: Bf16Output = "float32",
                output: OutputKind = "numpy") -> Any:
    """fusebox.v1.Tensor -> numpy array (or torch tensor); bfloat16 as ``decode`` says."""
    return decode(t.dtype, tuple(t.shape), t.data, output=output, bf16_output=bf16_output)
