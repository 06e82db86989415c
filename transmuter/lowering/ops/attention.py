"""Attention family: Attention, FlexAttention (ai.onnx.preview), RotaryEmbedding, TensorScatter
(KV-cache writes) and LinearAttention.

Attention runs on (batch, heads, sequence, head_size) tensors. Grouped-query attention reshapes
the query heads to (kv_heads, group) instead of repeating K and V, so no copy of the cache is
made. Scores of half-precision inputs accumulate in float32 and the softmax runs in float32 (or
the node's softmax_precision); results are cast back to the input type at the end.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter import dtypes
from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op, variant

_SOFTMAX_PRECISIONS = (1, 10, 11, 16)  # float, float16, double, bfloat16


def _to_heads(name: str, x, num_heads, which: str):
    """A (batch, seq, heads*size) input as (batch, heads, seq, size); 4-D inputs unchanged."""
    if x.ndim == 4:
        return x
    if x.ndim != 3:
        raise ShapeError(f"Attention: {name} must be 3-D or 4-D, got shape {x.shape}")
    if num_heads is None or num_heads <= 0:
        raise ShapeError(f"Attention: 3-D {name} needs a positive {which} attribute")
    if x.shape[2] % num_heads:
        raise ShapeError(
            f"Attention: {name}'s hidden size {x.shape[2]} is not a multiple of {which}={num_heads}"
        )
    b, s, hidden = x.shape
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def _check_4d_heads(name: str, x, num_heads, which: str, allowed: bool) -> None:
    if num_heads is None:
        return
    if not allowed:
        raise ShapeError(f"Attention: {which} must not be given with 4-D inputs")
    if num_heads != x.shape[1]:
        raise ShapeError(
            f"Attention: {which}={num_heads} does not match {name}'s head axis ({x.shape})"
        )


def _mask_bias(attn_mask, target: tuple, dtype, pad: bool):
    """attn_mask as an additive bias of `dtype` broadcastable to `target` (batch, heads, q, total).

    A boolean mask allows the keys that are True; any other mask is added to the scores.
    """
    mask = jnp.asarray(attn_mask)
    if mask.ndim > 4:
        raise ShapeError(f"Attention: attn_mask must have at most 4 dims, got shape {mask.shape}")
    if mask.dtype == np.bool_:
        bias = jnp.where(mask, jnp.asarray(0, dtype), jnp.asarray(-jnp.inf, dtype))
    else:
        bias = mask.astype(dtype)
    total = target[-1]
    short = bias.ndim and bias.shape[-1] < total
    if short and pad:
        # From opset 24 a short mask is padded along the key axis: the missing keys are masked.
        widths = [(0, 0)] * (bias.ndim - 1) + [(0, total - bias.shape[-1])]
        bias = jnp.pad(bias, widths, constant_values=jnp.asarray(-jnp.inf, dtype))
    try:
        shape = np.broadcast_shapes(bias.shape, target)
    except ValueError:
        shape = None
    if shape != tuple(target):
        raise ShapeError(
            f"Attention: attn_mask of shape {mask.shape} does not broadcast to (batch, heads, "
            f"q_sequence, total_sequence) = {tuple(target)}"
        )
    return bias


def _allowed_keys(q_len, total, offset, is_causal, left, right, nonpad_kv_seqlen):
    """Which keys each query may see under causality, the window and the padding, or None.

    `offset` (a scalar or a (batch, 1, 1, 1) array) is the absolute position of query 0.
    """
    rows = jnp.arange(q_len, dtype=np.int64)[:, None] + offset
    cols = jnp.arange(total, dtype=np.int64)[None, :]
    allowed = None

    def both(a, b):
        return b if a is None else a & b

    if is_causal:
        allowed = both(allowed, cols <= rows)
    if left >= 0:
        allowed = both(allowed, cols >= rows - left)
    if right >= 0:
        allowed = both(allowed, cols <= rows + right)
    if nonpad_kv_seqlen is not None:
        lengths = jnp.asarray(nonpad_kv_seqlen).astype(np.int64).reshape(-1, 1, 1, 1)
        allowed = both(allowed, cols < lengths)
    return allowed


def _softmax(x, dtype):
    """Softmax over the last axis computed in `dtype`; an all -inf row gives zeros, not NaN."""
    x = x.astype(dtype)
    top = jnp.max(x, axis=-1, keepdims=True, initial=-jnp.inf)
    top = jnp.where(jnp.isneginf(top), jnp.asarray(0, dtype), top)
    e = jnp.exp(x - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return e / jnp.where(total == 0, jnp.asarray(1, dtype), total)


def append_past(op_type: str, past_key, past_value, k, v):
    """k and v (batch, heads, new, size) after the cached past_key / past_value (batch, heads,
    past, size), and the past length; unchanged with no cache."""
    if past_key is None:
        return k, v, 0
    past_key, past_value = jnp.asarray(past_key), jnp.asarray(past_value)
    for name, cache, new in (("past_key", past_key, k), ("past_value", past_value, v)):
        if cache.ndim != 4 or cache.shape[:2] != new.shape[:2] or cache.shape[3] != new.shape[3]:
            raise ShapeError(
                f"{op_type}: {name} {cache.shape} must be (batch, heads, past, head_size) "
                f"matching {new.shape}"
            )
    k = jnp.concatenate([past_key.astype(k.dtype), k], axis=2)
    v = jnp.concatenate([past_value.astype(v.dtype), v], axis=2)
    return k, v, past_key.shape[2]


def _attention(
    ctx,
    Q,
    K,
    V,
    attn_mask=None,
    past_key=None,
    past_value=None,
    nonpad_kv_seqlen=None,
    *,
    is_causal=0,
    kv_num_heads=None,
    left_window_size=-1,
    q_num_heads=None,
    qk_matmul_output_mode=0,
    right_window_size=-1,
    scale=None,
    softcap=0.0,
    softmax_precision=None,
    pad_mask: bool,
    heads_with_4d: bool,
):
    """Every version of ONNX Attention, with Attention-25's inputs and attributes: pad_mask pads
    a mask shorter than the keys (24), heads_with_4d allows the head counts with 4-D inputs
    (23 and 24)."""
    q, k, v, packed = _as_heads(Q, K, V, q_num_heads, kv_num_heads, heads_with_4d)
    batch, heads, q_len, head_size = q.shape
    _check_options(
        past_key, past_value, nonpad_kv_seqlen, qk_matmul_output_mode, softcap,
        left_window_size, right_window_size,
    )  # fmt: skip

    k, v, past = append_past("Attention", past_key, past_value, k, v)
    present_key, present_value = k, v
    total = k.shape[2]

    out_dtype = q.dtype
    acc = accumulation_dtype(out_dtype)
    raw = _scores(q, k, scale, acc)
    capped = raw
    if softcap > 0:
        cap = jnp.asarray(softcap, acc)
        capped = cap * jnp.tanh(raw / cap)

    target = (batch, heads, q_len, total)
    bias = None if attn_mask is None else _mask_bias(attn_mask, target, acc, pad_mask)
    if nonpad_kv_seqlen is not None:
        lengths = jnp.asarray(nonpad_kv_seqlen)
        if lengths.shape != (batch,):
            raise ShapeError(
                f"Attention: nonpad_kv_seqlen must have shape ({batch},), got {lengths.shape}"
            )
        offset = lengths.astype(np.int64).reshape(-1, 1, 1, 1) - q_len
    else:
        offset = past
    allowed = _allowed_keys(
        q_len, total, offset, is_causal, left_window_size, right_window_size, nonpad_kv_seqlen
    )
    if allowed is not None:
        blocked = jnp.where(allowed, jnp.asarray(0, acc), jnp.asarray(-jnp.inf, acc))
        bias = blocked if bias is None else bias + blocked
    scores = capped if bias is None else capped + bias
    probs = _probabilities(scores, bias, softmax_precision, acc)

    y = _weighted_values(probs, v, out_dtype)
    if packed:
        y = y.transpose(0, 2, 1, 3).reshape(batch, q_len, heads * v.shape[3])

    qk = None
    if ctx.wants(3):
        qk = (raw, capped, scores, probs)[qk_matmul_output_mode].astype(out_dtype)
    return y, present_key, present_value, qk


def _probabilities(scores, bias, softmax_precision, acc):
    """softmax(scores) over the keys, in softmax_precision when given (rounding the scores and
    the probabilities to it); a query whose every key the bias masks gets zeros, not NaN."""
    if softmax_precision is None:
        probs = _softmax(scores, acc)
    else:
        if softmax_precision not in _SOFTMAX_PRECISIONS:
            raise ValueError(
                f"Attention: softmax_precision must be one of {_SOFTMAX_PRECISIONS}, "
                f"got {softmax_precision}"
            )
        precision = dtypes.from_onnx(softmax_precision)
        # The arithmetic between the two roundings runs at least in float32.
        probs = _softmax(scores.astype(precision), accumulation_dtype(precision)).astype(precision)
    if bias is not None:
        empty = jnp.all(jnp.isneginf(jnp.broadcast_to(bias, scores.shape)), axis=-1, keepdims=True)
        probs = jnp.where(empty, jnp.zeros((), probs.dtype), probs)
    return probs


def _weighted_values(probs, v, out_dtype):
    """probs·V per head, [batch, heads, q_len, v_head_size] in out_dtype; each query-head
    group meets its key/value head."""
    batch, heads, q_len, total = probs.shape
    kv_heads = v.shape[1]
    pv = out_dtype
    if v.dtype != out_dtype:  # V (T2) may differ from Q (T1): meet in the wider float
        pv = np.dtype(np.float64 if np.float64 in (out_dtype, v.dtype) else np.float32)
    weights = probs.astype(pv).reshape(batch, kv_heads, heads // kv_heads, q_len, total)
    y = jnp.einsum(
        "bhgqk,bhkd->bhgqd", weights, v.astype(pv), preferred_element_type=accumulation_dtype(pv)
    )
    return y.reshape(batch, heads, q_len, v.shape[3]).astype(out_dtype)


def _as_heads(Q, K, V, q_num_heads, kv_num_heads, heads_with_4d: bool):
    """Q, K, V as (batch, heads, sequence, head_size), checked against one another, and
    whether they came packed as (batch, sequence, heads * head_size)."""
    q, k, v = jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V)
    if not q.ndim == k.ndim == v.ndim:
        raise ShapeError(
            f"Attention: Q, K and V must all be 3-D or all 4-D, got {q.shape}, {k.shape}, {v.shape}"
        )
    packed = q.ndim == 3
    if packed:
        q = _to_heads("Q", q, q_num_heads, "q_num_heads")
        k = _to_heads("K", k, kv_num_heads, "kv_num_heads")
        v = _to_heads("V", v, kv_num_heads, "kv_num_heads")
    elif q.ndim == 4:
        _check_4d_heads("Q", q, q_num_heads, "q_num_heads", heads_with_4d)
        _check_4d_heads("K", k, kv_num_heads, "kv_num_heads", heads_with_4d)
    else:
        raise ShapeError(f"Attention: Q must be 3-D or 4-D, got shape {q.shape}")
    batch, heads, _, head_size = q.shape
    kv_heads = k.shape[1]
    if k.shape[0] != batch or v.shape[0] != batch or k.shape[3] != head_size:
        raise ShapeError(
            f"Attention: K {k.shape} must match Q {q.shape} in batch and head size "
            "(as (batch, heads, sequence, head_size))"
        )
    if v.shape[1] != kv_heads or v.shape[2] != k.shape[2]:
        raise ShapeError(f"Attention: V {v.shape} must match K {k.shape} in heads and sequence")
    if kv_heads == 0 or heads % kv_heads:
        raise ShapeError(
            f"Attention: the query heads ({heads}) must be a multiple of the key/value heads "
            f"({kv_heads})"
        )
    return q, k, v, packed


def _check_options(
    past_key, past_value, nonpad_kv_seqlen, qk_matmul_output_mode, softcap, *windows
) -> None:
    if (past_key is None) != (past_value is None):
        raise ValueError("Attention: past_key and past_value must be given together")
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise ValueError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ValueError(
            f"Attention: qk_matmul_output_mode must be 0, 1, 2 or 3, got {qk_matmul_output_mode}"
        )
    if softcap < 0:
        raise ValueError(f"Attention: softcap must be >= 0, got {softcap}")
    for name, size in zip(("left_window_size", "right_window_size"), windows):
        if size < -1:
            raise ValueError(f"Attention: {name} must be -1 or >= 0, got {size}")


def _scores(q, k, scale, acc):
    """Q·Kᵀ times `scale` (1/sqrt(head_size) by default), [batch, heads, q_len, total], with
    each query-head group meeting its key/value head."""
    batch, heads, q_len, head_size = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(head_size) if head_size else 1.0
    # Q and K are each scaled by sqrt(scale) before the product, as the spec does, so that
    # half-precision scores do not overflow.
    root = jnp.asarray(math.sqrt(abs(scale)), q.dtype)
    qs = q * (root if scale >= 0 else -root)
    ks = k * root.astype(k.dtype)
    grouped = qs.reshape(batch, kv_heads, heads // kv_heads, q_len, head_size)
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", grouped, ks, preferred_element_type=acc)
    return scores.reshape(batch, heads, q_len, total)


attention_v23 = op("Attention", since=23, context=True)(variant(
    _attention, "attention_v23",
    "ONNX Attention-23: scaled dot-product attention with masks, KV cache and GQA.",
    fixed={"nonpad_kv_seqlen": None, "left_window_size": -1, "right_window_size": -1,
           "pad_mask": False, "heads_with_4d": True},
))  # fmt: skip
attention_v24 = op("Attention", since=24, context=True)(variant(
    _attention, "attention_v24",
    "ONNX Attention-24: adds nonpad_kv_seqlen (external cache) and short masks padded.",
    fixed={"left_window_size": -1, "right_window_size": -1, "pad_mask": True,
           "heads_with_4d": True},
))  # fmt: skip
attention_v25 = op("Attention", since=25, context=True)(variant(
    _attention, "attention_v25",
    "ONNX Attention-25: adds sliding windows; head counts are only for 3-D inputs.",
    fixed={"pad_mask": True, "heads_with_4d": False},
))  # fmt: skip


def _modify(ctx, graph, name: str, value):
    """Runs a FlexAttention modifier subgraph on `value`; the result keeps its shape and type."""
    outputs = ctx.run_graph(graph, [value])
    if len(outputs) != 1:
        raise ValueError(f"FlexAttention: {name} must have exactly one output, got {len(outputs)}")
    out = jnp.asarray(outputs[0])
    if out.shape != value.shape:
        raise ShapeError(f"FlexAttention: {name} changed the shape {value.shape} to {out.shape}")
    return out.astype(value.dtype)


@op("FlexAttention", since=1, domain="ai.onnx.preview", context=True)
def flex_attention(
    ctx, Q, K, V, *, prob_mod=None, scale=None, score_mod=None, softmax_precision=None
):
    """ONNX preview FlexAttention-1: attention with score_mod / prob_mod subgraphs and GQA."""
    q, k, v = jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V)
    if not q.ndim == k.ndim == v.ndim == 4:
        raise ShapeError(
            f"FlexAttention: Q, K and V must be 4-D, got {q.shape}, {k.shape}, {v.shape}"
        )
    batch, heads, q_len, head_size = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    if (
        k.shape[3] != head_size
        or v.shape[1:3] != k.shape[1:3]
        or not (k.shape[0] == v.shape[0] == batch)
    ):
        raise ShapeError(f"FlexAttention: Q {q.shape}, K {k.shape} and V {v.shape} do not agree")
    if kv_heads == 0 or heads % kv_heads:
        raise ShapeError(
            f"FlexAttention: the query heads ({heads}) must be a multiple of the key/value heads "
            f"({kv_heads})"
        )
    if softmax_precision is None:
        precision = np.dtype(np.float64 if q.dtype == np.float64 else np.float32)
    elif softmax_precision in _SOFTMAX_PRECISIONS:
        precision = dtypes.from_onnx(softmax_precision)
    else:
        raise ValueError(
            f"FlexAttention: softmax_precision must be one of {_SOFTMAX_PRECISIONS}, "
            f"got {softmax_precision}"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(head_size) if head_size else 1.0
    root = jnp.asarray(math.sqrt(abs(scale)), q.dtype)
    group = heads // kv_heads
    grouped = (q * (root if scale >= 0 else -root)).reshape(
        batch, kv_heads, group, q_len, head_size
    )
    scores = jnp.einsum(
        "bhgqd,bhkd->bhgqk", grouped, k * root, preferred_element_type=accumulation_dtype(q.dtype)
    )
    scores = scores.reshape(batch, heads, q_len, total).astype(precision)
    if score_mod is not None:
        scores = _modify(ctx, score_mod, "score_mod", scores)
    # A plain softmax, as the spec writes it: a row that score_mod masks entirely is NaN.
    compute = accumulation_dtype(precision)
    x = scores.astype(compute)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True, initial=-jnp.inf))
    probs = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(precision)
    if prob_mod is not None:
        probs = _modify(ctx, prob_mod, "prob_mod", probs)
    weights = probs.reshape(batch, kv_heads, group, q_len, total)
    y = jnp.einsum(
        "bhgqk,bhkd->bhgqd", weights, v.astype(precision), preferred_element_type=compute
    )
    return y.reshape(batch, heads, q_len, v.shape[3]).astype(v.dtype)


@op("RotaryEmbedding", since=23)
def rotary_embedding(
    X,
    cos_cache,
    sin_cache,
    position_ids=None,
    *,
    interleaved=0,
    num_heads=None,
    rotary_embedding_dim=0,
):
    """ONNX RotaryEmbedding-23: rotates the first rotary_embedding_dim features of each head."""
    x = jnp.asarray(X)
    cos, sin = jnp.asarray(cos_cache), jnp.asarray(sin_cache)
    if x.ndim == 4:
        heads_last = False  # (batch, heads, seq, size): the caches broadcast over axis 1
    elif x.ndim == 3:
        if num_heads is None or num_heads <= 0 or x.shape[2] % num_heads:
            raise ShapeError(
                f"RotaryEmbedding: 3-D X {x.shape} needs num_heads dividing its hidden size, "
                f"got num_heads={num_heads}"
            )
        heads_last = True  # (batch, seq, heads, size): the caches broadcast over axis 2
    else:
        raise ShapeError(f"RotaryEmbedding: X must be 3-D or 4-D, got shape {x.shape}")
    shaped = x.reshape(*x.shape[:2], num_heads, x.shape[2] // num_heads) if heads_last else x
    head_size = shaped.shape[-1]
    dim = rotary_embedding_dim or head_size
    if dim % 2 or dim > head_size:
        raise ShapeError(
            f"RotaryEmbedding: rotary_embedding_dim {dim} must be even and at most the head "
            f"size {head_size}"
        )
    if position_ids is not None:
        ids = jnp.asarray(position_ids)
        cos, sin = jnp.take(cos, ids, axis=0), jnp.take(sin, ids, axis=0)
    for name, cache in (("cos_cache", cos), ("sin_cache", sin)):
        if cache.shape[-1] != dim // 2:
            raise ShapeError(
                f"RotaryEmbedding: {name}'s last dim is {cache.shape[-1]}, expected "
                f"rotary_embedding_dim / 2 = {dim // 2}"
            )
    dtype = accumulation_dtype(x.dtype)
    axis = -2 if heads_last else -3
    cos = jnp.expand_dims(cos.astype(dtype), axis)
    sin = jnp.expand_dims(sin.astype(dtype), axis)
    rotate, keep = shaped[..., :dim].astype(dtype), shaped[..., dim:]
    if interleaved:
        x1, x2 = rotate[..., 0::2], rotate[..., 1::2]
    else:
        x1, x2 = rotate[..., : dim // 2], rotate[..., dim // 2 :]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = jnp.stack([real, imag], axis=-1).reshape(real.shape[:-1] + (dim,))
    else:
        rotated = jnp.concatenate([real, imag], axis=-1)
    out = jnp.concatenate([rotated.astype(x.dtype), keep], axis=-1)
    return out.reshape(x.shape)


@op("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    """ONNX TensorScatter-24: writes `update` into the cache at per-batch sequence offsets."""
    # String caches live on the host as numpy object arrays; everything else runs in JAX.
    xp = np if isinstance(past_cache, np.ndarray) and past_cache.dtype == object else jnp
    cache, update = xp.asarray(past_cache), xp.asarray(update)
    if mode not in ("linear", "circular"):
        raise ValueError(f"TensorScatter: mode must be 'linear' or 'circular', got {mode!r}")
    if cache.ndim < 2 or not -cache.ndim <= axis < cache.ndim or axis % cache.ndim == 0:
        raise ShapeError(
            f"TensorScatter: axis {axis} must name a non-batch axis of past_cache {cache.shape}"
        )
    axis %= cache.ndim
    size, length = cache.shape[axis], update.shape[axis] if update.ndim == cache.ndim else -1
    others = [i for i in range(cache.ndim) if i != axis]
    if length < 0 or length > size or any(cache.shape[i] != update.shape[i] for i in others):
        raise ShapeError(
            f"TensorScatter: update {update.shape} must match past_cache {cache.shape} except "
            f"along axis {axis}, where it may be at most {size} long"
        )
    batch = cache.shape[0]
    if write_indices is None:
        starts = xp.zeros((batch,), np.int64)
    else:
        starts = xp.asarray(write_indices).astype(np.int64)
        if starts.shape != (batch,):
            raise ShapeError(
                f"TensorScatter: write_indices must have shape ({batch},), got {starts.shape}"
            )
    if length == 0:
        return cache
    # A gather, not a scatter: cache slot p of batch b takes update[p - start[b]] when that
    # index is in range, so XLA can fuse the write with the select.
    source = xp.arange(size, dtype=np.int64)[None, :] - starts[:, None]
    if mode == "circular":
        source = source % size
    inside = (source >= 0) & (source < length)
    shape = [1] * cache.ndim
    shape[0], shape[axis] = batch, size
    source = xp.clip(source, 0, length - 1).reshape(shape)
    picked = xp.take_along_axis(update, source, axis=axis)
    return xp.where(inside.reshape(shape), picked, cache)


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _packed_heads(name: str, x, heads: int, batch_steps: tuple):
    """(batch, T, heads*d) as time-major (T, batch, heads, d) in float32."""
    if x.ndim != 3 or x.shape[:2] != batch_steps or x.shape[2] % heads:
        raise ShapeError(
            f"LinearAttention: {name} must be (batch, T, heads * size) = {batch_steps} + "
            f"(a multiple of {heads},), got {x.shape}"
        )
    b, t, packed = x.shape
    return x.reshape(b, t, heads, packed // heads).astype(np.float32).transpose(1, 0, 2, 3)


@op("LinearAttention", since=27)
def linear_attention(
    query,
    key,
    value,
    past_state=None,
    decay=None,
    beta=None,
    *,
    chunk_size=64,
    kv_num_heads,
    q_num_heads,
    scale=0.0,
    update_rule="gated_delta",
):
    """ONNX LinearAttention-27: recurrent (gated / delta-rule) linear attention with GQA."""
    # chunk_size only tunes chunk-parallel kernels; the scan below is exact for any value.
    if update_rule not in _UPDATE_RULES:
        raise ValueError(f"LinearAttention: update_rule must be one of {_UPDATE_RULES}")
    if q_num_heads <= 0 or kv_num_heads <= 0 or q_num_heads % kv_num_heads:
        raise ValueError(
            f"LinearAttention: q_num_heads ({q_num_heads}) must be a positive multiple of "
            f"kv_num_heads ({kv_num_heads})"
        )
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    for name, value_, needed in (("decay", decay, gated), ("beta", beta, delta)):
        if (value_ is None) == needed:
            raise ValueError(
                f"LinearAttention: update_rule {update_rule!r} "
                f"{'requires' if needed else 'does not use'} the {name} input"
            )
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    steps = tuple(query.shape[:2])
    q = _packed_heads("query", query, q_num_heads, steps)
    k = _packed_heads("key", key, kv_num_heads, steps)
    v = _packed_heads("value", value, kv_num_heads, steps)
    b, t = steps
    d_k, d_v, group = q.shape[3], v.shape[3], q_num_heads // kv_num_heads
    if k.shape[3] != d_k:
        raise ShapeError(f"LinearAttention: key head size {k.shape[3]} != query's {d_k}")
    q = q.reshape(t, b, kv_num_heads, group, d_k)
    g = None
    if gated:
        decay = jnp.asarray(decay)
        if decay.ndim != 3 or decay.shape[2] not in (kv_num_heads, kv_num_heads * d_k):
            raise ShapeError(
                f"LinearAttention: decay must be (batch, T, {kv_num_heads}) or (batch, T, "
                f"{kv_num_heads * d_k}), got {decay.shape}"
            )
        g = _packed_heads("decay", decay, kv_num_heads, steps)
    rate = None
    if delta:
        beta = jnp.asarray(beta)
        if beta.ndim != 3 or beta.shape[2] not in (kv_num_heads, 1):
            raise ShapeError(
                f"LinearAttention: beta must be (batch, T, {kv_num_heads}) or (batch, T, 1), "
                f"got {beta.shape}"
            )
        rate = _packed_heads("beta", beta, beta.shape[2], steps)
    state_shape = (b, kv_num_heads, d_k, d_v)
    if past_state is not None:
        past_state = jnp.asarray(past_state)
        if past_state.shape != state_shape:
            raise ShapeError(
                f"LinearAttention: past_state must have shape {state_shape}, got {past_state.shape}"
            )
        state_dtype = past_state.dtype
        state = past_state.astype(np.float32)
    else:
        state_dtype = query.dtype  # S cannot be told apart without past_state
        state = jnp.zeros(state_shape, np.float32)
    factor = jnp.asarray(scale if scale else 1.0 / math.sqrt(d_k), np.float32)

    def step(s, xs):
        q_t, k_t, v_t, g_t, beta_t = xs
        if g_t is not None:
            s = s * jnp.exp(g_t)[..., None]
        if beta_t is not None:
            v_t = beta_t * (v_t - jnp.einsum("bhdm,bhd->bhm", s, k_t))
        s = s + k_t[..., :, None] * v_t[..., None, :]
        return s, factor * jnp.einsum("bhgd,bhdm->bhgm", q_t, s)

    state, out = lax.scan(step, state, (q, k, v, g, rate))
    out = out.transpose(1, 0, 2, 3, 4).reshape(b, t, q_num_heads * d_v)
    return out.astype(query.dtype), state.astype(state_dtype)
