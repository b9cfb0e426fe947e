"""fusebox Python client: numpy, torch and DLPack tensors in; numpy (or torch) out.

``Client`` is synchronous, ``fusebox_client.aio.AsyncClient`` the same surface for asyncio;
client.py's docstring has the dtype, handle and settings rules.
"""
from ._common import (REPLICA_HEADER, FuseboxError, Handle, MessageTooLargeError, StreamCall,
                      StreamResult, TensorInfo, Timing, replica_of)
from ._tensors import (bfloat16_bits_to_float, float_to_bfloat16_bits, from_tensor, to_tensor)
from .client import Client, Router

__version__ = "0.1.0"

__all__ = ["REPLICA_HEADER", "Client", "FuseboxError", "Handle", "MessageTooLargeError", "Router",
           "StreamCall", "StreamResult", "TensorInfo", "Timing", "bfloat16_bits_to_float", "float_to_bfloat16_bits",
           "from_tensor", "replica_of", "to_tensor", "__version__"]
