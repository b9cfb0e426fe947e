"""fusebox Python client: numpy, torch and DLPack tensors in; numpy (or torch) out.

``Client`` is synchronous, ``fusebox_client.aio.AsyncClient`` the same surface for asyncio;
client.py's docstring has the dtype, handle and settings rules.
"""
from ._common import (FuseboxError, Handle, keep_freed_memory, MessageTooLargeError,
                      REPLICA_HEADER, replica_of,
                      SharedMemoryInfo, SharedOutput, SharedTensor, StreamCall, StreamResult,
                      TensorInfo, Timing)
from ._tensors import (bfloat16_bits_to_float, float_to_bfloat16_bits, from_tensor, to_tensor)
from .client import Client, Router
from .shm import RegisteredRegion, SharedMemoryRegion

__version__ = "0.1.0"

__all__ = ["bfloat16_bits_to_float", "Client", "float_to_bfloat16_bits", "FuseboxError", "Handle",
           "keep_freed_memory",
           "MessageTooLargeError", "RegisteredRegion", "REPLICA_HEADER", "Router",
           "SharedMemoryInfo", "SharedMemoryRegion", "SharedOutput", "SharedTensor", "StreamCall",
           "StreamResult", "TensorInfo", "Timing",
           "from_tensor", "replica_of", "to_tensor", "__version__"]
