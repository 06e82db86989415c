"""BitCast, and the operators no other family owns: SwiGLU and the two training losses.

BitCast reinterprets bits with `lax.bitcast_convert_type`; bool and complex, which that refuses,
go through uint8 and (real, imag) float pairs, laid out little-endian as ONNX requires. The
losses and SwiGLU compute half precision in float32 and cast back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from transmuter import dtypes
from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op

_COMPLEX_PARTS = {np.dtype(np.complex64): np.float32, np.dtype(np.complex128): np.float64}


def _bits(dtype: np.dtype) -> int:
    if dtype.kind in "bc":
        return dtype.itemsize * 8
    try:
        return ml_dtypes.finfo(dtype).bits
    except ValueError:
        return ml_dtypes.iinfo(dtype).bits


# JAX gives reading bits as another type a zero derivative; between float types the real one
# is not zero, so a gradient through BitCast raises (see OpDef.differentiable).
@op("BitCast", since=26, differentiable=False)
def bitcast(x, *, to):
    """ONNX BitCast-26: the same bits read as another type of equal width."""
    target = dtypes.from_onnx(to)
    source = np.dtype(x.dtype)
    if object in (source, target):
        raise ValueError("BitCast: string tensors cannot be reinterpreted")
    if _bits(source) != _bits(target):
        raise ValueError(
            f"BitCast: {source} is {_bits(source)} bits and {target} is {_bits(target)}; the "
            "types must have the same width"
        )
    x = jnp.asarray(x)
    if source == target:
        return x
    if source == np.bool_:
        x = x.astype(np.uint8)
    elif source in _COMPLEX_PARTS:
        x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)  # real in the low bytes
    if target == np.bool_:
        # A byte other than 0 or 1 has no bool value of its own; it reads as True.
        return lax.bitcast_convert_type(x, np.uint8) != 0
    if target in _COMPLEX_PARTS:
        parts = lax.bitcast_convert_type(x, _COMPLEX_PARTS[target])
        return lax.complex(parts[..., 0], parts[..., 1])
    return lax.bitcast_convert_type(x, target)


@op("SwiGLU", since=28)
def swiglu(A, B, *, alpha=1.0):
    """ONNX SwiGLU-28: Swish_alpha(A) * B = A * sigmoid(alpha * A) * B, no broadcasting."""
    a, b = jnp.asarray(A), jnp.asarray(B)
    if a.shape != b.shape:
        raise ShapeError(f"SwiGLU: A {a.shape} and B {b.shape} must have the same shape")
    dtype = accumulation_dtype(a.dtype)
    gate = a.astype(dtype)
    y = gate * jax.nn.sigmoid(jnp.asarray(alpha, dtype) * gate) * b.astype(dtype)
    return y.astype(a.dtype)


_REDUCTIONS = ("none", "sum", "mean")


def _negative_log_likelihood(op_type, log_prob, target, weight, ignore_index, reduction):
    """Loss of `log_prob` (N, C, d...) at `target` (N, d...), in log_prob's type."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op_type}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    target = jnp.asarray(target)
    if log_prob.ndim < 2 or target.shape != (log_prob.shape[0],) + log_prob.shape[2:]:
        raise ShapeError(
            f"{op_type}: the input must be (N, C, d1, ...) and the target (N, d1, ...); got "
            f"{log_prob.shape} and {target.shape}"
        )
    ignored = None if ignore_index is None else target == ignore_index
    # An ignored target may be any value (-100 is common), so it indexes class 0 instead.
    index = target if ignored is None else jnp.where(ignored, jnp.zeros((), target.dtype), target)
    picked = jnp.take_along_axis(log_prob, index[:, None], axis=1)[:, 0]
    if weight is not None:
        weight = jnp.asarray(weight)
        if weight.shape != (log_prob.shape[1],):
            raise ShapeError(
                f"{op_type}: weight must have shape ({log_prob.shape[1]},), got {weight.shape}"
            )
        w = jnp.take(weight.astype(log_prob.dtype), index)
    else:
        w = jnp.ones(index.shape, log_prob.dtype)
    if ignored is not None:
        w = jnp.where(ignored, jnp.zeros((), w.dtype), w)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    # The mean is over the weights of the targets that count (ignored ones weigh 0), as ONNX
    # Runtime and PyTorch do; no counted target gives 0 / 0 = NaN.
    return jnp.sum(loss) / jnp.sum(w)


@op("NegativeLogLikelihoodLoss", since=(12, 13, 22))
def negative_log_likelihood_loss(x, target, weight=None, *, ignore_index=None, reduction="mean"):
    """ONNX NegativeLogLikelihoodLoss-12..22: -input[n, target[n], ...] * weight[target]."""
    x = jnp.asarray(x)
    dtype = accumulation_dtype(x.dtype)
    loss = _negative_log_likelihood(
        "NegativeLogLikelihoodLoss", x.astype(dtype), target, weight, ignore_index, reduction
    )
    return loss.astype(x.dtype)


@op("SoftmaxCrossEntropyLoss", since=(12, 13))
def softmax_cross_entropy_loss(
    scores, labels, weights=None, *, ignore_index=None, reduction="mean"
):
    """ONNX SoftmaxCrossEntropyLoss-12..13: NLL of log_softmax over the class axis (1)."""
    scores = jnp.asarray(scores)
    if scores.ndim < 2:
        raise ShapeError(f"SoftmaxCrossEntropyLoss: scores must be (N, C, ...), got {scores.shape}")
    dtype = accumulation_dtype(scores.dtype)
    log_prob = jax.nn.log_softmax(scores.astype(dtype), axis=1)
    loss = _negative_log_likelihood(
        "SoftmaxCrossEntropyLoss", log_prob, labels, weights, ignore_index, reduction
    )
    return loss.astype(scores.dtype), log_prob.astype(scores.dtype)
