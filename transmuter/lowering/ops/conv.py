"""Convolutions: Conv and ConvTranspose, both on `lax.conv_general_dilated`.

The operators take ONNX's layouts (NCHW..., weights OIHW... for Conv, IOHW... for ConvTranspose), but
every convolution reaches XLA channels last (NHWC activations, HWIO kernels): XLA:CPU rewrites
other layouts into that one only at a program's top level, so inside a loop body (an ONNX
Loop/Scan, a diffusion loop) anything else falls back to its unoptimized convolution, ~100x
slower (runtime/loop_convolutions.py checks compiled programs for it). The transposes around a
top-level convolution are the ones XLA would insert itself. Half-precision inputs accumulate in
float32 and are cast back.
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


def _check_kernel(op_type: str, kernel: tuple, kernel_shape) -> None:
    if kernel_shape is not None and tuple(kernel_shape) != tuple(kernel):
        raise ShapeError(
            f"{op_type}: kernel_shape {tuple(kernel_shape)} does not match the spatial shape of W "
            f"{tuple(kernel)}"
        )


def _add_bias(y, b, dtype, channel_axis: int = 1):
    if b is not None:
        shape = [1] * y.ndim
        shape[channel_axis] = -1
        y = y + jnp.asarray(b).astype(y.dtype).reshape(shape)
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
    return convolve("Conv", x, w, b, False, auto_pad, dilations, group, kernel_shape, pads, strides)


def convolve(
    op_type: str,
    x,
    w,
    b,
    channels_last: bool,
    auto_pad,
    dilations,
    group,
    kernel_shape,
    pads,
    strides,
):
    """Conv's arithmetic on X (N, C, D1, ...) and W (M, C/group, k1, ...), or with channels last
    on X (N, D1, ..., C) and W (M, k1, ..., C/group) (com.microsoft NhwcConv). Either way XLA
    gets NHWC activations and an HWIO kernel."""
    x, w = jnp.asarray(x), jnp.asarray(w)
    rank = x.ndim - 2
    if rank < 1 or w.ndim != x.ndim:
        layout = (
            "(N, D1, ..., C) and W (M, k1, ..., C/group)"
            if channels_last
            else "(N, C, D1, ...) and W"
        )
        raise ShapeError(
            f"{op_type}: X must be {layout} of the same rank, got {x.shape} and {w.shape}"
        )
    channel = x.ndim - 1 if channels_last else 1
    spatial = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    kernel = tuple(w.shape[a] for a in spatial)
    per_group = w.shape[channel]
    if x.shape[channel] != per_group * group:
        raise ShapeError(
            f"{op_type}: X has {x.shape[channel]} channels, but W expects {per_group} x group {group}"
        )
    _check_kernel(op_type, kernel, kernel_shape)
    strides, dilations, pad_pairs = spatial_attrs(op_type, rank, strides, dilations, pads, auto_pad)
    if group > 1 and per_group == 1 and np.prod(kernel) <= DEPTHWISE_MAX_TAPS:
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pad_pairs = tuple(
                same_pads(x.shape[a], (k - 1) * d + 1, s, auto_pad == "SAME_UPPER")
                for a, k, s, d in zip(spatial, kernel, strides, dilations)
            )
        elif auto_pad == "VALID":
            pad_pairs = ((0, 0),) * rank
        y = _depthwise(x, w, strides, dilations, pad_pairs, channel, spatial)
        return _add_bias(y, b, x.dtype, channel)
    if not channels_last:
        # To channels last and (M, k1, ..., C/group): the NhwcConv path below, then back. For a
        # constant kernel the layout pass stores it laid out already.
        last = (0, *range(2, x.ndim), 1)
        y = convolve(
            op_type,
            jnp.transpose(x, last),
            jnp.transpose(w, last),
            b,
            True,
            auto_pad,
            dilations,
            group,
            kernel_shape,
            pads,
            strides,
        )
        return jnp.transpose(y, (0, x.ndim - 1, *range(1, x.ndim - 1)))
    pointwise = all(k == 1 for k in kernel) and (
        auto_pad != "NOTSET" or not any(sum(pad_pairs, ()))
    )
    if group == 1 and pointwise:
        return _add_bias(_pointwise(x, w, strides), b, x.dtype, channel)
    padding = {"SAME_UPPER": "SAME", "SAME_LOWER": "SAME_LOWER", "VALID": "VALID"}.get(
        auto_pad, pad_pairs
    )
    # W (M, k1, ..., C/group) read as (k1, ..., C/group, M): the layout pass stores a constant
    # kernel in that order behind a Transpose to NhwcConv's, so this transpose and that one
    # cancel and the convolution reads the stored array, in a loop body too.
    y = lax.conv_general_dilated(
        x,
        jnp.moveaxis(w, 0, -1).astype(x.dtype),
        window_strides=strides,
        padding=padding,
        rhs_dilation=dilations,
        dimension_numbers=_channels_last(rank),
        feature_group_count=group,
        preferred_element_type=accumulation_dtype(x.dtype),
    )
    return _add_bias(y, b, x.dtype, channel)


def _channels_last(rank: int) -> lax.ConvDimensionNumbers:
    """NHWC activations and HWIO kernels, for `rank` spatial dims."""
    activations = (0, rank + 1, *range(1, rank + 1))
    return lax.ConvDimensionNumbers(activations, (rank + 1, rank, *range(rank)), activations)


def _pointwise(x, w, strides):
    """A 1x1 convolution, channels last and ungrouped (a 1x1 kernel pads nothing under any
    auto_pad), as the matrix product it is: XLA:CPU's GEMM runs ResNet-50's 1x1 layers in about
    0.6x the time of its convolution."""
    # lax.slice gives each strided dim as (n - 1) // s + 1, the expression
    # lax.conv_general_dilated gives: with symbolic dims (export) the two outputs of a strided
    # block then provably match. x[::s] would give (n + s - 1) // s, equal but not provably so.
    strided = lax.slice(x, (0,) * x.ndim, x.shape, (1, *strides, 1))
    # (C, M) by way of (1, ..., C, M), the order the layout pass stores kernels in: XLA then
    # reads the stored kernel as it is instead of copying it on every call.
    matrix = jnp.moveaxis(w, 0, -1).reshape(w.shape[-1], w.shape[0]).astype(x.dtype)
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    return lax.dot_general(
        strided, matrix, dims, preferred_element_type=accumulation_dtype(x.dtype)
    )


# Depthwise kernels up to this many taps (7x7 = 49, 3x3x3 = 27) run as shifted products.
DEPTHWISE_MAX_TAPS = 64


def _depthwise(x, w, strides, dilations, pad_pairs, channel: int, spatial: tuple):
    """A convolution whose groups each see one input channel, as a sum of shifted products.

    XLA:CPU runs grouped convolutions slowly: a 7x7 depthwise convolution of ConvNeXt's shapes
    takes about 7x as long through lax.conv_general_dilated as this sum, which XLA fuses into one
    loop. Output channel o reads input channel o // multiplier, as in a grouped convolution.
    W's channel axis (of size 1) and spatial axes are where X has them.
    """
    acc = accumulation_dtype(x.dtype)
    multiplier = w.shape[0] // x.shape[channel]
    widths = [(0, 0)] * x.ndim
    for axis, pair in zip(spatial, pad_pairs):
        widths[axis] = pair
    padded = jnp.pad(x.astype(acc), widths)
    if multiplier > 1:
        padded = jnp.repeat(padded, multiplier, axis=channel)
    kernel = tuple(w.shape[a] for a in spatial)
    out = [
        (padded.shape[a] - d * (k - 1) - 1) // s + 1
        for a, k, d, s in zip(spatial, kernel, dilations, strides)
    ]
    # (k1, ..., M), a vector per tap: for a kernel the layout pass stored, that is its memory order.
    weights = jnp.squeeze(jnp.moveaxis(w.astype(acc), 0, -1), axis=channel - 1)
    y_shape = list(padded.shape)
    for a, o in zip(spatial, out):
        y_shape[a] = max(o, 0)
    y_shape[channel] = w.shape[0]
    tap_shape = [1] * x.ndim
    tap_shape[channel] = -1
    y = jnp.zeros(y_shape, acc)
    for taps in np.ndindex(*kernel):
        window = [slice(None)] * x.ndim
        for a, t, d, s, o in zip(spatial, taps, dilations, strides, out):
            window[a] = slice(t * d, t * d + (o - 1) * s + 1, s)
        y = y + padded[tuple(window)] * weights[taps].reshape(tap_shape)
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
    _check_kernel("ConvTranspose", w.shape[2:], kernel_shape)
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
    # Channels last with an HWIO kernel, as every convolution here (see the module docstring).
    y = lax.conv_general_dilated(
        jnp.transpose(x, (0, *range(2, x.ndim), 1)),
        jnp.transpose(rhs, (*range(2, x.ndim), 1, 0)),
        window_strides=(1,) * rank,
        padding=padding,
        lhs_dilation=strides,
        rhs_dilation=dilations,
        dimension_numbers=_channels_last(rank),
        feature_group_count=group,
        preferred_element_type=accumulation_dtype(x.dtype),
    )
    y = _add_bias(y, b, x.dtype, x.ndim - 1)
    return jnp.transpose(y, (0, x.ndim - 1, *range(1, x.ndim - 1)))


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
