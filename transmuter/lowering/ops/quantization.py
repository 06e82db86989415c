"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the integer
products MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

Integer products accumulate in int32 (`preferred_element_type`), the only width the spec lets
overflow. Rounding is half to even (`jnp.round`); integer targets saturate to their range.
Float8/float4 targets use XLA's conversions, which round to nearest even like ml_dtypes.
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from transmuter import dtypes
from transmuter.errors import ShapeError
from transmuter.lowering import op, variant
from transmuter.lowering.platforms import platform_dependent
from transmuter.lowering.shared import divide as shared_divide
from transmuter.lowering.shared import normalize_axis, same_pads, spatial_attrs

# Integer quantized types -> (lowest, highest) value, for saturation.
INT_RANGES = {
    np.dtype(t): (int(ml_dtypes.iinfo(t).min), int(ml_dtypes.iinfo(t).max))
    for t in (
        np.uint8,
        np.int8,
        np.uint16,
        np.int16,
        ml_dtypes.uint4,
        ml_dtypes.int4,
        ml_dtypes.uint2,
        ml_dtypes.int2,
    )
}
# No infinity or NaN encoding: these always saturate, whatever `saturate` says (QuantizeLinear-28).
_SATURATING_FLOATS = {
    np.dtype(t) for t in (ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn)
}
_PLAIN_FLOATS = {np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)}
_DEQUANT_OUTPUTS = {np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32)}
_F32 = np.dtype(np.float32)
_ONNX_FLOAT = dtypes.to_onnx(_F32)
_HALVES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _granular(value, shape, axis: int, block_size: int, what: str):
    """`value` (a scale or zero point) made broadcastable to `shape`: a scalar (per tensor), a
    1-D tensor along `axis` (per axis), or with `block_size`, one entry per block along `axis`."""
    value = jnp.asarray(value)
    if value.size == 1:
        return value.reshape(())
    rank = len(shape)
    axis = normalize_axis(axis, rank, f"{what}: axis")
    if block_size < 0:
        raise ValueError(f"{what}: block_size must be positive, got {block_size}")
    if not block_size:
        if value.ndim != 1 or value.shape[0] != shape[axis]:
            raise ShapeError(
                f"{what}: expected a scalar or a 1-D tensor of {shape[axis]} values (axis {axis} "
                f"of input shape {tuple(shape)}), got shape {value.shape}; blocked quantization "
                "needs block_size"
            )
        return value.reshape(tuple(-1 if i == axis else 1 for i in range(rank)))
    size = shape[axis]
    blocks = value.shape[axis] if value.ndim == rank else 0
    if (
        value.ndim != rank
        or any(v != s for i, (v, s) in enumerate(zip(value.shape, shape, strict=True)) if i != axis)
        or not (blocks - 1) * block_size < size <= blocks * block_size
    ):
        expected = tuple(-(-size // block_size) if i == axis else d for i, d in enumerate(shape))
        raise ShapeError(
            f"{what}: blocked quantization of input shape {tuple(shape)} along axis {axis} with "
            f"block_size {block_size} needs shape {expected}, got {value.shape}"
        )
    value = jnp.repeat(value, block_size, axis=axis, total_repeat_length=blocks * block_size)
    return lax.slice_in_dim(value, 0, size, axis=axis)


def _require_scalar(value, what: str) -> None:
    if value is not None and np.size(value) != 1:
        raise ShapeError(f"{what} must be a scalar at this opset, got shape {np.shape(value)}")


def _division_dtype(scale_dtype, precision: int) -> np.dtype:
    """The type x / y_scale is computed in: `precision` if given, else y_scale's type."""
    if precision:
        chosen = dtypes.from_onnx(precision)
        if chosen not in _PLAIN_FLOATS:
            raise ValueError(f"QuantizeLinear: precision must be a float type, got {chosen}")
        return chosen
    scale_dtype = np.dtype(scale_dtype)
    if scale_dtype in _PLAIN_FLOATS:
        return scale_dtype
    # int32 scales (QuantizeLinear-19/21) are exact in float64; float8e8m0 scales (24+) are
    # powers of two, exact in float32.
    return np.dtype(np.float64) if scale_dtype.kind == "i" else _F32


def _before_23(y_scale) -> int:
    """The `precision` QuantizeLinear-19/21 divide in. Their text says only "(x / y_scale), it
    rounds to the nearest even", not in which type; ONNX Runtime's CPU kernel divides a
    half-precision x by a half scale in float32 there (in the scale's type from 23 on, which is
    what 23's text asks). A float16 quotient is rounded once more before the integer rounding,
    which moves values onto or off ties, so before 23 a half scale divides in float32, as ORT
    does (bit-exact on 10^6 values on ties: tests/ops/test_quantization.py)."""
    return _ONNX_FLOAT if np.dtype(jnp.asarray(y_scale).dtype) in _HALVES else 0


def _to_float(value, dtype=_F32):
    """Cast to a float type, through float32 for float8e8m0, which XLA converts only to f32."""
    value = jnp.asarray(value)
    if value.dtype == np.dtype(ml_dtypes.float8_e8m0fnu) and dtype != _F32:
        value = value.astype(_F32)
    return value.astype(dtype)


def divide(x, scale, dtype: np.dtype):
    """x / scale rounded once to `dtype`, as an IEEE division in `dtype` gives it (XLA would
    multiply by the reciprocal: `shared.divide`); float8e8m0 values widen through float32."""
    wide = np.dtype(np.float64)
    return shared_divide(_to_float(x, wide), _to_float(scale, wide), dtype)


def _saturate_cast(value, target: np.dtype, saturate: int):
    """A float value converted to float8/float4/float6 `target`; saturating clips to +-max.

    Saturation takes +-inf to +-max for every float8 type. Cast's table says NaN for the FNUZ
    types, but ONNX Runtime, onnx.reference and the backend test data all clip."""
    if target in _SATURATING_FLOATS or saturate:
        limit = float(ml_dtypes.finfo(target).max)
        value = jnp.clip(value, -limit, limit)
    return value.astype(target)


def _plus_float_zero(value, zero):
    """value + zero for float8/float4 targets. ONNX Runtime and onnx.reference ignore float8
    zero points; the spec's formula adds them. A zero one is skipped so that -0 stays -0
    (-0 + 0 is +0), as both keep it."""
    zero = _to_float(zero, value.dtype)
    return jnp.where(zero == 0, value, value + zero)


def _quantize(x, y_scale, y_zero_point, *, axis, block_size, saturate, target, precision):
    x, y_scale = jnp.asarray(x), jnp.asarray(y_scale)
    if (
        target not in INT_RANGES
        and target not in dtypes.FLOAT8
        and target not in _SATURATING_FLOATS
    ):
        raise ValueError(f"QuantizeLinear: {target} is not a quantized type")
    compute = _division_dtype(y_scale.dtype, precision)
    # x and y_scale are first rounded to the division type, as dividing in that type does.
    scale = _to_float(
        _granular(y_scale, x.shape, axis, block_size, "QuantizeLinear y_scale"), compute
    )
    value = divide(_to_float(x, compute), scale, compute)
    zero = None
    if y_zero_point is not None:
        zero = _granular(y_zero_point, x.shape, axis, block_size, "QuantizeLinear y_zero_point")
    if target in INT_RANGES:
        # Round in the division type, then widen: float16 cannot hold every uint16 zero point.
        wide = np.dtype(np.float64) if compute == np.float64 else _F32
        value = jnp.round(value).astype(wide)
        if zero is not None:
            value = value + zero.astype(wide)
        low, high = INT_RANGES[target]
        # NaN saturates to the lowest value, as ONNX Runtime's kernels clamp it (not XLA's 0).
        return _nan_to(jnp.clip(value, low, high), low).astype(target)
    value = value.astype(_F32) if compute != np.float64 else value
    if zero is not None:
        value = _plus_float_zero(value, zero)
    return _saturate_cast(value, target, saturate)


def _output_type(y_zero_point, output_dtype: int) -> np.dtype:
    if output_dtype:
        chosen = dtypes.from_onnx(output_dtype)
        if y_zero_point is not None and np.dtype(y_zero_point.dtype) != chosen:
            raise ValueError(
                f"QuantizeLinear: output_dtype is {chosen} but y_zero_point is "
                f"{np.dtype(y_zero_point.dtype)}; they must agree"
            )
        return chosen
    return np.dtype(y_zero_point.dtype) if y_zero_point is not None else np.dtype(np.uint8)


@op("QuantizeLinear", since=10)
def quantize_linear_v10(x, y_scale, y_zero_point=None):
    """ONNX QuantizeLinear-10: per-tensor saturate(round(x / y_scale) + y_zero_point)."""
    _require_scalar(y_scale, "QuantizeLinear-10 y_scale")
    _require_scalar(y_zero_point, "QuantizeLinear-10 y_zero_point")
    return _quantize(
        x,
        y_scale,
        y_zero_point,
        axis=0,
        block_size=0,
        saturate=1,
        target=_output_type(y_zero_point, 0),
        precision=0,
    )


@op("QuantizeLinear", since=21)
def quantize_linear_v21(
    x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0, saturate=1
):
    """ONNX QuantizeLinear-21: adds blocked quantization, output_dtype and (u)int16/(u)int4."""
    return _quantize(
        x,
        y_scale,
        y_zero_point,
        axis=axis,
        block_size=block_size,
        saturate=saturate,
        target=_output_type(y_zero_point, output_dtype),
        precision=_before_23(y_scale),
    )


quantize_linear_v19 = op("QuantizeLinear", since=19)(variant(
    quantize_linear_v21, "quantize_linear_v19",
    "ONNX QuantizeLinear-19: adds float8 targets with `saturate`, and half-precision inputs.",
    fixed={"block_size": 0, "output_dtype": 0},
))  # fmt: skip


@op("QuantizeLinear", since=(23, 24, 25, 28))
def quantize_linear_v23(
    x,
    y_scale,
    y_zero_point=None,
    *,
    axis=1,
    block_size=0,
    output_dtype=0,
    precision=0,
    saturate=1,
):
    """ONNX QuantizeLinear-23..28: y_scale's type (or `precision`) sets the division type;
    adds float4e2m1 (23), float8e8m0 scales (24), (u)int2 (25) and float6 (28) targets."""
    return _quantize(
        x,
        y_scale,
        y_zero_point,
        axis=axis,
        block_size=block_size,
        saturate=saturate,
        target=_output_type(y_zero_point, output_dtype),
        precision=precision,
    )


# From 23, not 19: 13's scales are float32, the type it divides in (precision 0).
quantize_linear_v13 = op("QuantizeLinear", since=13)(variant(
    quantize_linear_v23, "quantize_linear_v13",
    "ONNX QuantizeLinear-13: per-tensor or per-axis, to int8/uint8.",
    fixed={"block_size": 0, "output_dtype": 0, "precision": 0, "saturate": 1},
))  # fmt: skip


def _dequantize(x, x_scale, x_zero_point, *, axis, block_size, output):
    x, x_scale = jnp.asarray(x), jnp.asarray(x_scale)
    if output not in _DEQUANT_OUTPUTS:
        raise ValueError(
            f"DequantizeLinear: the output type {output} is not float, float16 or bfloat16 "
            "(a float8e8m0 x_scale needs output_dtype)"
        )
    if x.dtype.kind in "iu":
        value = x.astype(jnp.int32)
        if x_zero_point is not None:
            zero = _granular(
                x_zero_point, x.shape, axis, block_size, "DequantizeLinear x_zero_point"
            )
            value = value - zero.astype(jnp.int32)
        value = value.astype(_F32)
    else:
        value = _to_float(x)
        if x_zero_point is not None:
            zero = _granular(
                x_zero_point, x.shape, axis, block_size, "DequantizeLinear x_zero_point"
            )
            value = value - _to_float(zero)
    # Multiplied in float32 and rounded once to the output type: every quantized value and
    # every scale is exact in float32, which (x - zero) in float16 is not for 16-bit types.
    scale = _to_float(_granular(x_scale, x.shape, axis, block_size, "DequantizeLinear x_scale"))
    return (value * scale).astype(output)


@op("DequantizeLinear", since=10, converts=True)
def dequantize_linear_v10(x, x_scale, x_zero_point=None):
    """ONNX DequantizeLinear-10: per-tensor (x - x_zero_point) * x_scale."""
    _require_scalar(x_scale, "DequantizeLinear-10 x_scale")
    _require_scalar(x_zero_point, "DequantizeLinear-10 x_zero_point")
    return _dequantize(
        x, x_scale, x_zero_point, axis=0, block_size=0, output=np.dtype(jnp.asarray(x_scale).dtype)
    )


@op("DequantizeLinear", since=(23, 24, 25, 28), converts=True)
def dequantize_linear_v23(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    """ONNX DequantizeLinear-23..28: output_dtype; float4e2m1 (23), float8e8m0 scales (24),
    (u)int2 (25) and float6 (28) inputs."""
    output = (
        dtypes.from_onnx(output_dtype) if output_dtype else np.dtype(jnp.asarray(x_scale).dtype)
    )
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size, output=output)


dequantize_linear_v21 = op("DequantizeLinear", since=21, converts=True)(variant(
    dequantize_linear_v23, "dequantize_linear_v21",
    "ONNX DequantizeLinear-21: adds blocked quantization and (u)int16/(u)int4 inputs.",
    fixed={"output_dtype": 0},
))  # fmt: skip
dequantize_linear_v13 = op("DequantizeLinear", since=(13, 19), converts=True)(variant(
    dequantize_linear_v21, "dequantize_linear_v13",
    "ONNX DequantizeLinear-13/19: per-tensor or per-axis; 19 adds float8 and half scales.",
    fixed={"block_size": 0},
))  # fmt: skip


@op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x):
    """ONNX DynamicQuantizeLinear-11: uint8 quantization with a range that includes 0."""
    x = jnp.asarray(x)
    high, low = _range_without_nans(x)
    # ONNX Runtime's GetQuantizationParameter, step by step: scale = (max - min) / 255 and
    # zero = round_half_even(clamp(0 - min / scale, 0, 255)), both IEEE float32 divisions.
    # Traced, XLA turns `/ 255` into `* (1 / 255)`, a scale one ulp off for some ranges and
    # then ~14% of the outputs one step off, so every division here goes through `divide`.
    # An all-zero (or empty) x would give scale 0 and NaNs; ONNX Runtime uses 1 there.
    span = divide(high - low, jnp.float32(255.0), _F32)
    scale = jnp.where(high == low, jnp.float32(1.0), span)
    # -inf in x makes min / scale -inf / inf: ONNX Runtime's clamp turns that NaN into 255.
    zero = _nan_to(jnp.clip(-divide(low, scale, _F32), 0.0, 255.0), 255.0)
    zero = jnp.round(zero)
    # MLAS then divides each x by the scale in float32 and rounds half to even
    # (cvtps2dq), adding the zero point after rounding, as the spec's formula does.
    y = jnp.clip(jnp.round(divide(x, scale, _F32)) + zero, 0.0, 255.0)
    return _nan_to(y, 0.0).astype(jnp.uint8), scale.astype(jnp.float32), zero.astype(jnp.uint8)


def _range_without_nans(x):
    """max(x, 0) and min(x, 0) over the values of x that are not NaN.

    A NaN (an exported atan2's 0 / 0, say) left in would make DynamicQuantizeLinear's scale NaN,
    and so every output of the integer product downstream. ONNX Runtime's SIMD min/max mostly
    skips NaNs too, but not always (one in the last lane of a block gives a NaN scale); we skip
    them always. XLA fuses the select into the reductions: no slower than plain ones within
    timing noise (DynamicQuantizeLinear of [1, 64, 40000]: ~5.5 ms either way)."""
    kept = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)  # 0 is in the range anyway
    return jnp.max(kept, initial=0.0), jnp.min(kept, initial=0.0)


def _nan_to(value, replacement: float):
    """NaNs of `value` replaced: converted to an integer type, XLA would make them 0."""
    return jnp.where(jnp.isnan(value), jnp.asarray(replacement, value.dtype), value)


def _row_zero(zero, a, what: str):
    """A's zero point (or scale) broadcastable to A: a 1-D tensor holds one value per row."""
    zero = jnp.asarray(zero)
    if zero.size == 1:
        return zero.reshape(())
    if zero.ndim == 1:
        if a.ndim < 2 or zero.shape[0] != a.shape[-2]:
            raise ShapeError(
                f"{what}: a 1-D tensor holds one value per row of A (shape {a.shape}), got "
                f"{zero.shape[0]} values"
            )
        return zero[:, None]
    return zero


def _col_zero(zero, b, what: str):
    """B's zero point (or scale) broadcastable to B: a 1-D tensor holds one value per column."""
    zero = jnp.asarray(zero)
    if zero.size == 1:
        return zero.reshape(())
    if zero.ndim == 1 and (b.ndim < 2 or zero.shape[0] != b.shape[-1]):
        raise ShapeError(
            f"{what}: a 1-D tensor holds one value per column of B (shape {b.shape}), got "
            f"{zero.shape[0]} values"
        )
    return zero


def _shifted(x, zero, int_path: bool):
    """x - zero in int32 (integer inputs) or float32 (float8 inputs)."""
    x = jnp.asarray(x)
    dtype = jnp.int32 if int_path else jnp.float32
    value = x.astype(dtype) if int_path else _to_float(x)
    if zero is not None:
        value = value - (zero.astype(dtype) if int_path else _to_float(zero))
    return value


_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def _as_int8(x):
    """8-bit x as int8 and the offset that restores it (uint8 x = int8 value + 128)."""
    if x.dtype == np.int8:
        return x, 0
    return (x.astype(jnp.int16) - 128).astype(jnp.int8), 128


def integer_matmul(a, b, a_zero=None, b_zero=None):
    """(a - a_zero) @ (b - b_zero), exactly, in int32. a_zero broadcasts over a's rows (a scalar
    or (..., M, 1)), b_zero over b's columns (a scalar or (..., N)).

    For 8-bit matrices this is an int8 x int8 -> int32 dot, which XLA:CPU runs several times
    faster than an int32 dot (0.31 ms vs 3.8 ms for 128x384 @ 384x1536; float32: 0.52 ms), with
    the zero points applied afterwards through row and column sums:
    (a - za)(b - zb) = ab - zb * rowsum(a) - za * colsum(b) + K * za * zb. int32 arithmetic
    wraps, so the result is exact whenever the true result fits in int32."""
    if a.dtype not in _EIGHT_BIT or b.dtype not in _EIGHT_BIT or a.ndim < 2 or b.ndim < 2:
        return jnp.matmul(
            _shifted(a, a_zero, True), _shifted(b, b_zero, True), preferred_element_type=jnp.int32
        )
    a8, a_offset = _as_int8(a)
    b8, b_offset = _as_int8(b)
    # a - za = a8 - (za - a_offset), and the same for b.
    za = _offset_zero(a_zero, a_offset)
    zb = _offset_zero(b_zero, b_offset)
    if za is None:
        acc = jnp.matmul(a8, b8, preferred_element_type=jnp.int32)
    else:
        # b's column sums as one more row of the same int8 dot, [a8; 1...1] @ b8: summed on
        # their own, XLA converts b to int32 first, a 4x copy of every weight on every call
        # (int8 MiniLM: 33 ms a call, against 20 ms this way).
        ones = jnp.ones(a8.shape[:-2] + (1, a8.shape[-1]), jnp.int8)
        both = jnp.matmul(
            jnp.concatenate([a8, ones], axis=-2), b8, preferred_element_type=jnp.int32
        )
        acc = both[..., :-1, :] - za * both[..., -1:, :]
    if zb is not None:
        acc = acc - zb * jnp.sum(a8, axis=-1, keepdims=True, dtype=jnp.int32)
    if za is not None and zb is not None:
        acc = acc + a.shape[-1] * za * zb
    return acc


def _offset_zero(zero, offset: int):
    """zero - offset in int32, or None when that is 0 for certain."""
    if zero is None:
        return None if offset == 0 else jnp.int32(-offset)
    return jnp.asarray(zero).astype(jnp.int32) - offset


@op("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """ONNX MatMulInteger-10: (A - a_zero_point) @ (B - b_zero_point) accumulated in int32."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    za = None if a_zero_point is None else _row_zero(a_zero_point, a, "MatMulInteger a_zero_point")
    zb = None if b_zero_point is None else _col_zero(b_zero_point, b, "MatMulInteger b_zero_point")
    return integer_matmul(a, b, za, zb)


def requantize(acc, multiplier, y_zero_point):
    """acc * multiplier quantized to y_zero_point's type (QLinear* outputs).

    As ONNX Runtime's MlasRequantizeOutput: float32(acc) * multiplier in float32, rounded half to
    even, then the zero point added and saturated. The multiplier is a_scale * b_scale / y_scale
    in that order, one float32 division (`divide`: XLA would multiply by a reciprocal); the spec
    gives only the real-number formula, whose other orders round differently."""
    y_zero_point = jnp.asarray(y_zero_point)
    target = np.dtype(y_zero_point.dtype)
    value = acc.astype(jnp.float32) * multiplier
    if target in INT_RANGES:
        low, high = INT_RANGES[target]
        value = jnp.round(value) + y_zero_point.astype(jnp.float32)
        return jnp.clip(value, low, high).astype(target)
    if target not in dtypes.FLOAT8:
        raise ValueError(f"the output zero point has type {target}, not a quantized type")
    return _saturate_cast(_plus_float_zero(value, y_zero_point), target, 1)


@op("QLinearMatMul", since=(10, 21))
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """ONNX QLinearMatMul-10/21: quantized matmul; 21 adds float8 types and half scales."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    za = _row_zero(a_zero_point, a, "QLinearMatMul a_zero_point")
    zb = _col_zero(b_zero_point, b, "QLinearMatMul b_zero_point")
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        acc = integer_matmul(a, b, za, zb)
    else:
        acc = jnp.matmul(
            _shifted(a, za, False), _shifted(b, zb, False), precision=lax.Precision.HIGHEST
        )
    a_scale = _to_float(_row_zero(a_scale, a, "QLinearMatMul a_scale"))
    b_scale = _to_float(_col_zero(b_scale, b, "QLinearMatMul b_scale"))
    # The shape of a per-row scale is (..., M, 1) and of a per-column one (..., 1, N) or (N,):
    # their product broadcasts over the (..., M, N) result.
    multiplier = divide(a_scale * b_scale, jnp.asarray(y_scale).reshape(()), _F32)
    return requantize(acc, multiplier, y_zero_point)


def _require_eight_bit(op_type: str, x, w) -> None:
    for name, value in (("X", x), ("W", w)):
        if value.dtype not in _EIGHT_BIT:
            raise ValueError(f"{op_type}: {name} must be int8 or uint8, got {value.dtype}")


def _conv_window(op_type, x, w, kernel_shape, group, strides, dilations, pads, auto_pad):
    """Checked shapes and explicit (begin, end) pads of an integer convolution."""
    rank = x.ndim - 2
    if rank < 1 or w.ndim != x.ndim:
        raise ShapeError(
            f"{op_type}: X must be (N, C, D1, ...) and W of the same rank, got {x.shape} and {w.shape}"
        )
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise ShapeError(
            f"{op_type}: X has {x.shape[1]} channels and W {w.shape[0]} filters of {w.shape[1]} "
            f"channels; both must fit group {group}"
        )
    if kernel_shape is not None and tuple(kernel_shape) != tuple(w.shape[2:]):
        raise ShapeError(
            f"{op_type}: kernel_shape {tuple(kernel_shape)} does not match W's spatial shape "
            f"{tuple(w.shape[2:])}"
        )
    strides, dilations, pad_pairs = spatial_attrs(op_type, rank, strides, dilations, pads, auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pad_pairs = tuple(
            same_pads(n, (k - 1) * d + 1, s, auto_pad == "SAME_UPPER")
            for n, k, s, d in zip(x.shape[2:], w.shape[2:], strides, dilations, strict=True)
        )
    elif auto_pad == "VALID":
        pad_pairs = ((0, 0),) * rank
    return strides, dilations, pad_pairs


def _tap_windows(x, kernel, strides, dilations):
    """The output's spatial sizes over padded x (spatial dims last) and, for each kernel tap in
    W's row-major order, (tap, the strided window of x that the tap multiplies); no windows
    when the kernel leaves no output positions."""
    rank = len(kernel)
    lead, sizes = x.shape[:-rank], x.shape[-rank:]
    outs = [
        max((size - (k - 1) * d - 1) // s + 1, 0)
        for size, k, s, d in zip(sizes, kernel, strides, dilations, strict=True)
    ]
    if 0 in outs:
        return outs, []
    ones, zeros = (1,) * len(lead), (0,) * len(lead)
    windows = []
    for tap in itertools.product(*(range(k) for k in kernel)):
        start = [t * d for t, d in zip(tap, dilations, strict=True)]
        stop = [b + (o - 1) * s + 1 for b, o, s in zip(start, outs, strides, strict=True)]
        windows.append((tap, lax.slice(x, (*zeros, *start), (*lead, *stop), (*ones, *strides))))
    return outs, windows


def _conv_by_taps(x, w, strides, dilations, pad_pairs, group):
    """An int32 convolution as a sum of one matmul per kernel tap, for backends without integer
    convolutions (XLA:GPU rejects them)."""
    rank = x.ndim - 2
    x = jnp.pad(x, ((0, 0), (0, 0)) + tuple(pad_pairs))
    n, _, *sizes = x.shape
    filters, per_group, *kernel = w.shape
    xg = x.reshape((n, group, per_group, *sizes))
    wg = w.reshape((group, filters // group, per_group, *kernel))
    outs, windows = _tap_windows(xg, kernel, strides, dilations)
    y = jnp.zeros((n, group, filters // group, *outs), jnp.int32)
    spatial = "hijkl"[:rank]
    for tap, window in windows:
        y = y + jnp.einsum(
            f"ngc{spatial},gmc->ngm{spatial}",
            window,
            wg[(slice(None),) * 3 + tap],
            preferred_element_type=jnp.int32,
        )
    return y.reshape((n, filters, *outs))


def _conv_by_int8_dot(x, w, zx, zw, strides, dilations, pad_pairs, group):
    """(x - zx) convolved with (w - zw), 8-bit x and w, as one int8 x int8 -> int32 dot of the
    filters with x's patches (im2col), exact: XLA:CPU's integer convolution is a plain loop,
    and float32 convolutions exact for 8-bit values take two (the filters' high and low
    halves). On the real Kokoro-82M's generator convolution ([1, 128, 30721], 11 taps,
    dilation 5) this is 21 ms of patches and 75 ms of dot, against 135 ms for the two float32
    convolutions (bench/README.md, "The real Kokoro-82M int8").

    The patches are padded with x's zero point, as ONNX Runtime pads, so padding adds nothing,
    and written tap by tap into one buffer (dynamic_update_slice: XLA:CPU stacks the strided
    slices 2.5x slower). Their int8 size is the kernel's tap count times x's."""
    rank = x.ndim - 2
    x8, x_offset = _as_int8(x)
    zx8 = _offset_zero(zx, x_offset)  # x's zero point in x8's encoding
    pad_value = jnp.int8(0) if zx8 is None else zx8.astype(jnp.int8)
    x8 = lax.pad(x8, pad_value, ((0, 0, 0), (0, 0, 0)) + tuple((b, e, 0) for b, e in pad_pairs))
    n, channels = x8.shape[:2]
    filters, per_group, *kernel = w.shape
    outs, windows = _tap_windows(x8, kernel, strides, dilations)
    if not windows:
        return jnp.zeros((n, filters, *outs), jnp.int32)
    cols = jnp.zeros((n, channels, len(windows), *outs), jnp.int8)
    for i, (_, window) in enumerate(windows):
        cols = lax.dynamic_update_slice(cols, window[:, :, None], (0, 0, i) + (0,) * rank)
    # [N, G, Cg * taps, positions] against [G, Fg, Cg * taps]: W's (channel, tap) order.
    cols = cols.reshape((n, group, per_group * len(windows), math.prod(outs)))
    rows = w.reshape((group, filters // group, per_group * len(windows)))
    if zw is not None and zw.ndim:
        zw = zw.reshape((group, filters // group, 1))
    acc = integer_matmul(rows, cols, zw, zx8)
    return acc.reshape((n, filters, *outs))


def _conv_int32(x, w, zx, zw, strides, dilations, pad_pairs, group):
    """The int32 convolution of (x - zx) and (w - zw), 8-bit x and w (zx a scalar or None, zw
    a scalar, one value per filter or None): int8 dots over x's patches on CPU, XLA's integer
    convolution on TPU, one product per tap elsewhere."""

    def patches(x, w):
        return _conv_by_int8_dot(x, w, zx, zw, strides, dilations, pad_pairs, group)

    def direct(x, w):
        return lax.conv_general_dilated(
            _shifted(x, zx, True),
            _shifted(w, zw, True),
            window_strides=strides,
            padding=pad_pairs,
            rhs_dilation=dilations,
            feature_group_count=group,
            preferred_element_type=jnp.int32,
        )

    def taps(x, w):
        x, w = _shifted(x, zx, True), _shifted(w, zw, True)
        return _conv_by_taps(x, w, strides, dilations, pad_pairs, group)

    return platform_dependent(x, w, cpu=patches, tpu=direct, default=taps)


def _filter_zero(zero, w, what: str):
    """W's zero point (or scale): a scalar or one value per output channel."""
    zero = jnp.asarray(zero)
    if zero.size == 1:
        return zero.reshape(())
    if zero.ndim != 1 or zero.shape[0] != w.shape[0]:
        raise ShapeError(
            f"{what}: expected a scalar or {w.shape[0]} values (one per output channel), got shape {zero.shape}"
        )
    return zero.reshape((-1,) + (1,) * (w.ndim - 1))


@op("ConvInteger", since=10)
def conv_integer(
    x,
    w,
    x_zero_point=None,
    w_zero_point=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """ONNX ConvInteger-10: Conv of (x - x_zero_point) and (w - w_zero_point) in int32."""
    x, w = jnp.asarray(x), jnp.asarray(w)
    _require_eight_bit("ConvInteger", x, w)
    window = _conv_window(
        "ConvInteger", x, w, kernel_shape, group, strides, dilations, pads, auto_pad
    )
    _require_scalar(x_zero_point, "ConvInteger x_zero_point")
    zx = None if x_zero_point is None else jnp.asarray(x_zero_point).reshape(())
    zw = None if w_zero_point is None else _filter_zero(w_zero_point, w, "ConvInteger w_zero_point")
    return _conv_int32(x, w, zx, zw, *window, group)


@op("QLinearConv", since=10)
def qlinear_conv(
    x,
    x_scale,
    x_zero_point,
    w,
    w_scale,
    w_zero_point,
    y_scale,
    y_zero_point,
    b=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """ONNX QLinearConv-10: quantized Conv with an int32 bias (scale x_scale * w_scale)."""
    x, w = jnp.asarray(x), jnp.asarray(w)
    _require_eight_bit("QLinearConv", x, w)
    window = _conv_window(
        "QLinearConv", x, w, kernel_shape, group, strides, dilations, pads, auto_pad
    )
    for value, what in (
        (x_scale, "x_scale"),
        (x_zero_point, "x_zero_point"),
        (y_scale, "y_scale"),
        (y_zero_point, "y_zero_point"),
    ):
        _require_scalar(value, f"QLinearConv {what}")
    zx = jnp.asarray(x_zero_point).reshape(())
    zw = _filter_zero(w_zero_point, w, "QLinearConv w_zero_point")
    acc = _conv_int32(x, w, zx, zw, *window, group)
    channel = (1, -1) + (1,) * (x.ndim - 2)
    if b is not None:
        acc = acc + jnp.asarray(b).astype(jnp.int32).reshape(channel)
    w_scale = _to_float(_filter_zero(w_scale, w, "QLinearConv w_scale")).reshape(
        () if np.size(w_scale) == 1 else channel
    )
    multiplier = divide(
        _to_float(jnp.asarray(x_scale).reshape(())) * w_scale,
        jnp.asarray(y_scale).reshape(()),
        _F32,
    )
    return requantize(acc, multiplier, jnp.asarray(y_zero_point).reshape(()))
