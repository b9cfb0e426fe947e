"""fusebox Python client: numpy in, numpy out. See client.py for the dtype rules."""
from .client import (Client, FuseboxError, Handle, TensorInfo, Timing, bfloat16_bits_to_float,
                     float_to_bfloat16_bits, from_tensor, to_tensor)

__all__ = ["Client", "FuseboxError", "Handle", "TensorInfo", "Timing", "bfloat16_bits_to_float",
           "float_to_bfloat16_bits", "from_tensor", "to_tensor"]
