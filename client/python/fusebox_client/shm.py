"""POSIX shared memory on the client's side: create an object the server (on the same node, run
with --allow_shared_memory) can map, view its bytes as numpy arrays, and name tensors in it.

    with SharedMemoryRegion.create(2 * n * 4) as shm, client.shared_memory("io", shm) as io:
        shm.ndarray("float32", (n,))[:] = x                  # write the input in place
        y = client.run_shared("Gelu", io.tensor("float32", (n,)), out=io.output(n * 4))
        result = shm.ndarray("float32", (n,), offset=n * 4)  # read the output in place

Built on ``multiprocessing.shared_memory`` (shm_open + ftruncate + mmap).
"""
from __future__ import annotations

import secrets
from multiprocessing import resource_tracker, shared_memory
from typing import Callable, Optional, Sequence

import numpy as np

from ._common import SharedOutput, SharedTensor
from ._tensors import NDArray

_NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


class SharedMemoryRegion:
    """A POSIX shared-memory object of this process. ``key`` is the name the server opens
    ("/name"). The creator unlinks it on close (the server keeps its mapping until the region
    is unregistered or expires); ``attach`` opens one another process made."""

    def __init__(self, shm: shared_memory.SharedMemory, owner: bool) -> None:
        self._shm = shm
        self._owner = owner

    @staticmethod
    def create(size: int, name: Optional[str] = None) -> "SharedMemoryRegion":
        if size <= 0:
            raise ValueError(f"size must be > 0, not {size}")
        name = name or "fusebox-" + secrets.token_hex(8)
        return SharedMemoryRegion(shared_memory.SharedMemory(name=name.lstrip("/"), create=True,
                                                             size=size), owner=True)

    @staticmethod
    def attach(name: str) -> "SharedMemoryRegion":
        shm = shared_memory.SharedMemory(name=name.lstrip("/"))
        # Python (before 3.13) tracks attached objects too, and its resource tracker would
        # unlink the creator's object when this process exits: it is not ours to remove.
        try:
            resource_tracker.unregister(getattr(shm, "_name", "/" + shm.name), "shared_memory")
        except Exception:  # a tracker that never saw it
            pass
        return SharedMemoryRegion(shm, owner=False)

    @property
    def key(self) -> str:
        return "/" + self._shm.name.lstrip("/")

    @property
    def size(self) -> int:
        return int(self._shm.size)

    @property
    def buf(self) -> memoryview:
        buf = self._shm.buf
        assert buf is not None, "the region is closed"
        return buf

    def ndarray(self, dtype: str, shape: Sequence[int], offset: int = 0) -> NDArray:
        """A numpy view of bytes in the region (bfloat16 as uint16 bit patterns)."""
        return np.ndarray(tuple(int(d) for d in shape), dtype=_NUMPY[dtype], buffer=self.buf,
                          offset=offset)

    def close(self) -> None:
        """Unmaps it here; the creator also unlinks the name (the server's mapping stays valid
        until it lets go)."""
        try:
            self._shm.close()
        except BufferError:  # numpy views still alive: the mapping goes with them
            pass
        if self._owner:
            self._owner = False
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> "SharedMemoryRegion":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RegisteredRegion:
    """A region registered with a server under ``name``: makes the SharedTensors and
    SharedOutputs that name it. ``Client.shared_memory`` returns one that unregisters itself at
    the end of a with block."""

    def __init__(self, name: str, size: int, unregister: Optional[Callable[[], None]] = None) -> None:
        self.name = name
        self.size = size
        self._unregister = unregister

    def tensor(self, dtype: str, shape: Sequence[int], offset: int = 0) -> SharedTensor:
        return SharedTensor(self.name, offset, dtype, tuple(int(d) for d in shape))

    def output(self, offset: int = 0) -> SharedOutput:
        return SharedOutput(self.name, offset)

    def __enter__(self) -> "RegisteredRegion":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._unregister is not None:
            self._unregister()


__all__ = ["RegisteredRegion", "SharedMemoryRegion", "SharedOutput", "SharedTensor"]
