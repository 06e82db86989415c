"""com.microsoft weight-only block quantization: MatMulNBits and GatherBlockQuantized.

The weights stay packed (uint8 blobs, int4 tensors) as arguments; they are unpacked with shifts
and masks and scaled per block inside the program, where XLA fuses the dequantization into the
matmul or gather that reads it. The products are computed in float32 and cast to the output
type, as ONNX Runtime's CPU kernels do for float16 (their results agree bit for bit).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from transmuter import dtypes
from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.shared import after, normalize_axis

_F32 = np.dtype(np.float32)
_PACKED_BITS = (2, 4, 8)
_NIBBLES = {np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4)}
_SCALED_FLOATS = dtypes.FLOAT8 | {np.dtype(ml_dtypes.float4_e2m1fn)}


def _unpack(packed, bits: int):
    """uint8 `packed` [..., n] as [..., n * 8 // bits] values, low-order bits first."""
    packed = jnp.asarray(packed)
    if bits == 8:
        return packed
    per_byte = 8 // bits
    shifts = jnp.arange(0, 8, bits, dtype=jnp.uint8)
    values = (packed[..., None] >> shifts) & jnp.uint8((1 << bits) - 1)
    return values.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,))


def _check_block_size(op_type: str, block_size: int) -> None:
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(
            f"{op_type}: block_size must be a power of 2 and at least 16, got {block_size}"
        )


def _per_block(value, n: int, blocks: int, what: str):
    """A scale or unpacked zero point as [N, blocks]: stored as [N, blocks] or flat."""
    value = jnp.asarray(value)
    if value.size != n * blocks or value.ndim not in (1, 2):
        raise ShapeError(
            f"MatMulNBits: {what} must have shape [{n}, {blocks}] or [{n * blocks}], "
            f"got {list(value.shape)}"
        )
    return value.reshape(n, blocks)


def _nbits_zero_points(zero_points, n: int, blocks: int, bits: int):
    """MatMulNBits zero points as float32 [N, blocks]. uint8 ones are packed like B (each row
    of N padded to whole bytes); float ones are stored one per block; absent ones are the
    middle of the range."""
    if zero_points is None:
        return jnp.float32(1 << (bits - 1))
    zero_points = jnp.asarray(zero_points)
    if zero_points.dtype != np.uint8:
        return _per_block(zero_points, n, blocks, "zero_points").astype(_F32)
    row_bytes = -(-blocks * bits // 8)
    if zero_points.size != n * row_bytes:
        raise ShapeError(
            f"MatMulNBits: packed uint8 zero_points must have shape [{n}, {row_bytes}] "
            f"({blocks} blocks of {bits} bits per row), got {list(zero_points.shape)}"
        )
    unpacked = _unpack(zero_points.reshape(n, row_bytes), bits)
    return unpacked[:, :blocks].astype(_F32)


def _check_nbits(bits: int, block_size: int, weight_prepacked: int) -> None:
    if bits not in _PACKED_BITS:
        raise ValueError(
            f"MatMulNBits: bits={bits} is not supported; the packing is defined for "
            f"{_PACKED_BITS} (ONNX Runtime's CPU kernel runs the same set)"
        )
    _check_block_size("MatMulNBits", block_size)
    if weight_prepacked:
        raise ValueError(
            "MatMulNBits: weight_prepacked=1 (an execution provider's private layout) is not "
            "supported; export with weight_prepacked=0"
        )


def _nbits_weight(
    B,
    scales,
    zero_points=None,
    g_idx=None,
    bias=None,
    *,
    K,
    N,
    accuracy_level=0,
    bits=4,
    block_size,
    weight_prepacked=0,
):
    """MatMulNBits' weight dequantized, float32 [K, N] (the registration's `weight`; bias and
    accuracy_level do not enter it)."""
    _check_nbits(bits, block_size, weight_prepacked)
    B = jnp.asarray(B)
    blocks = -(-K // block_size)
    blob = block_size * bits // 8
    if B.dtype != np.uint8 or tuple(B.shape) != (N, blocks, blob):
        raise ShapeError(
            f"MatMulNBits: B must be uint8 [N, ceil(K / block_size), block_size * bits / 8] = "
            f"[{N}, {blocks}, {blob}], got {B.dtype} {list(B.shape)}"
        )
    q = _unpack(B, bits).astype(_F32)  # [N, blocks, block_size]
    scale = _per_block(scales, N, blocks, "scales").astype(_F32)
    zero = _nbits_zero_points(zero_points, N, blocks, bits)
    if g_idx is None:
        if jnp.ndim(zero):
            zero = zero[..., None]
        w = ((q - zero) * scale[..., None]).reshape(N, blocks * block_size)[:, :K]
    else:
        # Act-order: g_idx[k] names the block (scale and zero point) of row k of the weights.
        # ONNX Runtime 1.32's CPU kernel ignores packed uint8 zero points when g_idx is given
        # (it uses 2^(bits-1)); the spec's formula applies them, and so does this.
        block_of_k = jnp.asarray(g_idx).astype(jnp.int32)
        if block_of_k.shape != (K,):
            raise ShapeError(
                f"MatMulNBits: g_idx must have shape [{K}], got {list(block_of_k.shape)}"
            )
        if jnp.ndim(zero):
            zero = zero[:, block_of_k]
        q = q.reshape(N, blocks * block_size)[:, :K]
        w = (q - zero) * scale[:, block_of_k]
    return w.T


@op("MatMulNBits", since=1, domain="com.microsoft", weight=_nbits_weight)
def matmul_nbits(
    A,
    B,
    scales,
    zero_points=None,
    g_idx=None,
    bias=None,
    *,
    K,
    N,
    accuracy_level=0,
    bits=4,
    block_size,
    weight_prepacked=0,
):
    """com.microsoft MatMulNBits-1: A @ dequantize(B)ᵀ (+ bias), B block-quantized along K.

    accuracy_level is accepted and ignored: A is never quantized, so every level computes what
    level 0 does (float32 products of the dequantized weights). ONNX Runtime's levels 1-4 may
    quantize A (level 4 to int8 per block), which moves its results by up to a few 1e-2.
    """
    _check_nbits(bits, block_size, weight_prepacked)
    A = jnp.asarray(A)
    if A.ndim < 1 or A.shape[-1] != K:
        raise ShapeError(f"MatMulNBits: A's last dim must be K={K}, got shape {list(A.shape)}")
    if jnp.size(B) == 0:
        # An omitted projection (the spec's empty B): zeros, or the broadcast bias.
        y = jnp.zeros(A.shape[:-1] + (N,), _F32)
    else:
        # Dequantized next to its use (4-bit MiniLM: 40 -> 26 ms, bench/README.md).
        weight = _nbits_weight(
            B, after(scales, A), zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size
        )
        y = jnp.matmul(A.astype(_F32), weight)
    if bias is not None:
        bias = jnp.asarray(bias)
        if bias.shape != (N,):
            raise ShapeError(f"MatMulNBits: bias must have shape [{N}], got {list(bias.shape)}")
        y = y + bias.astype(_F32)
    return y.astype(A.dtype)


def _gather_params(value, indices, axis: int, data_dim: int):
    """Take a scale or zero-point tensor along the gather axis like data, or keep a size-1 axis
    (broadcast over it) as size-1 axes in place of the index dims."""
    if value.shape[axis] == 1 and data_dim != 1:
        return value.reshape(value.shape[:axis] + (1,) * indices.ndim + value.shape[axis + 1 :])
    return jnp.take(value, indices, axis=axis)


def _expand_blocks(value, axis: int, block_size: int, size: int):
    """Per-block values repeated block_size times along `axis` and cut to `size`."""
    if value.shape[axis] == 1:
        return value
    value = jnp.repeat(value, block_size, axis=axis)
    return lax.slice_in_dim(value, 0, size, axis=axis)


@op("GatherBlockQuantized", since=1, domain="com.microsoft")
def gather_block_quantized(
    data,
    indices,
    scales,
    zero_points=None,
    *,
    bits=4,
    block_size=128,
    gather_axis=0,
    quantize_axis=1,
):
    """com.microsoft GatherBlockQuantized-1: Gather of block-quantized data, dequantized.

    data is int4/uint4, uint8 (bits 2/4/8, packed along the last axis, low-order bits first) or
    float8/float4 (scaled, no zero point). Only the gathered rows are dequantized.
    """
    data, indices, scales = jnp.asarray(data), jnp.asarray(indices), jnp.asarray(scales)
    kind = np.dtype(data.dtype)
    if kind in _SCALED_FLOATS:
        if zero_points is not None:
            raise ValueError("GatherBlockQuantized: float8/float4 data takes no zero_points")
        if block_size != 0:
            _check_block_size("GatherBlockQuantized", block_size)
        default_zero = None
    elif kind in _NIBBLES or kind == np.uint8:
        _check_block_size("GatherBlockQuantized", block_size)
        if kind == np.uint8 and bits not in _PACKED_BITS:
            raise ValueError(f"GatherBlockQuantized: uint8 data needs bits in {_PACKED_BITS}")
        if kind in _NIBBLES and bits != 4:
            raise ValueError(f"GatherBlockQuantized: {kind} data needs bits=4, got {bits}")
        default_zero = (1 << (bits - 1)) if kind == np.uint8 else 0
    else:
        raise TypeError(f"GatherBlockQuantized: data of type {kind} is not a quantized type")
    if kind == np.uint8 and bits < 8:
        data = _unpack(data, bits)
        if zero_points is not None:
            zero_points = _unpack(zero_points, bits)
    rank = data.ndim
    gather_axis = normalize_axis(gather_axis, rank, "GatherBlockQuantized: gather_axis")
    quantize_axis = normalize_axis(quantize_axis, rank, "GatherBlockQuantized: quantize_axis")
    if kind == np.uint8 and (gather_axis != 0 or (bits < 8 and quantize_axis == 0)):
        raise ValueError(
            "GatherBlockQuantized: uint8 data needs gather_axis 0, and with bits < 8 a "
            f"quantize_axis other than 0; got gather_axis {gather_axis}, quantize_axis "
            f"{quantize_axis}"
        )
    size = data.shape[quantize_axis]
    blocks = -(-size // block_size) if block_size else 1
    expected = tuple(blocks if i == quantize_axis else d for i, d in enumerate(data.shape))

    def fits(axis: int, got: int) -> bool:
        # Float8/float4 scales may be broadcast (size 1) along the other axes.
        return got == expected[axis] or (
            got == 1 and kind in _SCALED_FLOATS and axis != quantize_axis
        )

    if scales.ndim != rank or not all(fits(i, s) for i, s in enumerate(scales.shape)):
        raise ShapeError(
            f"GatherBlockQuantized: scales must have shape {list(expected)} (data "
            f"{list(data.shape)}, block_size {block_size} along axis {quantize_axis}), got "
            f"{list(scales.shape)}"
        )
    if zero_points is not None:
        # Packed uint8 zero points may carry padding past the last block.
        zero_points = jnp.asarray(zero_points)[tuple(slice(0, e) for e in expected)]
        if zero_points.shape != expected:
            raise ShapeError(
                f"GatherBlockQuantized: zero_points must hold {list(expected)} values, got "
                f"{list(zero_points.shape)}"
            )
    dim = data.shape[gather_axis]
    indices = jnp.where(indices < 0, indices + dim, indices)
    # One wrap: mode="clip" wraps no negatives again, and out-of-range rows clamp (checkify sees
    # the index); the scales and zero points are read at the clamped row too.
    values = jnp.take(data, indices, axis=gather_axis, mode="clip").astype(_F32)
    indices = jnp.clip(indices, 0, max(dim - 1, 0))
    if gather_axis == quantize_axis:
        # Each gathered slice lies in block index // block_size of the quantized axis.
        block_index = indices // block_size if block_size else jnp.zeros_like(indices)
        scale = jnp.take(scales, block_index, axis=gather_axis)
        zero = None if zero_points is None else jnp.take(zero_points, block_index, axis=gather_axis)
    else:
        out_axis = (
            quantize_axis if quantize_axis < gather_axis else quantize_axis - 1 + indices.ndim
        )
        block = block_size or size
        scale = _expand_blocks(
            _gather_params(scales, indices, gather_axis, dim), out_axis, block, size
        )
        zero = None
        if zero_points is not None:
            zero = _expand_blocks(
                jnp.take(zero_points, indices, axis=gather_axis), out_axis, block, size
            )
    if zero is not None:
        values = values - zero.astype(_F32)
    elif default_zero:
        values = values - jnp.float32(default_zero)
    return (values * scale.astype(_F32)).astype(scales.dtype)
