"""ONNX Runtime's fused normalizations: SkipLayerNormalization, SkipSimplifiedLayerNormalization,
EmbedLayerNormalization, its quantized form QEmbedLayerNormalization and GroupNorm
(com.microsoft), and the two normalizations ORT registers in the ai.onnx domain itself:
SimplifiedLayerNormalization-1 and the LayerNormalization-1 that predates ai.onnx's own
LayerNormalization-17 (normalization.py; lookup picks by the opset).

Statistics are computed in float32 for float16/bfloat16 inputs (and in float64 for float64
inputs, as ORT's CPU kernels do), the result is rounded once at the end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.ops.normalization import (
    group_normalize,
    normalized_axes,
    standardize,
    stash_dtype,
)
from transmuter.lowering.ops.quantization import dequantize_linear_v21
from transmuter.lowering.shared import broadcast_unidirectional

MS = "com.microsoft"


def _rms_standardize(x, axes, epsilon, dtype):
    """x / sqrt(mean(x^2) + epsilon) over `axes`, in `dtype`; also 1/rms."""
    x = x.astype(dtype)
    inv_rms = lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + jnp.asarray(epsilon, dtype))
    return x * inv_rms, inv_rms


def _hidden_vector(op_type: str, name: str, value, hidden):
    value = jnp.asarray(value)
    if tuple(value.shape) != (hidden,):
        raise ShapeError(f"{op_type}: {name} must have shape ({hidden},), got {list(value.shape)}")
    return value


# ------------------------------------------------------------------- skip layer normalization


def _skip_norm(op_type, input, skip, gamma, beta, bias, epsilon, simplified):
    input = jnp.asarray(input)
    if input.ndim not in (2, 3):
        raise ShapeError(
            f"{op_type}: input must be (batch, sequence, hidden) or (tokens, hidden), got "
            f"{list(input.shape)}"
        )
    hidden = input.shape[-1]
    skip = jnp.asarray(skip)
    # skip may also be (1, S, H) or (S, H) for a 3-D input: it is shared across the batch.
    if skip.shape != input.shape and not (
        input.ndim == 3 and tuple(skip.shape) in ((1, *input.shape[1:]), tuple(input.shape[1:]))
    ):
        raise ShapeError(
            f"{op_type}: skip must have input's shape {list(input.shape)} (or (1, S, H), (S, H) "
            f"for a 3-D input), got {list(skip.shape)}"
        )
    dtype = accumulation_dtype(input.dtype)
    total = input.astype(dtype) + skip.astype(dtype)
    if bias is not None:
        total = total + _hidden_vector(op_type, "bias", bias, hidden).astype(dtype)
    if simplified:
        normalized, inv_std = _rms_standardize(total, (-1,), epsilon, dtype)
        # ORT's CPU kernel writes zeros to the mean output of the RMS form.
        mean = jnp.zeros_like(inv_std)
    else:
        normalized, mean, inv_std = standardize(total, (-1,), epsilon, dtype)
    y = normalized * _hidden_vector(op_type, "gamma", gamma, hidden).astype(dtype)
    if beta is not None:
        y = y + _hidden_vector(op_type, "beta", beta, hidden).astype(dtype)
    # mean and inv_std_var are float (U) whatever T is.
    return (
        y.astype(input.dtype),
        mean.astype(np.float32),
        inv_std.astype(np.float32),
        total.astype(input.dtype),
    )


@op("SkipLayerNormalization", since=1, domain=MS)
def skip_layer_normalization(
    input, skip, gamma, beta=None, bias=None, *, epsilon=9.999999960041972e-13
):
    """com.microsoft SkipLayerNormalization-1: LayerNorm over the last axis of input + skip
    (+ bias), times gamma (+ beta); also the mean, 1/stddev and the sum."""
    return _skip_norm(
        "SkipLayerNormalization", input, skip, gamma, beta, bias, epsilon, simplified=False
    )


@op("SkipSimplifiedLayerNormalization", since=1, domain=MS)
def skip_simplified_layer_normalization(
    input, skip, gamma, bias=None, *, epsilon=9.999999960041972e-13
):
    """com.microsoft SkipSimplifiedLayerNormalization-1: RMSNorm over the last axis of
    input + skip (+ bias), times gamma; also a zero mean, 1/rms and the sum."""
    return _skip_norm(
        "SkipSimplifiedLayerNormalization",
        input,
        skip,
        gamma,
        None,
        bias,
        epsilon,
        simplified=True,
    )


# ------------------------------------------------------------------ embed layer normalization


def _lookup(op_type: str, name: str, table, ids, to_float):
    """Rows of `table` at `ids`, through `to_float`; ids outside the table give NaN rows (ORT
    fails the run)."""
    table = jnp.asarray(table)
    ids = jnp.asarray(ids)
    if table.ndim != 2:
        raise ShapeError(f"{op_type}: {name} must be 2-D (rows, hidden), got {list(table.shape)}")
    valid = (ids >= 0) & (ids < table.shape[0])
    # Gathered before converting: a quantized word table is dequantized row by row, not whole.
    # mode="clip" wraps no negative id (ORT rejects them) and lets checkify see a bad one.
    rows = to_float(name, jnp.take(table, ids, axis=0, mode="clip"))
    return jnp.where(valid[..., None], rows, jnp.asarray(np.nan, rows.dtype))


def _embed_layer_norm(
    op_type, input_ids, segment_ids, word, position, segment, gamma, beta, mask, position_ids,
    epsilon, to_float,
):  # fmt: skip
    """LayerNorm of word + position (+ segment) embeddings, the mask_index and the sum.

    word, position, segment (None when absent), gamma and beta are (input name, tensor) pairs;
    to_float(name, values) turns values of that input into the compute type (a cast, or a
    dequantization). Returns (normalized, mask_index, sum), the first and last in that type.
    """
    input_ids = jnp.asarray(input_ids)
    if input_ids.ndim != 2:
        raise ShapeError(
            f"{op_type}: input_ids must be (batch, sequence), got {list(input_ids.shape)}"
        )
    batch, sequence = input_ids.shape
    for name, value in (("segment_ids", segment_ids), ("mask", mask)):
        if value is not None and tuple(jnp.shape(value)) != tuple(input_ids.shape):
            raise ShapeError(
                f"{op_type}: {name} must have input_ids' shape {list(input_ids.shape)}, got "
                f"{list(jnp.shape(value))}"
            )
    if (segment_ids is None) != (segment is None):
        raise ShapeError(f"{op_type}: segment_ids and the segment embedding come together")
    if position_ids is None:
        position_ids = jnp.arange(sequence, dtype=input_ids.dtype)[None]
    elif tuple(jnp.shape(position_ids)) not in ((1, sequence), (batch, sequence)):
        raise ShapeError(
            f"{op_type}: position_ids must be (1, {sequence}) or ({batch}, {sequence}), got "
            f"{list(jnp.shape(position_ids))}"
        )
    hidden = jnp.shape(word[1])[-1]
    total = _lookup(op_type, *word, input_ids, to_float)
    positions = jnp.broadcast_to(jnp.asarray(position_ids), input_ids.shape)
    embeddings = [(*position, positions)]
    if segment_ids is not None:
        embeddings.append((*segment, segment_ids))
    for name, table, ids in embeddings:
        if jnp.ndim(table) != 2 or jnp.shape(table)[1] != hidden:
            raise ShapeError(
                f"{op_type}: {name} must be (rows, {hidden}), got {list(jnp.shape(table))}"
            )
        total = total + _lookup(op_type, name, table, ids, to_float)
    normalized, _, _ = standardize(total, (-1,), epsilon, total.dtype)
    y = normalized * to_float(gamma[0], _hidden_vector(op_type, *gamma, hidden))
    y = y + to_float(beta[0], _hidden_vector(op_type, *beta, hidden))
    if mask is None:
        mask_index = jnp.zeros((batch,), np.int32)
    else:
        # ORT counts the entries equal to 1 (not the nonzero ones, nor the first zero).
        mask_index = jnp.sum(jnp.asarray(mask) == 1, axis=1, dtype=np.int32)
    return y, mask_index, total


@op("EmbedLayerNormalization", since=1, domain=MS)
def embed_layer_normalization(
    input_ids,
    segment_ids,
    word_embedding,
    position_embedding,
    segment_embedding,
    gamma,
    beta,
    mask=None,
    position_ids=None,
    *,
    epsilon=9.999999960041972e-13,
    mask_index_type=None,
):
    """com.microsoft EmbedLayerNormalization-1: LayerNorm of word + position (+ segment)
    embeddings; also mask_index (the count of ones in each mask row) and the embedding sum."""
    op_type = "EmbedLayerNormalization"
    # mask_index_type only steers ORT's shape inference (0: no mask_index); its CPU kernel
    # produces mask_index either way.
    if mask_index_type not in (None, 0, 1):
        raise ValueError(f"{op_type}: mask_index_type must be 0 or 1, got {mask_index_type}")
    out_dtype = jnp.asarray(word_embedding).dtype
    dtype = accumulation_dtype(jnp.asarray(word_embedding).dtype)
    y, mask_index, total = _embed_layer_norm(
        op_type,
        input_ids,
        segment_ids,
        ("word_embedding", word_embedding),
        ("position_embedding", position_embedding),
        None if segment_embedding is None else ("segment_embedding", segment_embedding),
        ("gamma", gamma),
        ("beta", beta),
        mask,
        position_ids,
        epsilon,
        lambda name, values: values.astype(dtype),
    )
    return y.astype(out_dtype), mask_index, total.astype(out_dtype)


def _per_tensor(op_type: str, name: str, value):
    """A scale or zero point as a scalar: ORT's kernel takes a scalar or a 1-D tensor of one."""
    value = jnp.asarray(value)
    if value.ndim > 1 or value.size != 1:
        raise ShapeError(
            f"{op_type}: {name} must be a scalar or a 1-D tensor of size 1, got {list(value.shape)}"
        )
    return value.reshape(())


@op("QEmbedLayerNormalization", since=1, domain=MS)
def qembed_layer_normalization(
    input_ids,
    segment_ids,
    word_embedding_quant,
    position_embedding_quant,
    segment_embedding,
    gamma_quant,
    beta_quant,
    mask,
    word_embedding_scale,
    position_embedding_scale,
    segment_embedding_scale,
    gamma_scale,
    beta_scale,
    word_embedding_zero_point,
    position_embedding_zero_point,
    segment_embedding_zero_point,
    gamma_zero_point,
    beta_zero_point,
    *,
    epsilon=9.999999960041972e-13,
):
    """com.microsoft QEmbedLayerNormalization-1: EmbedLayerNormalization of per-tensor
    quantized (int8/uint8) tables, gamma and beta, in float32; no embedding sum output."""
    op_type = "QEmbedLayerNormalization"
    segment_group = (
        segment_ids,
        segment_embedding,
        segment_embedding_scale,
        segment_embedding_zero_point,
    )
    if any(v is None for v in segment_group) != all(v is None for v in segment_group):
        raise ShapeError(
            f"{op_type}: segment_ids, segment_embedding, segment_embedding_scale and "
            "segment_embedding_zero_point come together (all or none)"
        )
    # Where the doc is silent, ORT's CPU kernel is the reference: positions are 0..S-1 (there
    # is no position_ids input), each scale and zero point is one value (a scalar or a 1-D
    # tensor of one), and mask_index counts the ones in each mask row, as for the float op.
    quantized = (
        ("word_embedding_quant", word_embedding_quant, word_embedding_scale,
         word_embedding_zero_point),
        ("position_embedding_quant", position_embedding_quant, position_embedding_scale,
         position_embedding_zero_point),
        ("segment_embedding", segment_embedding, segment_embedding_scale,
         segment_embedding_zero_point),
        ("gamma_quant", gamma_quant, gamma_scale, gamma_zero_point),
        ("beta_quant", beta_quant, beta_scale, beta_zero_point),
    )  # fmt: skip
    kind = jnp.asarray(word_embedding_quant).dtype
    if kind not in (np.int8, np.uint8):
        raise ValueError(f"{op_type}: word_embedding_quant must be int8 or uint8, got {kind}")
    params = {}
    for name, value, scale, zero_point in quantized:
        if value is None:
            continue
        prefix = name.removesuffix("_quant")
        # One type (T2) binds every quantized tensor and zero point.
        for what, tensor in ((name, value), (f"{prefix}_zero_point", zero_point)):
            if jnp.asarray(tensor).dtype != kind:
                raise ValueError(
                    f"{op_type}: {what} must have word_embedding_quant's type {kind}, got "
                    f"{jnp.asarray(tensor).dtype}"
                )
        params[name] = (
            _per_tensor(op_type, f"{prefix}_scale", scale).astype(np.float32),
            _per_tensor(op_type, f"{prefix}_zero_point", zero_point),
        )

    def dequantize(name, values):
        return dequantize_linear_v21(values, *params[name])

    y, mask_index, _ = _embed_layer_norm(
        op_type,
        input_ids,
        segment_ids,
        ("word_embedding_quant", word_embedding_quant),
        ("position_embedding_quant", position_embedding_quant),
        None if segment_embedding is None else ("segment_embedding", segment_embedding),
        ("gamma_quant", gamma_quant),
        ("beta_quant", beta_quant),
        mask,
        None,
        epsilon,
        dequantize,
    )
    return y, mask_index


# ------------------------------------------------------------------------------- group norm


@op("GroupNorm", since=1, domain=MS)
def group_norm(
    X, gamma, beta, *, activation, channels_last=1, epsilon=9.999999747378752e-06, groups
):
    """com.microsoft GroupNorm-1: GroupNormalization with per-channel gamma and beta, channels
    last (NHWC) by default, optionally followed by SiLU (activation=1)."""
    if activation not in (0, 1):
        raise ValueError(f"GroupNorm: activation must be 0 (none) or 1 (SiLU), got {activation}")
    X = jnp.asarray(X)
    if X.ndim < 3:
        raise ShapeError(f"GroupNorm: X must be (N, H, W, C) or (N, C, H, W), got {list(X.shape)}")
    if channels_last:
        x = jnp.moveaxis(X, -1, 1)
    else:
        x = X
    dtype = accumulation_dtype(X.dtype)
    # group_normalize rounds to X's type; with an activation, keep float32 until after it.
    y = group_normalize(x.astype(dtype), gamma, beta, groups, epsilon, dtype, per_channel=True)
    if activation:
        y = jax.nn.silu(y)
    if channels_last:
        y = jnp.moveaxis(y, 1, -1)
    return y.astype(X.dtype)


# ----------------------------------------------------------- ai.onnx-domain ORT normalizations


def _legacy_dtypes(op_type: str, x, scale, stash_type: int):
    """(compute dtype, statistics dtype): ORT's CPU kernel computes in the wider of float32
    (float64 for float64 inputs) and stash_type, and returns the statistics in stash_type."""
    stash = stash_dtype(op_type, stash_type)
    compute = np.promote_types(accumulation_dtype(x.dtype), stash)
    compute = np.promote_types(compute, accumulation_dtype(jnp.asarray(scale).dtype))
    return compute, stash


@op("LayerNormalization", since=1)
def layer_normalization_v1(
    X, Scale, B=None, *, axis=-1, epsilon=9.999999747378752e-06, stash_type=1
):
    """ORT's ai.onnx LayerNormalization-1: standardize axes [axis, rank), times Scale (+ B);
    Y has Scale's type, Mean and InvStdDev stash_type's."""
    X = jnp.asarray(X)
    axes = normalized_axes("LayerNormalization", X, axis)
    compute, stash = _legacy_dtypes("LayerNormalization", X, Scale, stash_type)
    scale = broadcast_unidirectional(Scale, X.shape, "LayerNormalization Scale")
    normalized, mean, inv_std = standardize(X, axes, epsilon, compute)
    y = normalized * scale.astype(compute)
    if B is not None:
        y = y + broadcast_unidirectional(B, X.shape, "LayerNormalization B").astype(compute)
    return y.astype(scale.dtype), mean.astype(stash), inv_std.astype(stash)


@op("SimplifiedLayerNormalization", since=1)
def simplified_layer_normalization(
    X, scale, *, axis=-1, epsilon=9.999999747378752e-06, stash_type=1
):
    """ORT's ai.onnx SimplifiedLayerNormalization-1: RMSNorm over axes [axis, rank), times
    scale; Y has scale's type, inv_std_var stash_type's."""
    X = jnp.asarray(X)
    axes = normalized_axes("SimplifiedLayerNormalization", X, axis)
    compute, stash = _legacy_dtypes("SimplifiedLayerNormalization", X, scale, stash_type)
    scale = broadcast_unidirectional(scale, X.shape, "SimplifiedLayerNormalization scale")
    normalized, inv_rms = _rms_standardize(X, axes, epsilon, compute)
    return (normalized * scale.astype(compute)).astype(scale.dtype), inv_rms.astype(stash)
