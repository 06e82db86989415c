"""Normalizations: Batch, Layer, Group, Instance, MeanVariance, LRN and RMS.

Statistics of float16/bfloat16 inputs are computed in float32 (or the node's stash_type) and the
result is cast back once, at the end.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter import dtypes
from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError, UnsupportedOpError
from transmuter.lowering import REQUIRED, op, variant
from transmuter.lowering.shared import broadcast_unidirectional


def stash_dtype(op_type: str, stash_type: int) -> np.dtype:
    """The float type a `stash_type` attribute names."""
    dtype = dtypes.from_onnx(stash_type)
    if not dtypes.is_float(dtype):
        raise ValueError(
            f"{op_type}: stash_type must name a float type, got {stash_type} ({dtype})"
        )
    return dtype


def _channel_shaped(op_type: str, name: str, value, x, dtype):
    """A per-channel (C,) parameter shaped to broadcast against X (N, C, D1, ...)."""
    value = jnp.asarray(value)
    if value.shape != (x.shape[1],):
        raise ShapeError(
            f"{op_type}: {name} must have shape ({x.shape[1]},) for X {x.shape}, got {value.shape}"
        )
    return value.astype(dtype).reshape((1, -1) + (1,) * (x.ndim - 2))


def standardize(x, axes, epsilon, dtype):
    """(x - mean) / sqrt(var + epsilon) over `axes`, in `dtype`; also the mean and 1/stddev."""
    x = x.astype(dtype)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=axes, keepdims=True)
    inv_std = lax.rsqrt(var + jnp.asarray(epsilon, dtype))
    return centered * inv_std, mean, inv_std


def _batch_norm(ctx, x, scale, b, mean, var, epsilon, spatial=1):
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ShapeError(f"BatchNormalization: X must be (N, C, ...), got shape {x.shape}")
    if any(ctx.wants(i) for i in range(1, ctx.num_outputs)):
        raise UnsupportedOpError(
            "", "BatchNormalization", ctx.opset, ctx.node.label,
            "training mode (the running or saved statistics outputs) is not supported; "
            "export the model in inference mode",
        )  # fmt: skip
    dtype = accumulation_dtype(x.dtype)
    if spatial:
        params = [_channel_shaped("BatchNormalization", n, v, x, dtype)
                  for n, v in (("scale", scale), ("B", b), ("mean", mean), ("var", var))]  # fmt: skip
    else:
        # Per-activation statistics (spatial=0) have X's shape without the batch axis.
        params = [
            jnp.broadcast_to(jnp.asarray(v).astype(dtype), x.shape[1:])[None]
            for v in (scale, b, mean, var)
        ]
    scale, b, mean, var = params
    y = (x.astype(dtype) - mean) * (scale * lax.rsqrt(var + jnp.asarray(epsilon, dtype))) + b
    return y.astype(x.dtype)


@op("BatchNormalization", since=7, context=True)
def batch_normalization_v7(ctx, x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1):
    """ONNX BatchNormalization-7 in inference mode: (x - mean) / sqrt(var + eps) * scale + B."""
    return _batch_norm(ctx, x, scale, b, mean, var, epsilon, spatial)


# Versions 1-6 mark inference with is_test; ONNX Runtime (and exporters, which set is_test=1)
# treat a node that asks only for Y as inference whatever is_test says, and so does this.
batch_normalization_v6 = op("BatchNormalization", since=6, context=True)(variant(
    batch_normalization_v7, "batch_normalization_v6",
    "ONNX BatchNormalization-6 in inference mode: BatchNormalization-7 plus is_test.",
    ignored={"is_test": 0},
))  # fmt: skip
batch_normalization_v1 = op("BatchNormalization", since=1, context=True)(variant(
    batch_normalization_v6, "batch_normalization_v1",
    "ONNX BatchNormalization-1 in inference mode: BatchNormalization-6 plus consumed_inputs.",
    ignored={"consumed_inputs": REQUIRED},
))  # fmt: skip


@op("BatchNormalization", since=(14, 15), context=True)
def batch_normalization_v14(
    ctx, x, scale, b, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0
):
    """ONNX BatchNormalization-14..15: normalize with the given statistics, or (training_mode=1)
    with the batch's and also return the momentum-updated running mean and variance."""
    if training_mode:
        return _batch_norm_training(x, scale, b, input_mean, input_var, epsilon, momentum)
    return _batch_norm(ctx, x, scale, b, input_mean, input_var, epsilon)


batch_normalization_v9 = op("BatchNormalization", since=9, context=True)(variant(
    batch_normalization_v14, "batch_normalization_v9",
    "ONNX BatchNormalization-9 in inference mode: BatchNormalization-14 without training_mode.",
    fixed={"training_mode": 0},
))  # fmt: skip


def _batch_norm_training(x, scale, b, input_mean, input_var, epsilon, momentum):
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ShapeError(f"BatchNormalization: X must be (N, C, ...), got shape {x.shape}")
    # The batch statistics (population variance) are computed in float32 for half inputs, as
    # BatchNormalization-15 asks.
    dtype = accumulation_dtype(x.dtype)
    axes = (0,) + tuple(range(2, x.ndim))
    wide = x.astype(dtype)
    mean = jnp.mean(wide, axis=axes, keepdims=True)
    centered = wide - mean
    var = jnp.mean(centered * centered, axis=axes, keepdims=True)
    scale = _channel_shaped("BatchNormalization", "scale", scale, x, dtype)
    b = _channel_shaped("BatchNormalization", "B", b, x, dtype)
    y = centered * (scale * lax.rsqrt(var + jnp.asarray(epsilon, dtype))) + b
    # running_mean and running_var have input_mean's type (U in version 14, T2 in 15).
    stats_dtype = jnp.asarray(input_mean).dtype
    wide = accumulation_dtype(jnp.asarray(input_mean).dtype)
    keep = jnp.asarray(momentum, wide)
    running = []
    for name, given, current in (("input_mean", input_mean, mean), ("input_var", input_var, var)):
        given = _channel_shaped("BatchNormalization", name, given, x, wide).reshape(-1)
        updated = given * keep + current.reshape(-1).astype(wide) * (1 - keep)
        running.append(updated.astype(stats_dtype))
    return (y.astype(x.dtype), *running)


def normalized_axes(op_type: str, x, axis: int) -> tuple[int, ...]:
    """The axes from `axis` to the last, which a layer normalization normalizes over."""
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"{op_type}: axis {axis} is out of range for X of rank {x.ndim}")
    return tuple(range(axis % x.ndim, x.ndim))


@op("LayerNormalization", since=17)
def layer_normalization(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX LayerNormalization-17: standardize axes [axis, rank) in stash_type, then scale and shift."""
    x = jnp.asarray(x)
    axes = normalized_axes("LayerNormalization", x, axis)
    stash = stash_dtype("LayerNormalization", stash_type)
    normalized, mean, inv_std = standardize(x, axes, epsilon, stash)
    dtype = accumulation_dtype(x.dtype)
    y = normalized.astype(dtype) * broadcast_unidirectional(
        scale, x.shape, "LayerNormalization Scale"
    ).astype(dtype)
    if b is not None:
        y = y + broadcast_unidirectional(b, x.shape, "LayerNormalization B").astype(dtype)
    return y.astype(x.dtype), mean, inv_std


def group_normalize(x, scale, bias, num_groups, epsilon, stash, per_channel: bool):
    x = jnp.asarray(x)
    if x.ndim < 2 or num_groups <= 0 or x.shape[1] % num_groups:
        raise ShapeError(
            f"GroupNormalization: num_groups {num_groups} must divide the channels of X {x.shape}"
        )
    grouped = x.reshape((x.shape[0], num_groups, -1) + x.shape[2:])
    normalized, _, _ = standardize(grouped, tuple(range(2, grouped.ndim)), epsilon, stash)
    dtype = accumulation_dtype(x.dtype)
    normalized = normalized.astype(dtype)
    if per_channel:
        normalized = normalized.reshape(x.shape)
        y = normalized * _channel_shaped("GroupNormalization", "scale", scale, x, dtype)
        y = y + _channel_shaped("GroupNormalization", "bias", bias, x, dtype)
    else:
        groups = (1, num_groups) + (1,) * (grouped.ndim - 2)
        for name, value in (("scale", scale), ("bias", bias)):
            if jnp.shape(value) != (num_groups,):
                raise ShapeError(
                    f"GroupNormalization-18: {name} must have shape ({num_groups},), got {jnp.shape(value)}"
                )
        y = normalized * jnp.asarray(scale).astype(dtype).reshape(groups)
        y = (y + jnp.asarray(bias).astype(dtype).reshape(groups)).reshape(x.shape)
    return y.astype(x.dtype)


@op("GroupNormalization", since=18)
def group_normalization_v18(x, scale, bias, *, epsilon=1e-5, num_groups):
    """ONNX GroupNormalization-18: normalize per group of channels; scale and bias per group."""
    x = jnp.asarray(x)
    return group_normalize(
        x, scale, bias, num_groups, epsilon, accumulation_dtype(x.dtype), per_channel=False
    )


@op("GroupNormalization", since=21)
def group_normalization_v21(x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1):
    """ONNX GroupNormalization-21: normalize per group of channels; scale and bias per channel."""
    stash = stash_dtype("GroupNormalization", stash_type)
    return group_normalize(x, scale, bias, num_groups, epsilon, stash, per_channel=True)


def _instance_norm(x, scale, b, epsilon):
    x = jnp.asarray(x)
    if x.ndim < 3:
        raise ShapeError(
            f"InstanceNormalization: input must be (N, C, D1, ...), got shape {x.shape}"
        )
    dtype = accumulation_dtype(x.dtype)
    normalized, _, _ = standardize(x, tuple(range(2, x.ndim)), epsilon, dtype)
    y = normalized * _channel_shaped("InstanceNormalization", "scale", scale, x, dtype)
    return (y + _channel_shaped("InstanceNormalization", "B", b, x, dtype)).astype(x.dtype)


@op("InstanceNormalization", since=(6, 22))
def instance_normalization_v6(x, scale, b, *, epsilon=1e-5):
    """ONNX InstanceNormalization-6..22: normalize each (n, c) over the spatial axes."""
    return _instance_norm(x, scale, b, epsilon)


instance_normalization_v1 = op("InstanceNormalization", since=1)(variant(
    instance_normalization_v6, "instance_normalization_v1",
    "ONNX InstanceNormalization-1: InstanceNormalization-6 plus consumed_inputs.",
    ignored={"consumed_inputs": None},
))  # fmt: skip


@op("MeanVarianceNormalization", since=(9, 13))
def mean_variance_normalization(x, *, axes=(0, 2, 3)):
    """ONNX MeanVarianceNormalization-9..13: (X - E[X]) / (sqrt(Var[X]) + 1e-9) over axes."""
    x = jnp.asarray(x)
    axes = tuple(a % x.ndim for a in axes)
    data = x.astype(accumulation_dtype(x.dtype))
    mean = jnp.mean(data, axis=axes, keepdims=True)
    centered = data - mean
    # The function body computes E[X^2] - E[X]^2; the centered form is the same value without
    # its cancellation (which can go negative and give NaN).
    std = jnp.sqrt(jnp.mean(centered * centered, axis=axes, keepdims=True))
    return (centered / (std + jnp.asarray(1e-9, data.dtype))).astype(x.dtype)


@op("LRN", since=(1, 13))
def lrn(x, *, alpha=1e-4, beta=0.75, bias=1.0, size):
    """ONNX LRN-1..13: x / (bias + alpha / size * sum of squares over nearby channels) ** beta."""
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ShapeError(f"LRN: X must be (N, C, ...), got shape {x.shape}")
    data = x.astype(accumulation_dtype(x.dtype))
    before = (size - 1) // 2
    square_sum = lax.reduce_window(
        data * data,
        # A numpy init value: a jnp one is a tracer under jit, and JAX then picks a generic
        # window reduction that has no reverse-mode rule.
        np.array(0, data.dtype),
        lax.add,
        window_dimensions=(1, size) + (1,) * (x.ndim - 2),
        window_strides=(1,) * x.ndim,
        padding=((0, 0), (before, size - 1 - before)) + ((0, 0),) * (x.ndim - 2),
    )
    denominator = (bias + (alpha / size) * square_sum) ** jnp.asarray(beta, data.dtype)
    return (data / denominator).astype(x.dtype)


@op("RMSNormalization", since=23)
def rms_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """ONNX RMSNormalization-23: x / sqrt(mean(x^2) + eps) over axes [axis, rank), times scale."""
    x = jnp.asarray(x)
    scale = broadcast_unidirectional(scale, x.shape, "RMSNormalization scale")
    axes = normalized_axes("RMSNormalization", x, axis)
    data = x.astype(stash_dtype("RMSNormalization", stash_type))
    normalized = data * lax.rsqrt(
        jnp.mean(data * data, axis=axes, keepdims=True) + jnp.asarray(epsilon, data.dtype)
    )
    wide = np.dtype(np.float64) in (np.dtype(x.dtype), np.dtype(scale.dtype))
    dtype = np.dtype(np.float64 if wide else np.float32)
    return (normalized.astype(dtype) * scale.astype(dtype)).astype(scale.dtype)
