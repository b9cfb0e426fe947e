"""fusebox Python client: numpy in, numpy out. See client.py for the dtype rules."""
from .client import (REPLICA_HEADER, Client, FuseboxError, Handle, Router, TensorInfo, Timing,
                     bfloat16_bits_to_float, float_to_bfloat16_bits, from_tensor, replica_of,
                     to_tensor)

__all__ = ["REPLICA_HEADER", "Client", "FuseboxError", "Handle", "Router", "TensorInfo", "Timing",
           "bfloat16_bits_to_float", "float_to_bfloat16_bits", "from_tensor", "replica_of",
           "to_tensor"]
