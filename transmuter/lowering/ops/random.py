"""Random operators: RandomNormal, RandomUniform, their -Like forms, Bernoulli, Multinomial and
Dropout (identity at inference; a random mask in training mode).

Every op here that draws is registered `random=True` (Dropout before opset 12 never does), so
the interpreter never folds it on the host, and `context=True` for the key. A node without a `seed` attribute draws from `ctx.next_key()`, a key
split from the one passed to `transmuter.run(..., key=...)`, so each call (and each node) gets
fresh values. A node with a `seed` derives its key from the seed alone and draws the same values
on every call. ONNX stores seeds as floats; `int(seed)` truncates toward zero (as onnx.reference
does), so seeds 1.0 and 1.7 draw the same values. The values themselves are
JAX's, not ONNX Runtime's: the spec leaves the generator to the implementation.

Samples are drawn in float32 for float16/bfloat16 outputs (float64 for double) and rounded once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from transmuter import dtypes
from transmuter.errors import ShapeError, TransmuterError, UnsupportedOpError
from transmuter.lowering import op
from transmuter.lowering.shared import arg_extreme, host_scalar

_FLOATS = frozenset(dtypes.from_onnx(code) for code in (1, 10, 11, 16))
# Bernoulli's T2: the float types, every integer type and bool.
_BERNOULLI_OUT = _FLOATS | frozenset(dtypes.from_onnx(c) for c in (2, 3, 4, 5, 6, 7, 9, 12, 13))
_INDICES = frozenset((np.dtype(np.int32), np.dtype(np.int64)))


def node_key(ctx, seed):
    """The node's PRNG key: from its seed alone when it has one, else the run's next key."""
    if seed is not None:
        if not math.isfinite(seed):
            raise ValueError(f"the seed attribute must be a finite number, got {seed}")
        # Made eagerly, so that a caller's jax.jit gets a constant key and does not lower the
        # int64 seed conversion after the runtime's x64 scope has closed.
        with jax.ensure_compile_time_eval():
            return jax.random.key(int(seed))
    try:
        return ctx.next_key()
    except TransmuterError as exc:
        node = ctx.node
        raise TransmuterError(
            f"{node.op_type} node {node.label!r} has no seed attribute, so it draws from the "
            "run's random key: pass one, e.g. transmuter.run(model, inputs, "
            "key=jax.random.key(0))"
        ) from exc


def _output_dtype(ctx, code, allowed, fallback=None) -> np.dtype:
    """The dtype the `dtype` attribute names (or `fallback`), checked against the spec's list."""
    dtype = np.dtype(fallback) if code is None else dtypes.from_onnx(code)
    if dtype not in allowed:
        node = ctx.node
        source = "the input's type" if code is None else f"dtype={code}"
        raise UnsupportedOpError(
            node.domain,
            node.op_type,
            ctx.opset,
            node.label,
            f"{source} gives output type {dtype.name}; allowed: "
            f"{', '.join(sorted(d.name for d in allowed))}",
        )
    return dtype


def _sampling_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _normal(key, shape, dtype, mean, scale):
    compute = _sampling_dtype(dtype)
    z = jax.random.normal(key, shape, compute)
    return (z * jnp.asarray(scale, compute) + jnp.asarray(mean, compute)).astype(dtype)


def _uniform(key, shape, dtype, low, high):
    compute = _sampling_dtype(dtype)
    u = jax.random.uniform(key, shape, compute, minval=low, maxval=high)
    return u.astype(dtype)


def _shape(shape) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ShapeError(f"the shape attribute must not have negative dims, got {list(dims)}")
    return dims


# RandomNormal/Uniform(-Like)-22 and Bernoulli-22/Multinomial-22 only add bfloat16.


@op("RandomNormal", since=(1, 22), random=True, context=True)
def random_normal(ctx, *, shape, dtype=1, mean=0.0, scale=1.0, seed=None):
    """ONNX RandomNormal-1..22: a tensor of `shape` drawn from N(mean, scale^2)."""
    out = _output_dtype(ctx, dtype, _FLOATS)
    return _normal(node_key(ctx, seed), _shape(shape), out, mean, scale)


@op("RandomUniform", since=(1, 22), random=True, context=True)
def random_uniform(ctx, *, shape, dtype=1, high=1.0, low=0.0, seed=None):
    """ONNX RandomUniform-1..22: a tensor of `shape` drawn from U[low, high)."""
    out = _output_dtype(ctx, dtype, _FLOATS)
    return _uniform(node_key(ctx, seed), _shape(shape), out, low, high)


@op("RandomNormalLike", since=(1, 22), random=True, context=True)
def random_normal_like(ctx, input, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    """ONNX RandomNormalLike-1..22: N(mean, scale^2) with the input's shape (and type unless
    `dtype` is given)."""
    out = _output_dtype(ctx, dtype, _FLOATS, fallback=input.dtype)
    return _normal(node_key(ctx, seed), tuple(input.shape), out, mean, scale)


@op("RandomUniformLike", since=(1, 22), random=True, context=True)
def random_uniform_like(ctx, input, *, dtype=None, high=1.0, low=0.0, seed=None):
    """ONNX RandomUniformLike-1..22: U[low, high) with the input's shape (and type unless
    `dtype` is given)."""
    out = _output_dtype(ctx, dtype, _FLOATS, fallback=input.dtype)
    return _uniform(node_key(ctx, seed), tuple(input.shape), out, low, high)


@op("Bernoulli", since=(15, 22), random=True, context=True)
def bernoulli(ctx, input, *, dtype=None, seed=None):
    """ONNX Bernoulli-15..22: 1 with probability input[i], else 0, in `dtype` (default: the
    input's type)."""
    out = _output_dtype(ctx, dtype, _BERNOULLI_OUT, fallback=input.dtype)
    p = jnp.asarray(input)
    compute = _sampling_dtype(p.dtype)
    u = jax.random.uniform(node_key(ctx, seed), p.shape, compute)
    return (u < p.astype(compute)).astype(out)


@op("Multinomial", since=(7, 22), random=True, context=True)
def multinomial(ctx, input, *, dtype=6, sample_size=1, seed=None):
    """ONNX Multinomial-7..22: `sample_size` class indices per row of unnormalized
    log-probabilities [batch, classes] -> [batch, sample_size]."""
    out = _output_dtype(ctx, dtype, _INDICES)
    logits = jnp.asarray(input)
    if logits.ndim != 2:
        raise ShapeError(
            f"Multinomial: input must be [batch_size, class_size], got shape {list(logits.shape)}"
        )
    if sample_size < 0:
        raise ShapeError(f"Multinomial: sample_size must be >= 0, got {sample_size}")
    batch, classes = logits.shape
    if classes == 0 and batch * sample_size:
        raise ShapeError("Multinomial: cannot sample from zero classes")
    if batch * sample_size == 0:
        return jnp.zeros((batch, sample_size), out)
    compute = _sampling_dtype(logits.dtype)
    # Gumbel-max, as jax.random.categorical does, but with `arg_extreme`: the int64 argmax
    # inside categorical fails to lower under a caller's jax.jit with x64 off.
    noise = jax.random.gumbel(node_key(ctx, seed), (batch, sample_size, classes), compute)
    return arg_extreme(noise + logits.astype(compute)[:, None, :], 2, dtype=out)


# ------------------------------------------------------------------------------------ dropout


def _dropout_inference(ctx, data, mask_dtype):
    if not ctx.wants(1):
        return data
    return data, jnp.ones(data.shape, dtype=mask_dtype)


def _no_training(ctx, ratio):
    """Training-mode dropout draws a random mask: only ratio 0 (which drops nothing) is allowed."""
    if isinstance(ratio, jax.core.Tracer) or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
        node = ctx.node
        raise UnsupportedOpError(
            node.domain,
            node.op_type,
            ctx.opset,
            node.label,
            "training-mode dropout is not supported yet (only with ratio 0); export the model "
            "for inference or set training_mode to false",
        )


@op("Dropout", since=1, context=True)
def dropout_v1(ctx, data, *, consumed_inputs=None, is_test=0, ratio=0.5):
    """ONNX Dropout-1: identity in test mode (is_test=1); the mask is all ones."""
    if not is_test:
        _no_training(ctx, ratio)
    return _dropout_inference(ctx, data, data.dtype)


@op("Dropout", since=6, context=True)
def dropout_v6(ctx, data, *, is_test=0, ratio=0.5):
    """ONNX Dropout-6: identity in test mode (is_test=1); the mask is all ones."""
    if not is_test:
        _no_training(ctx, ratio)
    return _dropout_inference(ctx, data, data.dtype)


@op("Dropout", since=7, context=True)
def dropout_v7(ctx, data, *, ratio=0.5):
    """ONNX Dropout-7: inference identity; the mask (of the data type) is all ones."""
    return _dropout_inference(ctx, data, data.dtype)


@op("Dropout", since=10, context=True)
def dropout_v10(ctx, data, *, ratio=0.5):
    """ONNX Dropout-10: inference identity; the bool mask is all true."""
    return _dropout_inference(ctx, data, jnp.bool_)


@op(
    "Dropout",
    since=(12, 13, 22),
    host_inputs={"training_mode": "whether dropout is active"},
    context=True,
    random=True,
)
def dropout_v12(ctx, data, ratio=None, training_mode=None, *, seed=None):
    """ONNX Dropout-12..22: identity unless training_mode is true; then each element is zeroed
    with probability `ratio` and the others are scaled by 1 / (1 - ratio)."""
    if training_mode is None or not bool(host_scalar(training_mode, "Dropout training_mode")):
        return _dropout_inference(ctx, data, jnp.bool_)
    if ratio is None:
        ratio = np.float32(0.5)
    if not isinstance(ratio, jax.core.Tracer) and float(host_scalar(ratio, "Dropout ratio")) == 0:
        return _dropout_inference(ctx, data, jnp.bool_)  # drops nothing, so needs no key
    # Half types draw and scale in float32 and round once.
    compute = np.dtype(np.float64 if data.dtype == np.float64 else np.float32)
    ratio = jnp.asarray(ratio).reshape(()).astype(compute)
    keep = jax.random.uniform(node_key(ctx, seed), data.shape, compute) >= ratio
    # A ratio of 1 keeps nothing: where() gives zeros rather than 0 * inf.
    output = jnp.where(keep, data.astype(compute) * (1 / (1 - ratio)), 0).astype(data.dtype)
    return (output, keep) if ctx.wants(1) else output
