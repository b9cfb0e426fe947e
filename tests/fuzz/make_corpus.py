#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer harnesses into tests/fuzz/corpus/<name>/seed-*.

Seeds are small, valid and nearly valid inputs, one per path worth starting from; the
fuzzers mutate them (scripts/fuzz.sh) and every build replays them (ctest -L fuzz).
Inputs that once made a fuzzer fail are kept beside them as regress-* and are not touched
here. Needs the generated fusebox.v1 modules: PYTHONPATH=build/python.

    PYTHONPATH=build/python /usr/bin/python3 tests/fuzz/make_corpus.py
"""
import io
import struct
from pathlib import Path

import numpy as np
from fusebox.v1 import kernel_service_pb2 as pb

CORPUS = Path(__file__).resolve().parent / "corpus"


def write(name, seeds):
    d = CORPUS / name
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("seed-*"):
        old.unlink()
    for stem, data in seeds.items():
        (d / f"seed-{stem}").write_bytes(data)
    print(f"{name}: {len(seeds)} seeds")


# --- request_fuzzer: one byte for the type (0 Gelu, 1 Softmax, 2 RowSum, 3 MatmulRelu), then
# the request message. A handle "#<c>" is the harness's stored tensor c % 6 (#5: another
# tenant's).

def tensor(dtype, shape, data=None):
    n = int(np.prod(shape)) if shape else 1
    size = 4 if dtype == pb.FLOAT32 else 2
    if data is None:
        data = bytes((i * 37 + 11) & 0xFF for i in range(n * size))
    return pb.TensorRef(tensor=pb.Tensor(dtype=dtype, shape=list(shape), data=data))


def handle(i):
    return pb.TensorRef(handle=f"#{i}")


def request_seeds():
    s = {}
    keep = pb.OutputOptions(keep_on_server=True)
    for kind, cls in ((0, pb.GeluRequest), (1, pb.SoftmaxRequest), (2, pb.RowSumRequest)):
        name = ("gelu", "softmax", "rowsum")[kind]
        cases = {
            "f32": cls(input=tensor(pb.FLOAT32, [4])),
            "f16-2x3": cls(input=tensor(pb.FLOAT16, [2, 3])),
            "bf16-3x5-keep": cls(input=tensor(pb.BFLOAT16, [3, 5]), output_options=keep),
            "scalar": cls(input=tensor(pb.FLOAT32, [])),
            "empty-0x5": cls(input=tensor(pb.FLOAT32, [0, 5])),
            "cols-0": cls(input=tensor(pb.FLOAT32, [3, 0])),
            "cols-0-keep": cls(input=tensor(pb.FLOAT32, [3, 0]), output_options=keep),
            "huge-rows-cols-0": cls(input=tensor(pb.FLOAT32, [1 << 28, 0], b"")),
            "handle": cls(input=handle(1)),
            "handle-keep": cls(input=handle(4), output_options=keep),
            "other-tenants-handle": cls(input=handle(5)),
            "unknown-handle": cls(input=pb.TensorRef(handle="t0123456789abcdef")),
            "short-data": cls(input=tensor(pb.FLOAT32, [2, 3], b"\0" * 23)),
            "dtype-0": cls(input=tensor(0, [4], b"\0" * 16)),
            "negative-dim": cls(input=tensor(pb.FLOAT32, [4, -3], b"")),
            "overflow": cls(input=tensor(pb.FLOAT32, [1 << 40, 1 << 40], b"")),
            "rank-65": cls(input=tensor(pb.FLOAT32, [1] * 65)),
            "no-input": cls(),
        }
        for stem, req in cases.items():
            s[f"{name}-{stem}"] = bytes([kind]) + req.SerializeToString()
    mm = pb.MatmulReluRequest
    cases = {
        "f32-2x3x4-bias": mm(a=tensor(pb.FLOAT32, [2, 3]), b=tensor(pb.FLOAT32, [3, 4]),
                            bias=tensor(pb.FLOAT32, [4])),
        "f16-5x7x3": mm(a=tensor(pb.FLOAT16, [5, 7]), b=tensor(pb.FLOAT16, [7, 3])),
        "bf16-keep": mm(a=tensor(pb.BFLOAT16, [3, 2]), b=tensor(pb.BFLOAT16, [2, 3]),
                        output_options=pb.OutputOptions(keep_on_server=True)),
        "k-0-bias": mm(a=tensor(pb.FLOAT32, [3, 0]), b=tensor(pb.FLOAT32, [0, 4]),
                       bias=tensor(pb.FLOAT32, [4])),
        "k-0-bias-keep": mm(a=tensor(pb.FLOAT32, [3, 0]), b=tensor(pb.FLOAT32, [0, 4]),
                            bias=tensor(pb.FLOAT32, [4]),
                            output_options=pb.OutputOptions(keep_on_server=True)),
        "k-0-resident-bias": mm(a=tensor(pb.FLOAT32, [2, 0]), b=tensor(pb.FLOAT32, [0, 4]),
                                bias=handle(0)),
        "handles": mm(a=handle(4), b=tensor(pb.FLOAT32, [4, 2])),
        "handle-f16-bf16": mm(a=handle(1), b=handle(2)),
        "mixed-dtypes": mm(a=tensor(pb.FLOAT32, [1, 1]), b=tensor(pb.FLOAT16, [1, 1])),
        "inner-differs": mm(a=tensor(pb.FLOAT32, [2, 3]), b=tensor(pb.FLOAT32, [4, 2])),
        "dim-2-31": mm(a=tensor(pb.FLOAT32, [1 << 31, 0], b""), b=tensor(pb.FLOAT32, [0, 1])),
        "big-output": mm(a=tensor(pb.FLOAT32, [1 << 20, 0], b""), b=tensor(pb.FLOAT32, [0, 1 << 20], b"")),
        "impl-7": mm(a=tensor(pb.FLOAT32, [1, 1]), b=tensor(pb.FLOAT32, [1, 1]), impl=7),
        "bias-wrong-shape": mm(a=tensor(pb.FLOAT32, [2, 3]), b=tensor(pb.FLOAT32, [3, 4]),
                               bias=tensor(pb.FLOAT32, [3])),
        "no-b": mm(a=tensor(pb.FLOAT32, [2, 3])),
    }
    for stem, req in cases.items():
        s[f"matmul-{stem}"] = bytes([3]) + req.SerializeToString()
    s["not-a-message"] = bytes([0]) + b"\xff\xff\xff\xff"
    return s


# --- npy_fuzzer: .npy files as NumPy writes them, and broken ones.

def npy(arr, **kw):
    buf = io.BytesIO()
    np.save(buf, arr, **kw)
    return buf.getvalue()


def npy_seeds():
    x = np.linspace(-2, 2, 12)
    s = {
        "f4-3x4": npy(x.astype("<f4").reshape(3, 4)),
        "f2-12": npy(x.astype("<f2")),
        "f8-2x2x3": npy(x.reshape(2, 2, 3)),
        "u2-bf16-bits": npy((x.astype("<f4").view("<u4") >> 16).astype("<u2")),
        "f4-scalar": npy(np.float32(1.5)),
        "f4-empty-0x3": npy(np.zeros((0, 3), "<f4")),
        "i4-unsupported": npy(np.arange(6, dtype="<i4")),
        "f4-big-endian": npy(x.astype(">f4")),
        "f4-fortran": npy(np.asfortranarray(x.astype("<f4").reshape(3, 4))),
        "structured": npy(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")])),
        "bad-magic": b"\x93NUMPX\x01\x00" + b"\0" * 10,
        "truncated-header": npy(x.astype("<f4"))[:30],
        "short-data": npy(x.astype("<f4"))[:-4],
    }
    v1 = npy(x.astype("<f4"))
    hlen = struct.unpack("<H", v1[8:10])[0]
    s["f4-v2"] = b"\x93NUMPY\x02\x00" + struct.pack("<I", hlen) + v1[10:]
    s["f4-v3"] = b"\x93NUMPY\x03\x00" + struct.pack("<I", hlen) + v1[10:]
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775807, 2), }"
    s["shape-overflow"] = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header
    header = b'{"descr": "<f4", "shape": (2, 0, 3), }'
    s["double-quotes-empty"] = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header
    return s


# --- upload_fuzzer: scripts of Upload calls (see the format in upload_fuzzer.cc).

def header(dtype, dims, data_len=0):
    out = bytes([0, dtype & 0xFF, len(dims)])
    for d in dims:
        out += bytes([d]) if 0 <= d < 17 else b"\xf0" + struct.pack("<q", d)
    return out + bytes([data_len])


def data(n):  # one data message of n bytes (n <= 4096)
    return bytes([1]) + struct.pack("<H", n)


def big(n):  # 16 * n bytes
    return bytes([2]) + struct.pack("<H", n)


def raw(msg):
    b = msg.SerializeToString()
    return bytes([3, len(b)]) + b


CLOSE, CANCEL, EMPTY = b"\x05", b"\x06", b"\x04"


def upload_seeds():
    return {
        "f32-4-in-header": header(1, [4], 16) + CLOSE,
        "f32-2x3-two-chunks": header(1, [2, 3]) + data(8) + data(16) + CLOSE,
        "f16-8x8-big-chunk": header(2, [8, 8]) + data(128) + CLOSE,
        "bf16-16x16x16": header(3, [16, 16, 16]) + big(512) + CLOSE,
        "well-formed-header": b"\x07\x01\x05\x05" + data(100) + CLOSE,
        "scalar": header(1, [], 4) + CLOSE,
        "empty-tensor": header(1, [0, 5]) + CLOSE,
        "empty-messages": header(1, [2]) + EMPTY + data(8) + EMPTY + CLOSE,
        "short": header(1, [4]) + data(8) + CLOSE,
        "too-many-bytes": header(1, [1], 4) + data(1) + CLOSE,
        "no-header": CLOSE,
        "dtype-0": header(0, [4], 16) + CLOSE,
        "dtype-9": header(9, [4], 16) + CLOSE,
        "negative-dim": header(1, [-4]) + CLOSE,
        "overflow": header(1, [1 << 40, 1 << 40]) + CLOSE,
        "rank-65": header(1, [1] * 65, 4) + CLOSE,
        "too-big-for-store": header(1, [1 << 20]) + CLOSE,
        "header-twice": header(1, [2]) + header(1, [2]) + CLOSE,
        "shape-in-later-raw": header(1, [2]) + raw(pb.UploadRequest(shape=[2], data=b"\0" * 8)) + CLOSE,
        "raw-header": raw(pb.UploadRequest(dtype=pb.FLOAT16, shape=[3], data=b"\1" * 6)) + CLOSE,
        "cancel-midway": header(1, [64, 64]) + big(256) + CANCEL,
        "cancel-after-last-byte": header(1, [4], 16) + CANCEL,
        "three-calls": header(1, [4], 16) + CLOSE + header(2, [3]) + data(6) + CANCEL
        + header(1, [5], 3) + CLOSE,
    }


# --- ranged_upload_fuzzer: scripts of ranged-upload calls (see ranged_upload_fuzzer.cc).

def r_create(dtype, dims):
    out = bytes([0, dtype & 0xFF, len(dims)])
    for d in dims:
        out += bytes([d]) if 0 <= d < 33 else b"\xf0" + struct.pack("<q", d)
    return out


def r_f32(a, b):  # float32 [a, b], 1 <= a, b <= 64
    return bytes([6, a - 1, b - 1])


def r_range(offset, n, flags=0):
    return bytes([flags]) + struct.pack("<HH", offset, n)


def r_write(*ranges, cancel=False):
    return bytes([2 if cancel else 1, len(ranges) - 1]) + b"".join(ranges)


def r_commit(offset=0, length=0, flags=0):
    return bytes([3]) + struct.pack("<HH", offset, length) + bytes([flags])


R_ABORT, R_UNKNOWN = bytes([4]), bytes([5])


def ranged_upload_seeds():
    # float32 [4, 8]: 128 bytes; the write's offset is taken % (size + 64).
    return {
        "one-range": r_f32(4, 8) + r_write(r_range(0, 128)) + r_commit(16, 32),
        "two-streams-out-of-order": r_f32(4, 8) + r_write(r_range(64, 64))
        + r_write(r_range(0, 32), r_range(32, 32)) + r_commit(100, 0),
        "missing-range": r_f32(4, 8) + r_write(r_range(0, 64)) + r_commit()
        + r_write(r_range(64, 64)) + r_commit(),
        "overlap": r_f32(4, 8) + r_write(r_range(0, 64)) + r_write(r_range(32, 64))
        + r_write(r_range(64, 64)) + r_commit(),
        "overlap-within-a-stream": r_f32(4, 8) + r_write(r_range(0, 64), r_range(60, 8))
        + r_commit(),
        "past-the-end": r_f32(4, 8) + r_write(r_range(120, 16)) + r_write(r_range(129, 0))
        + R_ABORT,
        "negative-offset": r_f32(4, 8) + r_write(r_range(0, 4, flags=1)) + R_ABORT,
        "no-upload-id": r_f32(4, 8) + r_write(r_range(0, 128, flags=4)) + r_commit(),
        "two-ids-on-a-stream": r_f32(4, 8) + r_write(r_range(0, 64), r_range(64, 64, flags=2))
        + r_commit(),
        "cancelled-stream": r_f32(4, 8) + r_write(r_range(0, 128), cancel=True)
        + r_write(r_range(0, 128)) + r_commit(0, 200),
        "download-at-minus-one": r_f32(2, 2) + r_write(r_range(0, 16)) + r_commit(0, 0, flags=1),
        "unknown-id": R_UNKNOWN + r_write(r_range(0, 4)) + R_ABORT + r_commit(),
        "bad-headers": r_create(0, [4]) + r_create(9, [4]) + r_create(1, [-4])
        + r_create(1, [1 << 40, 1 << 40]) + r_create(1, [32, 32, 32]),
        "empty-tensor": r_create(1, [0, 5]) + r_write(r_range(0, 0)) + r_commit(),
        "create-twice": r_f32(4, 8) + r_write(r_range(0, 64)) + r_f32(2, 2)
        + r_write(r_range(0, 16)) + r_commit(),
        "f16-odd": r_create(2, [3, 5]) + r_write(r_range(0, 10), r_range(10, 20)) + r_commit(3, 7),
    }


if __name__ == "__main__":
    write("request", request_seeds())
    write("npy", npy_seeds())
    write("upload", upload_seeds())
    write("ranged_upload", ranged_upload_seeds())
