"""com.microsoft GroupQueryAttention, as ONNX Runtime's CPU kernel computes it.

Per batch entry b the cache holds T_b = seqlens_k[b] + 1 tokens after the step. The new tokens
start at P_b = T_b - sequence_length (or T_b - query_seqlens[b]), except on the first prompt
(total_sequence_length == sequence_length without query_seqlens), where P_b = 0 and a prompt
shorter than the padded sequence is right-padded: its keys past T_b are masked and its padding
rows are written to the cache but read by no valid query. The present cache is
max(past length, total_sequence_length) long: rows [0, P_b) come from the past, the new rows
follow, the rest are zero (ONNX Runtime leaves them unset). Query i sits at position P_b + i
for the causal mask, the local window and the rotary embedding. A query with no visible key
gets zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.ops.attention import rotary_embedding as _rotary_v23
from transmuter.lowering.ops.contrib.attention import (
    attend,
    check_attention_bias,
    default_scale,
    merge_heads,
    split_heads,
)

_OP = "GroupQueryAttention"
_CACHE_TYPES = tuple(np.dtype(t) for t in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64))


def _check_supported(
    *,
    causal,
    local_window_size,
    sliding_window_cache,
    k_quant_type,
    v_quant_type,
    k_scale,
    v_scale,
    q_norm_weight,
    k_norm_weight,
    qk_output,
    past_key,
):
    for name, value in (("k_quant_type", k_quant_type), ("v_quant_type", v_quant_type)):
        if value != "NONE":
            raise ValueError(f"{_OP}: {name}={value!r}: a quantized KV cache is not supported")
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if value is not None:
            raise ValueError(f"{_OP}: the {name} input (quantized KV cache) is not supported")
    if past_key is not None and jnp.asarray(past_key).dtype not in _CACHE_TYPES:
        raise ValueError(
            f"{_OP}: past_key of type {jnp.asarray(past_key).dtype} (quantized KV cache, "
            "kv_cache_bit_width) is not supported"
        )
    for name, value in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if value is not None:
            raise ValueError(
                f"{_OP}: the {name} input (per-head Q/K RMS norm) is not supported; ONNX "
                "Runtime's CPU kernel rejects it too"
            )
    if sliding_window_cache:
        raise ValueError(f"{_OP}: sliding_window_cache={sliding_window_cache} is not supported")
    if causal not in (0, 1):
        raise ValueError(f"{_OP}: causal must be 0 or 1, got {causal}")
    if not causal and local_window_size != -1:
        raise ValueError(f"{_OP}: local_window_size must be -1 when causal is 0")
    if qk_output not in (0, 1, 2):
        raise ValueError(f"{_OP}: qk_output must be 0, 1 or 2, got {qk_output}")


def _split_qkv(query, key, value, num_heads, kv_num_heads):
    """Q (B, N, S, D), K and V (B, Nk, S, D) from separate or packed inputs."""
    query = jnp.asarray(query)
    if query.ndim != 3:
        raise ShapeError(f"{_OP}: query must be (batch, sequence, hidden), got {query.shape}")
    if kv_num_heads <= 0 or num_heads <= 0 or num_heads % kv_num_heads:
        raise ValueError(
            f"{_OP}: num_heads ({num_heads}) must be a positive multiple of kv_num_heads "
            f"({kv_num_heads})"
        )
    if key is None and value is None:
        parts = num_heads + 2 * kv_num_heads
        if query.shape[2] % parts:
            raise ShapeError(
                f"{_OP}: packed QKV's last dim {query.shape[2]} is not (num_heads + 2 * "
                f"kv_num_heads) * head_size with num_heads={num_heads}, "
                f"kv_num_heads={kv_num_heads}"
            )
        size = query.shape[2] // parts
        query, key, value = jnp.split(
            query, [num_heads * size, (num_heads + kv_num_heads) * size], axis=-1
        )
    elif key is None or value is None:
        raise ValueError(f"{_OP}: key and value must be given together (or both absent)")
    key, value = jnp.asarray(key), jnp.asarray(value)
    if key.shape[:2] != query.shape[:2] or value.shape != key.shape:
        raise ShapeError(
            f"{_OP}: key and value must be (batch, sequence_length, kv_hidden) like query "
            f"{query.shape[:2]}, got {key.shape} and {value.shape}"
        )
    q = split_heads(_OP, "query", query, num_heads)
    k = split_heads(_OP, "key", key.astype(query.dtype), kv_num_heads)
    v = split_heads(_OP, "value", value.astype(query.dtype), kv_num_heads)
    if k.shape[3] != q.shape[3]:
        raise ShapeError(f"{_OP}: key head size {k.shape[3]} differs from query's {q.shape[3]}")
    return q, k, v


def _present(past, new, starts, counts, length):
    """The cache after the step: past rows before starts[b], `counts[b]` new rows from there."""
    batch, heads, steps, size = new.shape
    slots = jnp.arange(length, dtype=np.int64)[None, :]
    source = slots - starts[:, None]
    from_new = (source >= 0) & (source < counts[:, None])
    out = jnp.zeros((batch, heads, length, size), new.dtype)
    if steps:
        index = jnp.clip(source, 0, steps - 1)[:, None, :, None]
        picked = jnp.take_along_axis(new, index, axis=2)
        out = jnp.where(from_new[:, None, :, None], picked, out)
    if past is not None and past.shape[2]:
        kept = past.astype(new.dtype)[:, :, :length]
        if kept.shape[2] < length:
            kept = jnp.pad(kept, ((0, 0), (0, 0), (0, length - kept.shape[2]), (0, 0)))
        from_past = slots < starts[:, None]
        out = jnp.where(from_past[:, None, :, None], kept, out)
    return out


def _rotate(x, positions, cos_cache, sin_cache, interleaved):
    cos = jnp.asarray(cos_cache)
    if cos.ndim != 2 or 2 * cos.shape[1] > x.shape[3]:
        raise ShapeError(
            f"{_OP}: cos_cache must be (max_sequence, rotary_dim / 2) with rotary_dim at most "
            f"the head size {x.shape[3]}, got {cos.shape}"
        )
    return _rotary_v23(
        x,
        cos,
        sin_cache,
        positions,
        interleaved=interleaved,
        rotary_embedding_dim=2 * cos.shape[1],
    )


def _checked_past(past_key, past_value, batch: int, kv_num_heads: int, size: int):
    """The past key and value as arrays (both or neither), checked to be BNSH."""
    if (past_key is None) != (past_value is None):
        raise ValueError(f"{_OP}: past_key and past_value must be given together")
    if past_key is None:
        return None, None
    past_key, past_value = jnp.asarray(past_key), jnp.asarray(past_value)
    expected = (batch, kv_num_heads, past_key.shape[2], size)
    if past_key.shape != expected or past_value.shape != expected:
        raise ShapeError(
            f"{_OP}: past_key and past_value must be (batch, kv_num_heads, past_sequence, "
            f"head_size) = {expected}, got {past_key.shape} and {past_value.shape}"
        )
    return past_key, past_value


@dataclass(frozen=True)
class _Cache:
    """Where each row's new tokens go in the cache: `lengths` valid slots after this step,
    `counts` new tokens written from `starts`, at `positions` [batch, steps]."""

    lengths: jax.Array
    counts: jax.Array
    starts: jax.Array
    positions: jax.Array
    first_prompt: bool


def _cache_positions(seqlens_k, query_seqlens, batch, steps, past_len, total) -> _Cache:
    """seqlens_k holds each row's total length minus one; without query_seqlens every row adds
    `steps` tokens, and a first prompt (total == steps) writes from slot 0."""
    lengths = jnp.asarray(seqlens_k).astype(np.int64)
    if lengths.shape != (batch,):
        raise ShapeError(f"{_OP}: seqlens_k must have shape ({batch},), got {lengths.shape}")
    lengths = lengths + 1
    first_prompt = False
    if query_seqlens is not None:
        counts = jnp.asarray(query_seqlens).astype(np.int64)
        if counts.shape != (batch,):
            raise ShapeError(f"{_OP}: query_seqlens must have shape ({batch},), got {counts.shape}")
    else:
        if not (total <= past_len or total == past_len + steps):
            raise ShapeError(
                f"{_OP}: total_sequence_length must be past_sequence_length + "
                f"sequence_length ({past_len} + {steps}) for a growing cache or at most "
                f"past_sequence_length for a fixed one, got {total}"
            )
        first_prompt = total == steps
        counts = jnp.full((batch,), steps, np.int64)
    starts = jnp.zeros((batch,), np.int64) if first_prompt else lengths - counts
    positions = starts[:, None] + jnp.arange(steps, dtype=np.int64)[None, :]
    return _Cache(lengths, counts, starts, positions, first_prompt)


def _rotary_positions(cache: _Cache, position_ids, batch: int, steps: int):
    """The positions rotary embedding rotates by: the cache positions, or position_ids."""
    if position_ids is None:
        return cache.positions
    ids = jnp.asarray(position_ids).astype(np.int64)
    if cache.first_prompt:
        # ONNX Runtime reads only the first position id on the first prompt.
        first = ids.reshape(-1)[0] + jnp.arange(steps, dtype=np.int64)
        return jnp.broadcast_to(first, (batch, steps))
    if ids.shape != (batch, steps):
        raise ShapeError(
            f"{_OP}: position_ids must be (batch, sequence) = ({batch}, {steps}), got {ids.shape}"
        )
    return ids


def _allowed(cache: _Cache, length: int, causal, local_window_size: int):
    """[batch, 1, steps, length]: the cache slots each query may attend to."""
    slots = jnp.arange(length, dtype=np.int64)[None, None, :]
    positions = cache.positions[:, :, None]
    allowed = slots < cache.lengths[:, None, None]
    if causal:
        allowed = allowed & (slots <= positions)
        if local_window_size >= 0:
            allowed = allowed & (slots > positions - local_window_size)
    batch, steps = cache.positions.shape
    return jnp.broadcast_to(allowed, (batch, steps, length))[:, None]


def _sink(head_sink, smooth_softmax: int, num_heads: int, dtype):
    """The per-head sink logit added to the softmax's denominator: head_sink, or 0 for
    smooth_softmax; None for neither."""
    if head_sink is not None:
        sink = jnp.asarray(head_sink)
        if sink.shape != (num_heads,):
            raise ShapeError(f"{_OP}: head_sink must have shape ({num_heads},), got {sink.shape}")
        return sink
    if smooth_softmax == 1:
        return jnp.zeros((num_heads,), accumulation_dtype(dtype))
    return None


@op(
    "GroupQueryAttention",
    since=1,
    domain="com.microsoft",
    context=True,
    host_inputs={
        "total_sequence_length": "the present cache length and whether the step is the first prompt"
    },
)
def group_query_attention(
    ctx,
    query,
    key,
    value,
    past_key,
    past_value,
    seqlens_k,
    total_sequence_length,
    cos_cache=None,
    sin_cache=None,
    position_ids=None,
    attention_bias=None,
    head_sink=None,
    k_scale=None,
    v_scale=None,
    q_norm_weight=None,
    k_norm_weight=None,
    query_seqlens=None,
    *,
    causal=1,
    do_rotary=None,
    k_norm_epsilon=None,
    k_quant_type="NONE",
    kv_cache_bit_width=None,
    kv_num_heads,
    local_window_size=-1,
    num_heads,
    q_norm_epsilon=None,
    qk_norm_epsilon=1e-6,
    qk_output=0,
    rotary_interleaved=None,
    scale=None,
    sliding_window_cache=0,
    smooth_softmax=-1,
    softcap=None,
    v_quant_type="NONE",
):
    """com.microsoft GroupQueryAttention-1: GQA over a BNSH KV cache with rotary and windows.

    key, value, past_key and past_value are optional (absent key and value mean packed QKV)
    but come before the required seqlens_k, so they have no Python default.
    """
    # kv_cache_bit_width and the *_norm_epsilon attributes only matter with a quantized cache
    # or the Q/K norm inputs, which are rejected here.
    _check_supported(
        causal=causal,
        local_window_size=local_window_size,
        sliding_window_cache=sliding_window_cache,
        k_quant_type=k_quant_type,
        v_quant_type=v_quant_type,
        k_scale=k_scale,
        v_scale=v_scale,
        q_norm_weight=q_norm_weight,
        k_norm_weight=k_norm_weight,
        qk_output=qk_output,
        past_key=past_key,
    )
    q, k, v = _split_qkv(query, key, value, num_heads, kv_num_heads)
    batch, _, steps, size = q.shape
    total = int(np.asarray(total_sequence_length).reshape(-1)[0])
    past_key, past_value = _checked_past(past_key, past_value, batch, kv_num_heads, size)
    past_len = 0 if past_key is None else past_key.shape[2]
    cache = _cache_positions(seqlens_k, query_seqlens, batch, steps, past_len, total)

    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise ValueError(f"{_OP}: do_rotary needs cos_cache and sin_cache")
        rotary_positions = _rotary_positions(cache, position_ids, batch, steps)
        interleaved = rotary_interleaved or 0
        q = _rotate(q, rotary_positions, cos_cache, sin_cache, interleaved)
        k = _rotate(k, rotary_positions, cos_cache, sin_cache, interleaved)

    length = max(past_len, total)
    present_key = _present(past_key, k, cache.starts, cache.counts, length)
    present_value = _present(past_value, v, cache.starts, cache.counts, length)
    allowed = _allowed(cache, length, causal, local_window_size)

    bias = None
    if attention_bias is not None:
        bias = check_attention_bias(_OP, attention_bias, batch, num_heads, steps, total)
        bias = bias.astype(accumulation_dtype(q.dtype))
        if length > total:
            bias = jnp.pad(bias, ((0, 0), (0, 0), (0, 0), (0, length - total)))
    sink = _sink(head_sink, smooth_softmax, num_heads, q.dtype)

    out, scores, probs = attend(
        q,
        present_key,
        present_value,
        scale=default_scale(scale, size),
        bias=bias,
        allowed=allowed,
        softcap=softcap or 0.0,
        sink=sink,
        zero_empty=True,
    )
    outputs = (merge_heads(out), present_key, present_value)
    if ctx.wants(3):
        if not qk_output:
            raise ValueError(f"{_OP}: output_qk is requested but qk_output is 0")
        # Scores after softcap and bias (1) or probabilities (2); masked keys read 0.
        chosen = scores if qk_output == 1 else probs
        chosen = jnp.where(allowed, chosen, jnp.zeros((), chosen.dtype))
        outputs += (chosen[..., :total].astype(q.dtype),)
    return outputs
