"""Convolutions: Conv and ConvTranspose, both on `lax.conv_general_dilated`.

Layouts are ONNX's own (NCHW..., weights OIHW... for Conv, IOHW... for ConvTranspose); XLA picks
the physical layout. Half-precision inputs accumulate in float32 and are cast back.
CausalConvWithState (the depthwise causal conv with a carried state of Mamba and Gated DeltaNet)
is a sum of shifted products instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.shared import same_pads, spatial_attrs


def _check_kernel(op_type: str, w, kernel_shape) -> None:
    if kernel_shape is not None and tuple(kernel_shape) != tuple(w.shape[2:]):
        raise ShapeError(
            f"{op_type}: kernel_shape {tuple(kernel_shape)} does not match the spatial shape of W "
            f"{tuple(w.shape[2:])}"
        )


def _add_bias(y, b, dtype):
    if b is not None:
        y = y + jnp.asarray(b).astype(y.dtype).reshape((1, -1) + (1,) * (y.ndim - 2))
    return y.astype(dtype)


@op("Conv", since=(1, 11, 22))
def conv(
    x,
    w,
    b=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """ONNX Conv-1..22: N-D grouped, dilated, strided convolution with optional bias."""
    x, w = jnp.asarray(x), jnp.asarray(w)
    rank = x.ndim - 2
    if rank < 1 or w.ndim != x.ndim:
        raise ShapeError(
            f"Conv: X must be (N, C, D1, ...) and W of the same rank, got {x.shape} and {w.shape}"
        )
    if x.shape[1] != w.shape[1] * group:
        raise ShapeError(
            f"Conv: X has {x.shape[1]} channels, but W expects {w.shape[1]} x group {group}"
        )
    _check_kernel("Conv", w, kernel_shape)
    strides, dilations, pad_pairs = spatial_attrs("Conv", rank, strides, dilations, pads, auto_pad)
    if group > 1 and w.shape[1] == 1 and np.prod(w.shape[2:]) <= DEPTHWISE_MAX_TAPS:
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pad_pairs = tuple(
                same_pads(size, (k - 1) * d + 1, s, auto_pad == "SAME_UPPER")
                for size, k, s, d in zip(x.shape[2:], w.shape[2:], strides, dilations)
            )
        elif auto_pad == "VALID":
            pad_pairs = ((0, 0),) * rank
        return _add_bias(_depthwise(x, w, strides, dilations, pad_pairs), b, x.dtype)
    padding = {"SAME_UPPER": "SAME", "SAME_LOWER": "SAME_LOWER", "VALID": "VALID"}.get(
        auto_pad, pad_pairs
    )
    y = lax.conv_general_dilated(
        x,
        w.astype(x.dtype),
        window_strides=strides,
        padding=padding,
        rhs_dilation=dilations,
        feature_group_count=group,
        preferred_element_type=accumulation_dtype(x.dtype),
    )
    return _add_bias(y, b, x.dtype)


# Depthwise kernels up to this many taps (7x7 = 49, 3x3x3 = 27) run as shifted products.
DEPTHWISE_MAX_TAPS = 64


def _depthwise(x, w, strides, dilations, pad_pairs):
    """A convolution whose groups each see one input channel, as a sum of shifted products.

    XLA:CPU runs grouped convolutions slowly: a 7x7 depthwise convolution of ConvNeXt's shapes
    takes about 7x as long through lax.conv_general_dilated as this sum, which XLA fuses into one
    loop. Output channel o reads input channel o // multiplier, as in a grouped convolution.
    """
    acc = accumulation_dtype(x.dtype)
    multiplier = w.shape[0] // x.shape[1]
    padded = jnp.pad(x.astype(acc), ((0, 0), (0, 0), *pad_pairs))
    if multiplier > 1:
        padded = jnp.repeat(padded, multiplier, axis=1)
    kernel = w.shape[2:]
    out = [
        (padded.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
        for i in range(len(kernel))
    ]
    weights = w.astype(acc)
    y = jnp.zeros((x.shape[0], w.shape[0], *(max(o, 0) for o in out)), acc)
    for taps in np.ndindex(*kernel):
        window = tuple(
            slice(t * d, t * d + (o - 1) * s + 1, s)
            for t, d, s, o in zip(taps, dilations, strides, out)
        )
        tap = weights[(slice(None), 0, *taps)].reshape((1, -1) + (1,) * len(kernel))
        y = y + padded[(slice(None), slice(None), *window)] * tap
    return y


def _transpose_pads(
    size, kernel: int, stride: int, dilation: int, out_pad: int, target, upper: bool
) -> tuple:
    """(begin, end) pads of the transposed convolution that give output length `target`."""
    total = stride * (size - 1) + out_pad + (kernel - 1) * dilation + 1 - target
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


@op("ConvTranspose", since=(1, 11, 22))
def conv_transpose(
    x,
    w,
    b=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
):
    """ONNX ConvTranspose-1..22: the gradient of Conv, with output_padding/output_shape/auto_pad."""
    x, w = jnp.asarray(x), jnp.asarray(w)
    rank = x.ndim - 2
    if rank < 1 or w.ndim != x.ndim:
        raise ShapeError(
            f"ConvTranspose: X must be (N, C, D1, ...) and W of the same rank, got {x.shape} and {w.shape}"
        )
    channels = x.shape[1]
    if channels != w.shape[0]:
        raise ShapeError(
            f"ConvTranspose: X has {channels} channels, but W's first dim is {w.shape[0]}"
        )
    if channels % group:
        raise ShapeError(
            f"ConvTranspose: {channels} input channels are not divisible by group {group}"
        )
    _check_kernel("ConvTranspose", w, kernel_shape)
    strides, dilations, pad_pairs = spatial_attrs(
        "ConvTranspose", rank, strides, dilations, pads, auto_pad
    )
    out_pad = tuple(output_padding) if output_padding is not None else (0,) * rank
    if len(out_pad) != rank:
        raise ShapeError(
            f"ConvTranspose: output_padding has {len(out_pad)} values, expected {rank}"
        )
    kernel = w.shape[2:]
    sizes = x.shape[2:]
    if output_shape is not None:
        target = tuple(output_shape)[-rank:]
        # Every version pads the extra odd element at the end except for SAME_UPPER, as ONNX
        # Runtime does; ConvTranspose-1's formula says the opposite of its own auto_pad text.
        pad_pairs = tuple(
            _transpose_pads(n, k, s, d, p, t, auto_pad == "SAME_UPPER")
            for n, k, s, d, p, t in zip(
                sizes, kernel, strides, dilations, out_pad, target, strict=True
            )
        )
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pad_pairs = tuple(
            _transpose_pads(n, k, s, d, p, n * s, auto_pad == "SAME_UPPER")
            for n, k, s, d, p in zip(sizes, kernel, strides, dilations, out_pad, strict=True)
        )
    elif auto_pad == "VALID":
        pad_pairs = ((0, 0),) * rank
    # A transposed convolution is a convolution of the stride-dilated input with the flipped,
    # in/out-swapped kernel, padded by (dilated kernel - 1) minus the transposed pads.
    out_per_group = w.shape[1]
    rhs = w.reshape((group, channels // group, out_per_group) + kernel)
    rhs = jnp.swapaxes(rhs, 1, 2).reshape((group * out_per_group, channels // group) + kernel)
    rhs = jnp.flip(rhs, axis=tuple(range(2, 2 + rank))).astype(x.dtype)
    padding = tuple(
        ((k - 1) * d - lo, (k - 1) * d - hi + p)
        for k, d, (lo, hi), p in zip(kernel, dilations, pad_pairs, out_pad, strict=True)
    )
    y = lax.conv_general_dilated(
        x,
        rhs,
        window_strides=(1,) * rank,
        padding=padding,
        lhs_dilation=strides,
        rhs_dilation=dilations,
        feature_group_count=group,
        preferred_element_type=accumulation_dtype(x.dtype),
    )
    return _add_bias(y, b, x.dtype)


_ACTIVATIONS = ("none", "silu", "swish")


@op("CausalConvWithState", since=27)
def causal_conv_with_state(input, weight, bias=None, past_state=None, *, activation="none"):
    """ONNX CausalConvWithState-27: depthwise causal 1-D conv over [past_state, input]."""
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"CausalConvWithState: activation must be one of {_ACTIVATIONS}, got {activation!r}"
        )
    x, w = jnp.asarray(input), jnp.asarray(weight)
    if x.ndim != 3:
        raise ShapeError(
            f"CausalConvWithState: input must be (batch_size, channels, length), got {x.shape}"
        )
    batch, channels, length = x.shape
    if w.ndim != 3 or w.shape[:2] != (channels, 1) or w.shape[2] < 1:
        raise ShapeError(
            f"CausalConvWithState: weight must be ({channels}, 1, k) with k >= 1 for input "
            f"{x.shape}, got {w.shape}"
        )
    k = w.shape[2]
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ShapeError(
            f"CausalConvWithState: bias must be ({channels},), got {tuple(bias.shape)}"
        )
    if past_state is None:
        past = jnp.zeros((batch, channels, k - 1), x.dtype)
    else:
        past = jnp.asarray(past_state)
        if tuple(past.shape) != (batch, channels, k - 1):
            raise ShapeError(
                f"CausalConvWithState: past_state must be ({batch}, {channels}, {k - 1}), got "
                f"{tuple(past.shape)}"
            )
    padded = jnp.concatenate([past.astype(x.dtype), x], axis=2)
    # k is a handful of taps (4 in Mamba/DeltaNet): a sum of shifted products fuses into one
    # kernel and, unlike a grouped lax conv, accepts zero channels.
    acc = accumulation_dtype(x.dtype)
    taps = w[:, 0, :].astype(acc)
    y = sum(padded[:, :, j : j + length].astype(acc) * taps[None, :, j, None] for j in range(k))
    if bias is not None:
        y = y + jnp.asarray(bias).astype(acc)[None, :, None]
    if activation != "none":  # silu and swish are the same x * sigmoid(x)
        y = jax.nn.silu(y)
    return y.astype(x.dtype), padded[:, :, length:]
