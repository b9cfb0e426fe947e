"""The Python client as users get it (``pip install ./client/python``), against a real
fusebox-server: handles that free themselves, string handles, settings from the environment,
the message-limit hint, progress, numpy / ml_dtypes / torch / DLPack inputs, and the asyncio
client. Type-checked with ``mypy --strict`` (scripts/python_package.sh).

Also runs from the build tree (PYTHONPATH=<build>/python); tests of optional packages (torch,
ml_dtypes, tqdm) skip where they are not installed.
"""
from __future__ import annotations

import asyncio
import gc
import importlib
import os
import time
from typing import Any, Iterator, List, Tuple

# The servers these tests start are forked from this multi-threaded process. grpcio from PyPI
# (1.85 here; not Debian's 1.51) runs fork handlers in such children that abort some of them
# (10 in 300). The children run no gRPC, so the handlers go, before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import numpy as np
import numpy.typing as npt
import pytest

from fusebox_client import Client, FuseboxError, Handle, MessageTooLargeError
from fusebox_client.aio import AsyncClient

# The server fixture's process wrapper, shared with test_python_client (untyped: Any here).
Server: Any = importlib.import_module("test_python_client").Server

F32 = npt.NDArray[np.float32]


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    s = Server()
    yield s
    s.stop()
    s.kill()


@pytest.fixture
def client(server: Any) -> Iterator[Client]:
    with Client(server.address, timeout=30) as c:
        assert c.wait_for_ready(10)
        yield c


def held(c: Client) -> List[str]:
    return [t.handle.id for t in c.list_tensors()[0]]


def gelu_ref(x: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    d = x.astype(np.float64)
    out: npt.NDArray[np.float64] = 0.5 * d * (1 + np.tanh(np.sqrt(2 / np.pi) *
                                                          (d + 0.044715 * d ** 3)))
    return out


def sample(shape: Tuple[int, ...] = (4, 33)) -> F32:
    return np.random.default_rng(7).uniform(-3, 3, shape).astype(np.float32)


# --- handles -----------------------------------------------------------------------------

def test_a_handle_frees_its_tensor_when_its_with_block_ends_even_on_an_exception(
        client: Client) -> None:
    with pytest.raises(RuntimeError):
        with client.upload(sample()) as h:
            assert h.id in held(client)
            raise RuntimeError("the code using the handle failed")
    assert h.id not in held(client)
    assert not h.owned


def test_a_handle_frees_its_tensor_when_garbage_collected(client: Client) -> None:
    h = client.gelu(sample(), keep=True)
    hid = h.id
    assert hid in held(client)
    del h
    gc.collect()
    deadline = time.monotonic() + 5
    while hid in held(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hid not in held(client)


def test_closing_the_client_frees_its_handles_and_release_keeps_one(server: Any) -> None:
    with Client(server.address) as c:
        dropped = c.upload(sample())
        kept = c.upload(sample()).release()
        still_here = c.upload(sample())  # released, and still referenced when the client closes
        still_here.release()
    with Client(server.address) as c:
        ids = held(c)
        assert dropped.id not in ids and kept in ids and still_here.id in ids
        assert c.free(kept) > 0 and c.free(still_here) > 0


def test_a_string_names_a_handle_wherever_a_handle_is_expected(client: Client) -> None:
    x = sample()
    with client.upload(x) as h:
        hid: str = h.id
        np.testing.assert_allclose(client.gelu(hid), gelu_ref(x), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(client.download(hid), x)
        assert [t.handle for t in client.list_tensors(hid)[0]] == [Handle(hid)]
        y = client.matmul_relu(hid, np.eye(33, dtype=np.float32))
        np.testing.assert_allclose(y, np.maximum(x, 0), rtol=1e-6)


def test_an_unknown_string_handle_is_not_found(client: Client) -> None:
    with pytest.raises(FuseboxError) as e:
        client.gelu("no-such-handle")
    assert e.value.code.name == "NOT_FOUND"


# --- settings and errors -----------------------------------------------------------------

def test_server_and_token_come_from_the_environment(server: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUSEBOX_SERVER", server.address)
    monkeypatch.setenv("FUSEBOX_TOKEN", "from-the-environment")
    with Client() as c:
        assert c.target == server.address
        assert c._metadata == (("authorization", "Bearer from-the-environment"),)
        assert c.health() == "SERVING"


def test_an_inline_tensor_past_the_message_limit_names_upload(server: Any) -> None:
    with Client(server.address, max_message_bytes=1 << 20) as c:
        with pytest.raises(MessageTooLargeError, match=r"upload\(\)"):
            c.gelu(np.zeros(1 << 19, np.float32))  # 2 MiB inline
        with c.upload(np.zeros(1 << 19, np.float32), chunk_bytes=1 << 19) as h:
            assert c.rowsum(h).shape == ()


def test_inline_tensors_past_protobufs_2_gib_are_refused_before_sending_naming_upload() -> None:
    from fusebox_client._common import check_inline
    check_inline((1 << 31) - (2 << 20), -1)
    with pytest.raises(MessageTooLargeError, match=r"upload\(\)"):
        check_inline(1 << 31, -1)  # gRPC would say only "Exception serializing request!"
    with pytest.raises(MessageTooLargeError):
        check_inline(1 << 31, 4 << 30)  # a larger limit of the client's changes nothing


def test_a_request_past_the_servers_message_limit_names_upload() -> None:
    s = Server("--max_message_bytes=1048576")
    try:
        with Client(s.address) as c:
            with pytest.raises(MessageTooLargeError, match=r"upload\(\)"):
                c.softmax(np.zeros((2, 1 << 18), np.float32))  # 2 MiB inline
            with pytest.raises(FuseboxError) as e:  # other errors carry no such hint
                c.softmax("no-such-handle")
            assert "upload()" not in str(e.value)
    finally:
        s.stop()
        s.kill()


def test_progress_callback_sees_every_chunk_of_an_upload_and_a_download(client: Client) -> None:
    x = np.arange(3 << 18, dtype=np.float32)  # 3 MiB: three 1 MiB chunks
    seen: List[Tuple[int, int]] = []
    with client.upload(x, chunk_bytes=1 << 20, progress=lambda d, t: seen.append((d, t))) as h:
        assert seen == [(1 << 20, 3 << 20), (2 << 20, 3 << 20), (3 << 20, 3 << 20)]
        seen.clear()
        y = client.download(h, progress=lambda d, t: seen.append((d, t)))
    np.testing.assert_array_equal(y, x)
    assert seen[-1] == (3 << 20, 3 << 20)


# --- inputs and outputs ------------------------------------------------------------------

def test_downloads_and_results_are_writable_arrays(client: Client) -> None:
    y = client.gelu(sample())
    y[0, 0] = 1.0
    with client.upload(sample()) as h:
        d = client.download(h)
    d[0, 0] = 1.0


def test_an_object_with_only_dlpack_is_accepted(client: Client) -> None:
    x = sample()

    class OnlyDLPack:
        def __dlpack__(self, **kwargs: Any) -> Any:
            return x.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> Any:
            return x.__dlpack_device__()

    try:
        y = client.gelu(OnlyDLPack())
    except TypeError as e:  # numpy too old to read DLPack, and no torch
        pytest.skip(str(e))
    np.testing.assert_allclose(y, gelu_ref(x), rtol=1e-5, atol=1e-6)


def test_ml_dtypes_bfloat16_goes_in_and_comes_back_as_bfloat16(client: Client) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = sample().astype(ml_dtypes.bfloat16)
    y = client.softmax(x, bf16_output="bfloat16")
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(y.astype(np.float32).sum(-1), 1, atol=3e-2)
    bits = client.softmax(x, bf16_output="bits")
    np.testing.assert_array_equal(bits, y.view(np.uint16))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_tensors_of_each_dtype_go_in_and_come_out_as_torch(client: Client,
                                                                  dtype: str) -> None:
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(sample()).to(getattr(torch, dtype))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        y = client.gelu(x.to(device), output="torch")
        assert y.dtype == x.dtype and tuple(y.shape) == tuple(x.shape)
        want = gelu_ref(x.float().numpy())
        np.testing.assert_allclose(y.float().numpy(), want, rtol=2e-2, atol=2e-2)
        with client.upload(x.to(device)) as h:
            back = client.download(h, output="torch")
        assert back.dtype == x.dtype and torch.equal(back, x)


# --- asyncio -----------------------------------------------------------------------------

def test_the_async_client_has_the_same_surface(server: Any) -> None:
    x = sample()

    async def run() -> None:
        async with AsyncClient(server.address, timeout=30) as c:
            assert await c.wait_for_ready(10)
            assert await c.health() == "SERVING"
            y, t = await c.gelu(x, return_timing=True)
            np.testing.assert_allclose(y, gelu_ref(x), rtol=1e-5, atol=1e-6)
            assert t.total_us > 0
            seen: List[int] = []
            h = await c.upload(x, chunk_bytes=256, progress=lambda d, t: seen.append(d))
            assert seen[-1] == x.nbytes
            with await c.softmax(h, keep=True) as s:
                np.testing.assert_allclose((await c.download(s)).sum(-1), 1, rtol=1e-5)
                assert (await c.rowsum(h.id)).shape == (4,)
                m = await c.matmul_relu(h, np.eye(33, dtype=np.float32))
                np.testing.assert_allclose(m, np.maximum(x, 0), rtol=1e-6)
            for _ in range(100):  # the with block's free is scheduled on the loop
                ids = [i.handle.id for i in (await c.list_tensors())[0]]
                if s.id not in ids:
                    break
                await asyncio.sleep(0.05)
            assert s.id not in ids and h.id in ids
            assert await c.free(h) == x.nbytes
            with pytest.raises(FuseboxError):
                await c.download("no-such-handle")

    asyncio.run(run())


def test_async_handles_free_their_tensors_when_collected_and_at_close(server: Any) -> None:
    async def run() -> Tuple[str, str]:
        async with AsyncClient(server.address) as c:
            h = await c.upload(sample())
            g = await c.gelu(h, keep=True)
            gid = g.id
            del g
            gc.collect()
            for _ in range(100):
                if gid not in [i.handle.id for i in (await c.list_tensors())[0]]:
                    break
                await asyncio.sleep(0.05)
            return h.id, gid

    hid, gid = asyncio.run(run())
    with Client(server.address) as c:
        ids = held(c)
    assert hid not in ids and gid not in ids


def test_the_package_names_its_version() -> None:
    import fusebox_client
    assert fusebox_client.__version__.count(".") == 2
    if os.environ.get("FUSEBOX_PIP_INSTALLED") == "1":
        from importlib.metadata import version
        assert version("fusebox-client") == fusebox_client.__version__


# --- parallel transfers ----------------------------------------------------------------------

def _odd_float16(n_bytes: int, seed: int) -> npt.NDArray[np.float16]:
    """float16 values of n_bytes (even), made from random bits with NaNs and infs cleared."""
    bits = np.random.default_rng(seed).integers(0, 1 << 16, n_bytes // 2, dtype=np.uint16)
    bits &= np.uint16(0xBBFF)  # exponent never all ones: every value finite
    out: npt.NDArray[np.float16] = bits.view(np.float16)
    return out


def test_the_default_split_round_trips_a_large_tensor_on_several_connections(
        server: Any) -> None:
    # 100 MiB and 6 bytes: past the 64 MiB default, so ranges of 8 MiB on 4 connections, the
    # last range short; progress counts across the streams, one call at a time, never back.
    x = _odd_float16((100 << 20) + 6, 5)
    with Client(server.address, timeout=120) as c:
        up: List[Tuple[int, int]] = []
        h = c.upload(x, progress=lambda d, t: up.append((d, t)))
        assert up[-1] == (x.nbytes, x.nbytes)
        assert all(a[0] < b[0] for a, b in zip(up, up[1:]))
        assert len(c._transfer_channels) == 3  # it did open connections of its own
        down: List[int] = []
        y = c.download(h, progress=lambda d, t: down.append(d))
        assert down[-1] == x.nbytes
        assert y.dtype == np.float16 and y.shape == x.shape
        assert y.view(np.uint16).tobytes() == x.view(np.uint16).tobytes()
        assert held(c) == [h.id]  # the ranged upload left nothing else behind
        h.free()


def test_a_ranged_upload_that_fails_leaves_nothing_and_raises(server: Any) -> None:
    x = np.zeros(3 << 20, dtype=np.float32)
    with Client(server.address, timeout=30, parallel_min_bytes=1 << 20,
                range_bytes=1 << 20) as c:
        def stop_half_way(done: int, total: int) -> None:
            if done > total // 2:
                raise RuntimeError("stop")  # a stream breaks: gRPC cancels it
        with pytest.raises(FuseboxError):
            c.upload(x, progress=stop_half_way)
        assert held(c) == []
        # The reservation goes back with the abort, once the server has ended the broken
        # streams (the client hears of their end first).
        for _ in range(100):
            if c.list_tensors()[1] == 0:
                break
            time.sleep(0.05)
        assert c.list_tensors()[1] == 0


def test_the_async_client_splits_large_transfers_too(server: Any) -> None:
    x = _odd_float16((3 << 20) + 2, 9)

    async def run() -> Tuple[bytes, List[int], int]:
        async with AsyncClient(server.address, timeout=60, parallel_min_bytes=1 << 20,
                               range_bytes=256 << 10, connections=3) as c:
            seen: List[int] = []
            h = await c.upload(x, progress=lambda d, t: seen.append(d))
            y = await c.download(h, progress=lambda d, t: None)
            opened = len(c._transfer_channels)
            await c.free(h)
            return y.view(np.uint16).tobytes(), seen, opened

    back, seen, opened = asyncio.run(run())
    assert back == x.view(np.uint16).tobytes()
    assert seen[-1] == x.nbytes and seen == sorted(seen)
    assert opened == 2


# --- hand-encoded requests, hand-parsed replies (_wire.py) -----------------------------------

def _old_ref(x: npt.NDArray[Any], dtype: int) -> Any:
    """A TensorRef as the generated messages build it (the client before _wire)."""
    from fusebox.v1 import kernel_service_pb2 as pb
    return pb.TensorRef(tensor=pb.Tensor(dtype=dtype,  # type: ignore[arg-type]
                                         shape=list(x.shape), data=x.tobytes()))


def test_hand_encoded_requests_are_the_bytes_protobuf_writes() -> None:
    from fusebox.v1 import kernel_service_pb2 as pb
    from fusebox_client._common import (SharedOutput, SharedTensor, StreamCall,
                                        execute_request, matmul_request, unary_request,
                                        upload_messages, write_messages, RangeQueue, Meter)
    from fusebox_client._tensors import Wire
    x = sample((3, 5))
    h = np.arange(6, dtype=np.float16).reshape(2, 3)
    empty = np.zeros((0, 4), np.float32)
    scalar = np.array(1.5, np.float32)  # rank 0: no shape field
    wide = np.ones((1, 2, 130, 300), np.float16)  # dims past one varint byte
    shared = SharedTensor("r", 64, "float32", (3, 5))
    for keep in (False, True):
        for method, req_type in (("Gelu", pb.GeluRequest), ("Softmax", pb.SoftmaxRequest),
                                 ("RowSum", pb.RowSumRequest)):
            for arr, code in ((x, pb.FLOAT32), (h, pb.FLOAT16), (empty, pb.FLOAT32),
                              (scalar, pb.FLOAT32), (wide, pb.FLOAT16),
                              (x.astype(np.float64), pb.FLOAT32), (x[:, ::2], pb.FLOAT32)):
                sent = arr.astype(np.float32) if arr.dtype == np.float64 else arr
                want = req_type(input=_old_ref(sent, code),
                                output_options=pb.OutputOptions(keep_on_server=keep))
                assert unary_request(method, arr, None, keep).serialize() == \
                    want.SerializeToString(), (method, arr.dtype, arr.shape, keep)
        want = pb.GeluRequest(input=pb.TensorRef(handle="rep.h1"),
                              output_options=pb.OutputOptions(keep_on_server=keep))
        assert unary_request("Gelu", "rep.h1", None, keep).serialize() == want.SerializeToString()
    out = SharedOutput("o", 128)
    want = pb.GeluRequest(input=pb.TensorRef(shared=shared.message()),
                          output_options=pb.OutputOptions(
                              shared=pb.SharedOutput(region="o", offset=128)))
    assert unary_request("Gelu", shared, None, False, out).serialize() == \
        want.SerializeToString()
    a, b, bias = sample((2, 3)), sample((3, 4)), sample((4,))
    for args, kw in (((a, b, None), {}), ((a, b, bias), dict(allow_tf32=True, impl="tiled")),
                     ((a, "h.b", bias), dict(keep=True)), (("h.a", b, None), {})):
        mm = pb.MatmulReluRequest(
            a=_old_ref(a, pb.FLOAT32) if args[0] is a else pb.TensorRef(handle="h.a"),
            b=_old_ref(b, pb.FLOAT32) if args[1] is b else pb.TensorRef(handle="h.b"),
            allow_tf32=bool(kw.get("allow_tf32", False)),
            impl=2 if kw.get("impl") == "tiled" else 0,  # type: ignore[arg-type]
            output_options=pb.OutputOptions(keep_on_server=bool(kw.get("keep", False))))
        if args[2] is not None:
            mm.bias.CopyFrom(_old_ref(bias, pb.FLOAT32))
        got = matmul_request(args[0], args[1], args[2], None,
                             bool(kw.get("allow_tf32", False)), str(kw.get("impl", "default")),
                             bool(kw.get("keep", False)))
        assert got.serialize() == mm.SerializeToString(), kw
    # Execute: the op request inside, with its id (0 left out, as proto3 leaves it out).
    for index in (0, 1, 300):
        e = pb.ExecuteRequest(id=index)
        e.softmax.CopyFrom(pb.SoftmaxRequest(input=_old_ref(x, pb.FLOAT32),
                                             output_options=pb.OutputOptions()))
        assert execute_request(index, StreamCall("softmax", (x,))) == e.SerializeToString()
    # Uploads: the data field by hand, each chunk a slice of the array.
    w = Wire(pb.FLOAT32, (3, 5), x)
    meter = Meter(False, w.nbytes, "upload")
    flat = x.tobytes()
    got_chunks = list(upload_messages(w, 16, meter))
    want_chunks = [pb.UploadRequest(dtype=pb.FLOAT32, shape=[3, 5], data=flat[:16])] + [
        pb.UploadRequest(data=flat[i:i + 16]) for i in range(16, len(flat), 16)]
    assert got_chunks == [m.SerializeToString() for m in want_chunks]
    ranges = RangeQueue(w.nbytes, 32)
    first = ranges.take()
    assert first is not None
    got_writes = list(write_messages("u1", w, ranges, meter, first))
    want_writes = [pb.WriteUploadRequest(upload_id="u1", offset=0, data=flat[:32]),
                   pb.WriteUploadRequest(offset=32, data=flat[32:])]
    assert got_writes == [m.SerializeToString() for m in want_writes]


def test_contiguous_inputs_are_not_copied_before_the_request_is_joined() -> None:
    from fusebox_client._common import unary_request
    x = sample((64, 64))
    r = unary_request("Gelu", x, None, False)
    views = [p for p in r.body.parts if isinstance(p, memoryview)]
    assert len(views) == 1 and np.shares_memory(np.frombuffer(views[0], np.uint8), x)
    # a non-contiguous input is made contiguous first (one copy), and still encodes
    t = x.T
    r = unary_request("Gelu", t, None, False)
    views = [p for p in r.body.parts if isinstance(p, memoryview)]
    assert len(views) == 1 and not np.shares_memory(np.frombuffer(views[0], np.uint8), x)
    assert bytes(views[0]) == np.ascontiguousarray(t).tobytes()


def test_op_replies_parse_as_protobuf_parses_them() -> None:
    from fusebox.v1 import kernel_service_pb2 as pb
    from fusebox_client._wire import ParseError, parse_op_response
    timing = pb.Timing(queue_us=1.5, kernel_us=2.25, total_us=9, backend="cpu", device="cpu",
                       stream=3, launch_us=0.5)
    x = sample((3, 5))
    raw = pb.GeluResponse(output=_old_ref(x, pb.FLOAT32), timing=timing).SerializeToString()
    r = parse_op_response(raw)
    assert (r.kind, r.dtype, r.shape) == ("tensor", pb.FLOAT32, (3, 5))
    assert bytes(r.data) == x.tobytes() and r.timing == timing
    # the data is a view of the received bytes, not a copy
    assert isinstance(r.data, memoryview) and r.data.obj is raw
    # an unpacked shape, an unknown field, and fields in another order read the same
    tensor_body = (b"\x1a" + bytes([len(x.tobytes())]) + x.tobytes() + b"\x10\x03\x10\x05" +
                   b"\x08\x01" + b"\xa0\x06\x07")
    ref = b"\x0a" + bytes([len(tensor_body)]) + tensor_body
    t = timing.SerializeToString()
    raw2 = b"\x12" + bytes([len(t)]) + t + b"\x0a" + bytes([len(ref)]) + ref
    r2 = parse_op_response(raw2)
    assert (r2.kind, r2.dtype, r2.shape, bytes(r2.data)) == ("tensor", 1, (3, 5), x.tobytes())
    assert parse_op_response(pb.RowSumResponse(
        output=pb.TensorRef(handle="rep.x1")).SerializeToString()).handle == "rep.x1"
    st = pb.SharedTensor(region="r", offset=8, dtype=pb.FLOAT16, shape=[2, 2])
    s = parse_op_response(pb.MatmulReluResponse(output=pb.TensorRef(shared=st)).SerializeToString())
    assert s.kind == "shared" and s.shared == st
    assert parse_op_response(b"").kind is None
    for bad in (raw[:-3], raw[:10], b"\x0a\x05\x0a", b"\x0b"):
        with pytest.raises(ParseError):
            parse_op_response(bad)


def test_results_can_be_read_only_views_of_the_reply(server: Any) -> None:
    x = sample((256, 33))
    with Client(server.address, timeout=30, copy_results=False) as c:
        y = c.gelu(x)
        assert not y.flags.writeable
        np.testing.assert_allclose(y, gelu_ref(x), rtol=1e-5, atol=1e-6)
        out, timing = c.softmax(x, return_timing=True)
        assert timing.total_us > 0 and not out.flags.writeable
        bits = c.gelu(x, dtype="bfloat16", bf16_output="bits")
        assert bits.dtype == np.uint16 and not bits.flags.writeable
        wide = c.gelu(x, dtype="bfloat16")  # widened to float32: new memory
        assert wide.dtype == np.float32 and wide.flags.writeable
        with c.gelu(x, keep=True) as h:
            np.testing.assert_array_equal(c.download(h), y)
    with Client(server.address, timeout=30) as c:
        z = c.gelu(x)
        assert z.flags.writeable and z.flags.aligned
        np.testing.assert_array_equal(z, y)
