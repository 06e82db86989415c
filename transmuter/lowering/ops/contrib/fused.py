"""com.microsoft fusions of elementwise, matmul and conv ops: the Gelu family, BiasAdd,
BiasSplitGelu, FusedMatMul, FusedConv, NhwcConv, Inverse and Trilu.

The math is the standard ops' (elementwise.py, conv.py, shape.py); these functions add the
fused bias, scale, layout or activation as ONNX Runtime's ContribOperators.md and its CPU kernels
define them. Half-precision inputs are computed in float32 and rounded once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op, variant
from transmuter.lowering.ops.conv import conv, convolve
from transmuter.lowering.ops.elementwise import (
    gelu,
    hard_sigmoid,
    leaky_relu,
    swish,
)
from transmuter.lowering.ops.shape import trilu as _trilu
from transmuter.lowering.shared import widened

MS = "com.microsoft"


def _check_bias(op_type: str, name: str, bias, x) -> None:
    """ORT's kernels take the bias as a vector over X's last axis, and reject other shapes."""
    if x.ndim == 0 or tuple(jnp.shape(bias)) != (x.shape[-1],):
        raise ShapeError(
            f"{op_type}: {name} must be a vector over X's last axis, got shape "
            f"{list(jnp.shape(bias))} for X {list(x.shape)}"
        )


# ------------------------------------------------------------------------------ gelu family


gelu_ms = op("Gelu", since=1, domain=MS)(variant(
    gelu, "gelu_ms", "com.microsoft Gelu-1: x * Phi(x) with the exact erf.",
    fixed={"approximate": "none"},
))  # fmt: skip


@op("BiasGelu", since=1, domain=MS)
def bias_gelu(A, B):
    """com.microsoft BiasGelu-1: Gelu (erf) of A + B, B a bias over A's last axis."""
    _check_bias("BiasGelu", "B", B, A)
    return gelu(widened(A) + widened(B)).astype(A.dtype)


@op("FastGelu", since=1, domain=MS)
def fast_gelu(X, bias=None):
    """com.microsoft FastGelu-1: 0.5x(1 + tanh(0.797885x + 0.035677x^3)) of x = X (+ bias)."""
    x = widened(X)
    if bias is not None:
        _check_bias("FastGelu", "bias", bias, X)
        x = x + widened(bias)
    # The doc's rounded constants, which ORT's float64 kernel uses as written (they differ from
    # sqrt(2/pi) and 0.044715 * sqrt(2/pi) by ~1e-7).
    y = 0.5 * x * (1 + jnp.tanh(0.797885 * x + 0.035677 * x * x * x))
    return y.astype(X.dtype)


quick_gelu = op("QuickGelu", since=1, domain=MS)(variant(
    swish, "quick_gelu", "com.microsoft QuickGelu-1: x * sigmoid(alpha * x), ai.onnx Swish.",
    defaults={"alpha": 1.7020000219345093},
))  # fmt: skip


# --------------------------------------------------------------------------------- bias ops


@op("BiasAdd", since=1, domain=MS)
def bias_add(X, bias, skip):
    """com.microsoft BiasAdd-1: X + bias + skip; X and skip (N, S, C), bias (C)."""
    if X.ndim != 3 or tuple(skip.shape) != tuple(X.shape):
        raise ShapeError(
            f"BiasAdd: X and skip must both be (N, S, C), got {list(X.shape)} and "
            f"{list(skip.shape)}"
        )
    if tuple(bias.shape) != (X.shape[2],):
        raise ShapeError(f"BiasAdd: bias must be ({X.shape[2]},), got {list(bias.shape)}")
    return (widened(X) + widened(bias) + widened(skip)).astype(X.dtype)


@op("BiasSplitGelu", since=1, domain=MS)
def bias_split_gelu(X, bias):
    """com.microsoft BiasSplitGelu-1: with h = X + bias split in halves on the last axis,
    left * Gelu(right) of shape (N, S, D/2)."""
    if X.ndim != 3 or X.shape[2] % 2 or tuple(bias.shape) != (X.shape[2],):
        raise ShapeError(
            f"BiasSplitGelu: X must be (N, S, D) with D even and bias (D,), got X "
            f"{list(X.shape)} and bias {list(bias.shape)}"
        )
    hidden = widened(X) + widened(bias)
    half = X.shape[2] // 2
    return (hidden[..., :half] * gelu(hidden[..., half:])).astype(X.dtype)


# ---------------------------------------------------------------------------------- matmul


def _batch_transposed(x, trans_batch: int, trans: int):
    """x's axes for FusedMatMul: transBatch moves the leading axis behind the other batch axes
    (it becomes the row axis); trans swaps the last two. 1-D operands are left alone (ORT
    promotes them to a row or column whatever trans says)."""
    if x.ndim < 2:
        return x
    axes = list(range(x.ndim))
    if trans_batch:
        axes = axes[1:-1] + [0, x.ndim - 1]
    if trans:
        axes[-2], axes[-1] = axes[-1], axes[-2]
    return jnp.transpose(x, axes) if axes != list(range(x.ndim)) else x


@op("FusedMatMul", since=1, domain=MS)
def fused_matmul(A, B, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    """com.microsoft FusedMatMul-1: alpha * op(A) @ op(B), numpy.matmul broadcasting, with
    optional transposes of the matrix axes (transA/B) and of the leading axis into the row axis
    (transBatchA/B)."""
    if A.ndim == 0 or B.ndim == 0:
        raise ShapeError(
            f"FusedMatMul operands must have rank >= 1, got {list(A.shape)} and {list(B.shape)}"
        )
    if (transBatchA or transBatchB) and not (A.ndim == B.ndim >= 3):
        raise ShapeError(
            "FusedMatMul: transBatchA/transBatchB need A and B of the same rank >= 3, got "
            f"{list(A.shape)} and {list(B.shape)}"
        )
    a = _batch_transposed(A, transBatchA, transA)
    b = _batch_transposed(B, transBatchB, transB)
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:
        raise ShapeError(
            f"FusedMatMul inner dims differ: op(A) is {list(a.shape)} and op(B) is {list(b.shape)}"
        )
    wide = accumulation_dtype(A.dtype)
    y = jnp.matmul(a, b, preferred_element_type=wide)
    if alpha != 1.0:
        y = y * jnp.asarray(alpha, wide)
    return y.astype(A.dtype)


# ------------------------------------------------------------------------------------ conv


# name -> (function, its parameter names in activation_params order), as ORT's CPU FusedConv
# (GetFusedActivationAttr) accepts them; the parameterized ones need exactly that many values.
_ACTIVATIONS = {
    "Relu": (lambda x: jnp.maximum(x, 0), ()),
    "Tanh": (jnp.tanh, ()),
    "Sigmoid": (jax.nn.sigmoid, ()),
    "LeakyRelu": (leaky_relu, ("alpha",)),
    "Clip": (jnp.clip, ("min", "max")),
    "HardSigmoid": (hard_sigmoid, ("alpha", "beta")),
}


def _activation(activation, activation_params):
    if activation is None:
        return lambda x: x
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"FusedConv: activation {activation!r} is not one of {sorted(_ACTIVATIONS)}"
        )
    fn, names = _ACTIVATIONS[activation]
    params = tuple(activation_params or ())
    if len(params) != len(names):
        raise ValueError(
            f"FusedConv: activation {activation} takes {len(names)} activation_params "
            f"({', '.join(names) or 'none'}), got {len(params)}"
        )
    kwargs = {name: float(value) for name, value in zip(names, params)}
    return lambda x: fn(x, **kwargs)


@op("FusedConv", since=1, domain=MS)
def fused_conv(
    X,
    W,
    B=None,
    Z=None,
    *,
    activation=None,
    activation_params=None,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """com.microsoft FusedConv-1: activation(Conv(X, W, B) + Z)."""
    apply = _activation(activation, activation_params)
    y = conv(
        X,
        W,
        B,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    y = widened(y)
    if Z is not None:
        if tuple(Z.shape) != tuple(y.shape):
            raise ShapeError(
                f"FusedConv: Z must have the output's shape {list(y.shape)}, got {list(Z.shape)}"
            )
        y = y + widened(Z)
    return apply(y).astype(X.dtype)


@op("NhwcConv", since=1, domain=MS)
def nhwc_conv(
    X,
    W,
    B=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """com.microsoft NhwcConv-1: Conv with channels last: X (N, D1.., C), W (M, k1.., C/group),
    Y (N, D1'.., M). (ORT's transformer fusion makes W by transposing Conv's OIHW weight with
    perm (0, 2, 3, 1).)"""
    return convolve(
        "NhwcConv", X, W, B, True, auto_pad, dilations, group, kernel_shape, pads, strides
    )


# --------------------------------------------------------------------------------- linalg


@op("Inverse", since=1, domain=MS)
def inverse(X):
    """com.microsoft Inverse-1: the inverses of the trailing square matrices of X."""
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ShapeError(f"Inverse: X must be [..., M, M], got shape {list(X.shape)}")
    return jnp.linalg.inv(widened(X)).astype(X.dtype)


trilu_ms = op("Trilu", since=1, domain=MS, host_inputs={"k": "the diagonal offset"})(variant(
    _trilu, "trilu_ms",
    "com.microsoft Trilu-1: ai.onnx Trilu-14 (upper or lower triangle from diagonal k).",
))  # fmt: skip
