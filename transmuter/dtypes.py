"""The one table between ONNX element types and numpy/JAX dtypes, and the 64-bit policy.

ONNX element types are integers in `TensorProto.DataType`; they are written out here so that only
the front end imports onnx (tests check the table against onnx's own).

64-bit policy: ONNX computes in int64 and float64 where it says so, and JAX narrows both to 32 bits
unless x64 is enabled. Transmuter traces and runs every graph inside `jax.enable_x64(True)`, scoped
to its own calls, so a user's process keeps its setting (`transmuter.runtime.x64_scope`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

ONNX_TO_NUMPY: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    8: np.dtype(object),  # string tensors live on the host as numpy object arrays
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
    14: np.dtype(np.complex64),
    15: np.dtype(np.complex128),
    16: np.dtype(ml_dtypes.bfloat16),
    17: np.dtype(ml_dtypes.float8_e4m3fn),
    18: np.dtype(ml_dtypes.float8_e4m3fnuz),
    19: np.dtype(ml_dtypes.float8_e5m2),
    20: np.dtype(ml_dtypes.float8_e5m2fnuz),
    21: np.dtype(ml_dtypes.uint4),
    22: np.dtype(ml_dtypes.int4),
    23: np.dtype(ml_dtypes.float4_e2m1fn),
    24: np.dtype(ml_dtypes.float8_e8m0fnu),
    25: np.dtype(ml_dtypes.uint2),
    26: np.dtype(ml_dtypes.int2),
    27: np.dtype(ml_dtypes.float6_e2m3fn),
    28: np.dtype(ml_dtypes.float6_e3m2fn),
}

NUMPY_TO_ONNX: dict[np.dtype, int] = {dtype: code for code, dtype in ONNX_TO_NUMPY.items()}

# The four float8 types whose casts and quantization take ONNX's `saturate` attribute.
FLOAT8 = frozenset(ONNX_TO_NUMPY[code] for code in (17, 18, 19, 20))


def from_onnx(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX element type; a clear error for one we do not know."""
    try:
        return ONNX_TO_NUMPY[elem_type]
    except KeyError:
        raise ValueError(f"ONNX element type {elem_type} is not supported") from None


def to_onnx(dtype) -> int:
    """The ONNX element type of a numpy/JAX dtype."""
    try:
        return NUMPY_TO_ONNX[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"dtype {np.dtype(dtype)} has no ONNX element type") from None


def is_float(dtype) -> bool:
    """True for real floating types, half, bfloat16 and float8/float4 included."""
    dtype = np.dtype(dtype)
    return np.issubdtype(dtype, np.floating) or dtype in _ML_FLOATS


_ML_FLOATS = {ONNX_TO_NUMPY[c] for c in (16, 17, 18, 19, 20, 23, 24, 27, 28)}

# The half-precision float types, which compute their sums, products, norms and softmax in float32.
HALF = frozenset(ONNX_TO_NUMPY[code] for code in (10, 16))


def accumulation_dtype(dtype, *, real: bool = False) -> np.dtype:
    """The type to accumulate sums, products, norms and softmax of `dtype` in: float32 for
    float16/bfloat16 (rounded back once at the end, as ONNX Runtime's kernels do); float64 for
    integers when the result is real-valued (`real`, e.g. a log or a square root, truncated
    back); the type itself otherwise."""
    dtype = np.dtype(dtype)
    if dtype in HALF:
        return np.dtype(np.float32)
    if real and not is_float(dtype):
        return np.dtype(np.float64)
    return dtype
