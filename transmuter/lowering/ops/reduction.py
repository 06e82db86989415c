"""Reductions and normalizations along axes: ReduceSum and its family, ArgMax/ArgMin,
Softmax/LogSoftmax/Hardmax, CumSum/CumProd, TopK and LpNormalization.

The Reduce operators take `axes` as an attribute up to a version (ReduceSum-11, the others 13)
and as a host input after it, with `noop_with_empty_axes`. Sums, products, norms and softmax of
float16/bfloat16 accumulate in float32 and round once at the end; transcendental reductions of
integer inputs (ReduceL2, ReduceLogSum, ReduceLogSumExp) compute in float64 and truncate back.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter import dtypes
from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import Attribute, op, variant
from transmuter.lowering.shared import (
    arg_extreme,
    host_ints,
    host_scalar,
    normalize_axis,
    snake_case,
)

# -------------------------------------------------------------------------------- Reduce*


def _sum(x, axes, keepdims):
    wide = accumulation_dtype(x.dtype)
    return jnp.sum(x, axis=axes, keepdims=keepdims, dtype=wide).astype(x.dtype)


def _mean(x, axes, keepdims):
    if dtypes.is_float(x.dtype):
        wide = accumulation_dtype(x.dtype)
        return jnp.mean(x, axis=axes, keepdims=keepdims, dtype=wide).astype(x.dtype)
    # Integer means truncate toward zero, like ONNX Runtime's integer division.
    total = jnp.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)
    count = math.prod(x.shape[a] for a in axes)
    return lax.div(total, jnp.full(total.shape, count, x.dtype))


def _extreme(x, *, largest: bool):
    """The identity of max (largest=False) or min: -inf/+inf, or the type's limits."""
    dtype = np.dtype(x.dtype)
    if dtype == np.bool_:
        # False < True (ReduceMax-20): an empty max is False, an empty min True.
        return largest
    if dtypes.is_float(dtype):
        return math.inf if largest else -math.inf
    info = jnp.iinfo(dtype)
    return info.max if largest else info.min


def _max(x, axes, keepdims):
    # The identity as initial value makes an empty reduction -inf (or the type's minimum).
    return jnp.max(x, axis=axes, keepdims=keepdims, initial=_extreme(x, largest=False))


def _min(x, axes, keepdims):
    return jnp.min(x, axis=axes, keepdims=keepdims, initial=_extreme(x, largest=True))


def _prod(x, axes, keepdims):
    wide = accumulation_dtype(x.dtype)
    return jnp.prod(x, axis=axes, keepdims=keepdims, dtype=wide).astype(x.dtype)


def _l1(x, axes, keepdims):
    return _sum(jnp.abs(x), axes, keepdims)


def _sum_square(x, axes, keepdims):
    wide = x.astype(accumulation_dtype(x.dtype))
    return jnp.sum(wide * wide, axis=axes, keepdims=keepdims).astype(x.dtype)


def _l2(x, axes, keepdims):
    wide = x.astype(accumulation_dtype(x.dtype, real=True))
    return jnp.sqrt(jnp.sum(wide * wide, axis=axes, keepdims=keepdims)).astype(x.dtype)


def _log_sum(x, axes, keepdims):
    wide = x.astype(accumulation_dtype(x.dtype, real=True))
    return jnp.log(jnp.sum(wide, axis=axes, keepdims=keepdims)).astype(x.dtype)


def _log_sum_exp(x, axes, keepdims):
    wide = x.astype(accumulation_dtype(x.dtype, real=True))
    peak = jnp.max(wide, axis=axes, keepdims=True, initial=-math.inf)
    # Shifting by the maximum avoids overflow; an all -inf (or empty) slice shifts by 0.
    peak = jnp.where(jnp.isfinite(peak), peak, 0)
    total = jnp.sum(jnp.exp(wide - peak), axis=axes, keepdims=True)
    result = jnp.log(total) + peak
    if not keepdims:
        result = jnp.squeeze(result, axis=axes)
    return result.astype(x.dtype)


def _reduce(kernel, data, axes, keepdims: int, noop_with_empty_axes: int = 0):
    if axes is None or len(axes) == 0:
        # With noop_with_empty_axes the reduction is over no axes: composite reductions still
        # apply their elementwise steps (ReduceSumSquare squares, ReduceLogSum takes the log).
        axes = () if noop_with_empty_axes else range(data.ndim)
    normalized = tuple(normalize_axis(int(a), data.ndim, "axes") for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ShapeError(f"axes {list(axes)} name the same axis twice")
    return kernel(data, normalized, bool(keepdims))


def _with_attribute(name: str, kernel):
    def lowering(data, *, axes=None, keepdims=1):
        return _reduce(kernel, data, axes, keepdims)

    lowering.__name__ = lowering.__qualname__ = f"{snake_case(name)}_v1"
    lowering.__doc__ = f"ONNX {name}: reduce over the `axes` attribute (all axes if absent)."
    return lowering


def _with_input(name: str, kernel):
    def lowering(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        axes = None if axes is None else host_ints(axes)
        return _reduce(kernel, data, axes, keepdims, noop_with_empty_axes)

    lowering.__name__ = lowering.__qualname__ = snake_case(name)
    lowering.__doc__ = f"ONNX {name}: reduce over the `axes` input; empty means all, or none."
    return lowering


_REDUCTIONS = (
    ("ReduceSum", (1, 11), (13,), _sum),
    ("ReduceMean", (1, 11, 13), (18,), _mean),
    ("ReduceMax", (1, 11, 12, 13), (18, 20), _max),
    ("ReduceMin", (1, 11, 12, 13), (18, 20), _min),
    ("ReduceProd", (1, 11, 13), (18,), _prod),
    ("ReduceL1", (1, 11, 13), (18,), _l1),
    ("ReduceL2", (1, 11, 13), (18,), _l2),
    ("ReduceLogSum", (1, 11, 13), (18, 28), _log_sum),
    ("ReduceLogSumExp", (1, 11, 13), (18, 28), _log_sum_exp),
    ("ReduceSumSquare", (1, 11, 13), (18,), _sum_square),
)

for _name, _attribute_versions, _input_versions, _kernel in _REDUCTIONS:
    op(_name, since=_attribute_versions)(_with_attribute(_name, _kernel))
    op(_name, since=_input_versions, host_inputs={"axes": "the axes to reduce"})(
        _with_input(_name, _kernel)
    )


# --------------------------------------------------------------------------- ArgMax/ArgMin


def _arg(largest: bool, data, axis: int, keepdims: int, select_last_index: int):
    axis = normalize_axis(axis, data.ndim)
    if data.shape[axis] == 0:
        raise ShapeError(
            f"Arg{'Max' if largest else 'Min'}: axis {axis} of input shape {list(data.shape)} is "
            "empty, so it has no extreme"
        )
    if select_last_index:
        # The first extreme of the reversed axis is the last one of the original.
        data = jnp.flip(data, axis)
    found = arg_extreme(data, axis, largest)  # not jnp.argmax (see arg_extreme)
    if select_last_index:
        found = data.shape[axis] - 1 - found
    return jnp.expand_dims(found, axis) if keepdims else found


@op("ArgMax", since=(12, 13))
def arg_max(data, *, axis=0, keepdims=1, select_last_index=0):
    """ONNX ArgMax-12..13: int64 index of the first (or last) maximum along `axis`."""
    return _arg(True, data, axis, keepdims, select_last_index)


@op("ArgMin", since=(12, 13))
def arg_min(data, *, axis=0, keepdims=1, select_last_index=0):
    """ONNX ArgMin-12..13: int64 index of the first (or last) minimum along `axis`."""
    return _arg(False, data, axis, keepdims, select_last_index)


arg_max_v1 = op("ArgMax", since=(1, 11))(variant(
    arg_max, "arg_max_v1", "ONNX ArgMax-1..11: int64 index of the first maximum along `axis`.",
    fixed={"select_last_index": 0},
))  # fmt: skip
arg_min_v1 = op("ArgMin", since=(1, 11))(variant(
    arg_min, "arg_min_v1", "ONNX ArgMin-1..11: int64 index of the first minimum along `axis`.",
    fixed={"select_last_index": 0},
))  # fmt: skip


# ------------------------------------------------------------------ Softmax, LogSoftmax, Hardmax


def _softmax(x, axis):
    return jax.nn.softmax(x.astype(accumulation_dtype(x.dtype)), axis=axis).astype(x.dtype)


def _log_softmax(x, axis):
    return jax.nn.log_softmax(x.astype(accumulation_dtype(x.dtype)), axis=axis).astype(x.dtype)


def _hardmax(x, axis):
    if x.shape[axis] == 0:
        return x
    first_max = arg_extreme(x, axis)
    return jax.nn.one_hot(first_max, x.shape[axis], axis=axis, dtype=x.dtype)


def _on_2d(fn, input, axis: int):
    """Opset 1/11 semantics: coerce to 2-D [prod(dims before axis), prod(dims from axis)] and
    normalize each row."""
    axis = normalize_axis(axis, input.ndim)
    rows = math.prod(input.shape[:axis])
    flat = jnp.reshape(input, (rows, math.prod(input.shape[axis:])))
    return jnp.reshape(fn(flat, 1), input.shape)


def _normalizer(name: str, fn, coerce_2d: bool):
    if coerce_2d:

        def lowering(input, *, axis=1):
            return _on_2d(fn, input, axis)
    else:

        def lowering(input, *, axis=-1):
            return fn(input, normalize_axis(axis, input.ndim))

    lowering.__name__ = lowering.__qualname__ = (
        f"{snake_case(name)}_v1" if coerce_2d else snake_case(name)
    )
    lowering.__doc__ = (
        f"ONNX {name}-1..11: over the input coerced to 2-D at `axis`."
        if coerce_2d
        else f"ONNX {name}-13: along the single axis `axis`."
    )
    return lowering


for _name, _fn in (("Softmax", _softmax), ("LogSoftmax", _log_softmax), ("Hardmax", _hardmax)):
    op(_name, since=(1, 11))(_normalizer(_name, _fn, coerce_2d=True))
    op(_name, since=13)(_normalizer(_name, _fn, coerce_2d=False))


# ----------------------------------------------------------------------------- CumSum, CumProd


def _cumulative(scan, identity: int, x, axis, exclusive: int, reverse: int):
    axis = normalize_axis(int(host_scalar(axis, "axis")), x.ndim)
    y = jnp.flip(x, axis) if reverse else x
    y = scan(y, axis=axis, dtype=accumulation_dtype(x.dtype))
    if exclusive:
        # Shift by one along the axis: [identity, y0, y1, ...] keeps the original length.
        widths = [(0, 0)] * x.ndim
        widths[axis] = (1, 0)
        y = lax.slice_in_dim(
            jnp.pad(y, widths, constant_values=identity), 0, x.shape[axis], axis=axis
        )
    y = jnp.flip(y, axis) if reverse else y
    return y.astype(x.dtype)


@op("CumSum", since=(11, 14), host_inputs={"axis": "the axis to accumulate along"})
def cum_sum(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumSum-11..14: running sum along `axis`, optionally exclusive and/or reversed."""
    return _cumulative(jnp.cumsum, 0, x, axis, exclusive, reverse)


@op("CumProd", since=26, host_inputs={"axis": "the axis to accumulate along"})
def cum_prod(x, axis, *, exclusive=0, reverse=0):
    """ONNX CumProd-26: running product along `axis`, optionally exclusive and/or reversed."""
    return _cumulative(jnp.cumprod, 1, x, axis, exclusive, reverse)


# ------------------------------------------------------------------------------------ TopK


def _top_k(X, k: int, axis: int, largest: int):
    axis = normalize_axis(axis, X.ndim)
    if not 0 <= k <= X.shape[axis]:
        raise ShapeError(f"TopK k={k} is outside [0, {X.shape[axis]}] (the size of axis {axis})")
    key = X
    if not largest:
        # An order-reversing key keeps lax.top_k's tie rule (lower index first); bitwise not
        # reverses integers without the overflow of negation.
        key = -X if dtypes.is_float(X.dtype) else jnp.bitwise_not(X)
    _, indices = lax.top_k(key, k, axis=axis)
    return jnp.take_along_axis(X, indices, axis=axis), indices.astype(jnp.int64)


@op("TopK", since=(11, 24), host_inputs={"K": "the number of elements to keep"})
def top_k(X, K, *, axis=-1, largest=1, sorted=1):
    """ONNX TopK-11..24: the K largest (or smallest) values along `axis`, sorted, with int64
    indices; ties keep the lower index first."""
    # sorted=0 leaves the order unspecified; the sorted order is one valid answer.
    return _top_k(X, int(host_scalar(K, "K")), axis, largest)


top_k_v10 = op("TopK", since=10, host_inputs={"K": "the number of elements to keep"})(variant(
    top_k, "top_k_v10", "ONNX TopK-10: the K largest values along `axis` and their int64 indices.",
    fixed={"largest": 1, "sorted": 1},
))  # fmt: skip
top_k_v1 = op("TopK", since=1)(variant(
    top_k_v10, "top_k_v1", "ONNX TopK-1: TopK-10 with K the attribute k.",
    attributes={"K": Attribute("k")},
))  # fmt: skip


# ------------------------------------------------------------------------- LpNormalization


@op("LpNormalization", since=(1, 22))
def lp_normalization(input, *, axis=-1, p=2):
    """ONNX LpNormalization-1..22: x / ||x||_p along `axis` (p = 1 or 2); zero norms give 0."""
    axis = normalize_axis(axis, input.ndim)
    wide = input.astype(accumulation_dtype(input.dtype))
    if p == 1:
        norm = jnp.sum(jnp.abs(wide), axis=axis, keepdims=True)
    elif p == 2:
        norm = jnp.sqrt(jnp.sum(wide * wide, axis=axis, keepdims=True))
    else:
        raise ValueError(f"LpNormalization p must be 1 or 2, got {p}")
    safe = jnp.where(norm == 0, 1, norm)
    return jnp.where(norm == 0, 0, wide / safe).astype(input.dtype)
