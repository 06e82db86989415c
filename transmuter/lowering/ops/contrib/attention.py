"""com.microsoft Attention, QAttention, MultiHeadAttention and RotaryEmbedding, as ONNX Runtime's
CPU kernels compute them. GroupQueryAttention lives in group_query_attention.py and shares the
helpers here.

Scores are scale * Q·K', plus the key padding mask as an additive mask_filter_value (default
-10000, so a row whose keys are all padding still averages them, as ONNX Runtime does), plus
attention_bias. Causal masking removes future keys outright. The softmax is the plain one: a row
of -inf biases is NaN, as in ONNX Runtime. Half-precision inputs accumulate and take the softmax
in float32 and are cast back at the end.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.ops.attention import append_past
from transmuter.lowering.ops.attention import rotary_embedding as _rotary_v23
from transmuter.lowering.ops.quantization import integer_matmul

DEFAULT_MASK_FILTER = -10000.0


def split_heads(op_type: str, name: str, x, num_heads: int):
    """A (batch, seq, heads * size) tensor as (batch, heads, seq, size)."""
    if x.ndim != 3:
        raise ShapeError(f"{op_type}: {name} must be (batch, sequence, hidden), got {x.shape}")
    b, s, hidden = x.shape
    if num_heads <= 0 or hidden % num_heads:
        raise ShapeError(
            f"{op_type}: {name}'s hidden size {hidden} is not a multiple of num_heads={num_heads}"
        )
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    """(batch, heads, seq, size) as (batch, seq, heads * size)."""
    b, n, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * d)


def default_scale(scale, head_size) -> float:
    # ONNX Runtime reads an absent scale as 0 and replaces 0 by 1/sqrt(head_size).
    if not scale:
        return 1.0 / math.sqrt(head_size) if head_size else 1.0
    return float(scale)


def attend(
    q,
    k,
    v,
    *,
    scale,
    bias=None,
    allowed=None,
    fill=-np.inf,
    softcap=0.0,
    sink=None,
    zero_empty=False,
):
    """Grouped attention on (batch, heads, seq, size) tensors; K and V may have fewer heads.

    Query head h reads key/value head h // (heads / kv_heads). Keys where `allowed` is False
    score `fill`; `sink` (one logit per head) joins every softmax denominator; `zero_empty`
    gives a query without any allowed key zero probabilities instead of NaN. Returns the
    output in q's dtype and the scores that entered the softmax and the probabilities, both
    (batch, heads, q_seq, total) in the compute type.
    """
    dtype = q.dtype
    acc = accumulation_dtype(dtype)
    batch, heads, q_len, size = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    if kv_heads == 0 or heads % kv_heads:
        raise ShapeError(
            f"attention: {heads} query heads are not a multiple of {kv_heads} key/value heads"
        )
    group = heads // kv_heads
    grouped = q.reshape(batch, kv_heads, group, q_len, size)
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", grouped, k.astype(dtype), preferred_element_type=acc)
    scores = scores.reshape(batch, heads, q_len, total) * jnp.asarray(scale, acc)
    if softcap > 0:
        cap = jnp.asarray(softcap, acc)
        scores = cap * jnp.tanh(scores / cap)
    if bias is not None:
        scores = scores + bias.astype(acc)
    if allowed is not None:
        scores = jnp.where(allowed, scores, jnp.asarray(fill, acc))
    top = jnp.max(scores, axis=-1, keepdims=True, initial=-jnp.inf)
    if sink is not None:
        sink = jnp.asarray(sink).astype(acc).reshape(1, heads, 1, 1)
        top = jnp.maximum(top, sink)
    e = jnp.exp(scores - top)
    denominator = jnp.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        denominator = denominator + jnp.exp(sink - top)
    probs = e / denominator
    if zero_empty and allowed is not None:
        seen = jnp.any(allowed, axis=-1, keepdims=True)
        probs = jnp.where(seen, probs, jnp.zeros((), acc))
    weights = probs.reshape(batch, kv_heads, group, q_len, total)
    out = jnp.einsum("bhgqk,bhkd->bhgqd", weights, v.astype(acc), preferred_element_type=acc)
    return out.reshape(batch, heads, q_len, v.shape[3]).astype(dtype), scores, probs


def causal_keep(q_len, total, offset):
    """Keys each query may see when query 0 sits at absolute position `offset`."""
    rows = jnp.arange(q_len, dtype=np.int64)[:, None] + offset
    return jnp.arange(total, dtype=np.int64)[None, :] <= rows


def check_attention_bias(op_type: str, attention_bias, batch, heads, q_len, total):
    """attention_bias, which must be (batch or 1, heads or 1, q_seq, total)."""
    bias = jnp.asarray(attention_bias)
    if (
        bias.ndim != 4
        or bias.shape[0] not in (1, batch)
        or bias.shape[1] not in (1, heads)
        or bias.shape[2:] != (q_len, total)
    ):
        raise ShapeError(
            f"{op_type}: attention_bias must be (batch or 1, num_heads or 1, sequence_length, "
            f"total_sequence_length) = ({batch} or 1, {heads} or 1, {q_len}, {total}), "
            f"got {bias.shape}"
        )
    return bias


def padding_bias(op_type: str, mask, batch, q_len, total, past, filter_value, *, end_start, full):
    """mask_index / key_padding_mask as an additive float32 bias (batch, 1, 1 or q_seq, total).

    1-D masks hold key end positions (batch), end then start positions (2 * batch, Attention
    only) or the (3 * batch + 2) form, of which ONNX Runtime's CPU kernel reads only the first
    batch values: the end positions. 2-D and 3-D masks keep the keys whose value is > 0. `full`
    also accepts Attention's 4-D (batch, 1, max_seq, max_seq) mask, whose row for a query is its
    absolute position past + i (ONNX Runtime's CPU kernel rejects that form).
    """
    mask = jnp.asarray(mask).astype(np.int64)
    cols = jnp.arange(total, dtype=np.int64)
    forms = ["(batch)", "(3 * batch + 2)", "(batch, total)", "(batch, sequence, total)"]
    if end_start:
        forms.insert(1, "(2 * batch)")
    if full:
        forms.append("(batch, 1, max_sequence, max_sequence)")
    keep = None
    if mask.ndim == 1:
        if mask.shape[0] in (batch, 3 * batch + 2):
            keep = cols[None, :] < mask[:batch, None]
        elif end_start and mask.shape[0] == 2 * batch:
            keep = (cols[None, :] < mask[:batch, None]) & (cols[None, :] >= mask[batch:, None])
        if keep is not None:
            keep = keep[:, None, None, :]
    elif mask.ndim == 2 and mask.shape == (batch, total):
        keep = (mask > 0)[:, None, None, :]
    elif mask.ndim == 3 and mask.shape == (batch, q_len, total):
        keep = (mask > 0)[:, None, :, :]
    elif (
        full
        and mask.ndim == 4
        and mask.shape[:2] == (batch, 1)
        and mask.shape[2] == mask.shape[3]
        and mask.shape[2] >= max(past + q_len, total)
    ):
        keep = mask[:, :, past : past + q_len, :total] > 0
    if keep is None:
        raise ShapeError(
            f"{op_type}: the mask must have one of the shapes {', '.join(forms)} with "
            f"batch={batch}, sequence={q_len}, total={total}; got {mask.shape}"
        )
    zero, masked = jnp.asarray(0, np.float32), jnp.asarray(filter_value, np.float32)
    return jnp.where(keep, zero, masked)


def masked_attention(
    op_type,
    q,
    k,
    v,
    mask,
    attention_bias,
    *,
    past,
    unidirectional,
    scale,
    mask_filter_value,
    end_start,
    full_mask,
):
    """Attention / MultiHeadAttention scores: padding mask, bias, causal cut, plain softmax."""
    batch, heads, q_len, size = q.shape
    total = k.shape[2]
    filter_value = DEFAULT_MASK_FILTER if mask_filter_value is None else mask_filter_value
    bias = None
    if mask is not None:
        bias = padding_bias(
            op_type,
            mask,
            batch,
            q_len,
            total,
            past,
            filter_value,
            end_start=end_start,
            full=full_mask,
        )
    if attention_bias is not None:
        extra = check_attention_bias(op_type, attention_bias, batch, heads, q_len, total)
        extra = extra.astype(accumulation_dtype(q.dtype))
        bias = extra if bias is None else bias.astype(extra.dtype) + extra
    allowed = causal_keep(q_len, total, past) if unidirectional else None
    # ONNX Runtime writes the lowest float over future keys; exp() makes them exactly 0.
    lowest = np.finfo(accumulation_dtype(q.dtype)).min
    return attend(
        q, k, v, scale=default_scale(scale, size), bias=bias, allowed=allowed, fill=lowest
    )


def _check_vector(op_type: str, name: str, x, sizes: tuple) -> None:
    if x.size not in sizes or x.ndim > 1:
        raise ShapeError(
            f"{op_type}: {name} must be a scalar or 1-D with one of {sizes} values, got {x.shape}"
        )


def _reject(op_type: str, **flags) -> None:
    for name, value in flags.items():
        if value:
            raise ValueError(
                f"{op_type}: {name}={value} is not supported (ONNX Runtime's CPU kernel rejects "
                "it too)"
            )


def _packed_past(op_type: str, past, batch, heads, k_size, v_size):
    """The (2, batch, heads, past_seq, size) cache as key and value halves."""
    past = jnp.asarray(past)
    if k_size != v_size:
        raise ShapeError(f"{op_type}: past needs equal K and V hidden sizes")
    if past.ndim != 5 or past.shape[:3] != (2, batch, heads) or past.shape[4] != k_size:
        raise ShapeError(
            f"{op_type}: past must be (2, batch, num_heads, past_sequence, head_size) = "
            f"(2, {batch}, {heads}, *, {k_size}), got {past.shape}"
        )
    return past[0], past[1]


def _packed_self_attention(
    ctx,
    op_type,
    q,
    k,
    v,
    num_heads,
    mask_index,
    past,
    attention_bias,
    *,
    unidirectional,
    scale,
    mask_filter_value,
):
    """Attention / QAttention after the projection: (batch, seq, hidden) Q, K and V."""
    q = split_heads(op_type, "Q", q, num_heads)
    k = split_heads(op_type, "K", k, num_heads)
    v = split_heads(op_type, "V", v, num_heads)
    if q.shape[3] != k.shape[3]:
        raise ShapeError(f"{op_type}: Q and K hidden sizes differ ({q.shape[3]}, {k.shape[3]})")
    past_len = 0
    if past is not None:
        past_k, past_v = _packed_past(op_type, past, q.shape[0], num_heads, k.shape[3], v.shape[3])
        past_len = past_k.shape[2]
        k = jnp.concatenate([past_k.astype(k.dtype), k], axis=2)
        v = jnp.concatenate([past_v.astype(v.dtype), v], axis=2)
    out, _, _ = masked_attention(
        op_type,
        q,
        k,
        v,
        mask_index,
        attention_bias,
        past=past_len,
        unidirectional=unidirectional,
        scale=scale,
        mask_filter_value=mask_filter_value,
        end_start=True,
        full_mask=True,
    )
    out = merge_heads(out)
    if not ctx.wants(1):
        return out
    if k.shape[3] != v.shape[3]:
        raise ShapeError(f"{op_type}: present needs equal K and V hidden sizes")
    return out, jnp.stack([k, v])


@op("Attention", since=1, domain="com.microsoft", context=True)
def attention(
    ctx,
    input,
    weights,
    bias=None,
    mask_index=None,
    past=None,
    attention_bias=None,
    past_sequence_length=None,
    *,
    do_rotary=None,
    mask_filter_value=None,
    num_heads,
    past_present_share_buffer=None,
    qkv_hidden_sizes=None,
    rotary_embedding_dim=None,
    scale=None,
    unidirectional=0,
):
    """com.microsoft Attention-1: packed QKV projection, then multi-head attention."""
    # past_sequence_length is only read with past_present_share_buffer and rotary_embedding_dim
    # only with do_rotary, both rejected.
    _reject("Attention", do_rotary=do_rotary, past_present_share_buffer=past_present_share_buffer)
    x, w = jnp.asarray(input), jnp.asarray(weights)
    if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2]:
        raise ShapeError(
            f"Attention: input must be (batch, sequence, input_hidden) and weights "
            f"(input_hidden, q + k + v hidden), got {x.shape} and {w.shape}"
        )
    if qkv_hidden_sizes is None:
        if w.shape[1] % 3:
            raise ShapeError(
                f"Attention: weights' second dim {w.shape[1]} must divide by 3 when "
                "qkv_hidden_sizes is absent"
            )
        sizes = (w.shape[1] // 3,) * 3
    else:
        sizes = tuple(int(s) for s in qkv_hidden_sizes)
        if len(sizes) != 3 or sum(sizes) != w.shape[1] or sizes[0] != sizes[1]:
            raise ShapeError(
                f"Attention: qkv_hidden_sizes {sizes} must be three sizes, Q equal to K, "
                f"summing to weights' second dim {w.shape[1]}"
            )
    acc = accumulation_dtype(x.dtype)
    qkv = jnp.einsum("bsi,ih->bsh", x, w.astype(x.dtype), preferred_element_type=acc)
    if bias is not None:
        bias = jnp.asarray(bias)
        _check_vector("Attention", "bias", bias, (w.shape[1],))
        qkv = qkv + bias.astype(acc)
    qkv = qkv.astype(x.dtype)
    q, k, v = jnp.split(qkv, [sizes[0], sizes[0] + sizes[1]], axis=-1)
    return _packed_self_attention(
        ctx,
        "Attention",
        q,
        k,
        v,
        num_heads,
        mask_index,
        past,
        attention_bias,
        unidirectional=unidirectional,
        scale=scale,
        mask_filter_value=mask_filter_value,
    )


@op("QAttention", since=1, domain="com.microsoft", context=True)
def q_attention(
    ctx,
    input,
    weight,
    bias,
    input_scale,
    weight_scale,
    mask_index=None,
    input_zero_point=None,
    weight_zero_point=None,
    past=None,
    *,
    do_rotary=None,
    mask_filter_value=None,
    num_heads,
    past_present_share_buffer=None,
    scale=None,
    unidirectional=0,
):
    """com.microsoft QAttention-1: 8-bit input and weights dequantized, then as Attention."""
    _reject("QAttention", do_rotary=do_rotary, past_present_share_buffer=past_present_share_buffer)
    x, w, bias = jnp.asarray(input), jnp.asarray(weight), jnp.asarray(bias)
    if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2] or w.shape[1] % 3:
        raise ShapeError(
            f"QAttention: input must be (batch, sequence, input_hidden) and weight "
            f"(input_hidden, 3 * hidden), got {x.shape} and {w.shape}"
        )
    columns = (1, w.shape[1])
    x_scale, w_scale = jnp.asarray(input_scale), jnp.asarray(weight_scale)
    _check_vector("QAttention", "input_scale", x_scale, (1,))
    _check_vector("QAttention", "weight_scale", w_scale, columns)
    for name, zero_point, sizes in (
        ("input_zero_point", input_zero_point, (1,)),
        ("weight_zero_point", weight_zero_point, columns),
    ):
        if zero_point is not None:
            _check_vector("QAttention", name, jnp.asarray(zero_point), sizes)
    _check_vector("QAttention", "bias", bias, (w.shape[1],))
    dtype = bias.dtype
    acc = accumulation_dtype(dtype)
    factor = x_scale.reshape(()).astype(acc) * w_scale.astype(acc)
    # The integer product is exact in int32, as in ONNX Runtime; the scales apply afterwards.
    product = integer_matmul(
        x,
        w,
        None if input_zero_point is None else jnp.asarray(input_zero_point).reshape(()),
        None if weight_zero_point is None else jnp.asarray(weight_zero_point).reshape(-1),
    )
    qkv = (product.astype(acc) * factor + bias.astype(acc)).astype(dtype)
    q, k, v = jnp.split(qkv, 3, axis=-1)
    return _packed_self_attention(
        ctx,
        "QAttention",
        q,
        k,
        v,
        num_heads,
        mask_index,
        past,
        None,
        unidirectional=unidirectional,
        scale=scale,
        mask_filter_value=mask_filter_value,
    )


def _unpack(op_type: str, name: str, x, parts: int):
    """A packed (batch, seq, heads, parts, size) tensor as `parts` BNSH tensors."""
    if x.shape[3] != parts:
        raise ShapeError(
            f"{op_type}: packed {name} must be (batch, sequence, num_heads, {parts}, head_size), "
            f"got {x.shape}"
        )
    return [x[:, :, :, i].transpose(0, 2, 1, 3) for i in range(parts)]


def _mha_inputs(query, key, value, bias, num_heads):
    """Q, K, V as BNSH from the forms MultiHeadAttention accepts; bias added where it applies."""
    op_type = "MultiHeadAttention"
    query = jnp.asarray(query)
    key = None if key is None else jnp.asarray(key)
    value = None if value is None else jnp.asarray(value)
    packed = query.ndim == 5 or (key is not None and key.ndim == 5)
    if packed and bias is not None:
        raise ValueError(f"{op_type}: bias cannot be combined with packed QKV or packed KV")
    if query.ndim == 5:
        if key is not None or value is not None:
            raise ValueError(f"{op_type}: packed QKV query takes no key or value")
        return _unpack(op_type, "QKV", query, 3)
    if query.ndim != 3:
        raise ShapeError(f"{op_type}: query must be 3-D or packed 5-D QKV, got {query.shape}")
    if key is None:
        raise ValueError(f"{op_type}: key is required unless query is packed QKV")
    hidden = query.shape[2]
    bias = None if bias is None else jnp.asarray(bias).astype(query.dtype)
    if bias is not None:
        if bias.ndim != 1 or bias.shape[0] <= hidden:
            raise ShapeError(f"{op_type}: bias must be (q + k + v hidden,), got {bias.shape}")
        query = query + bias[:hidden]
    q = split_heads(op_type, "query", query, num_heads)
    if key.ndim == 5:
        if value is not None:
            raise ValueError(f"{op_type}: packed KV key takes no value")
        k, v = _unpack(op_type, "KV", key, 2)
    elif key.ndim == 4:
        # Key and value already projected into heads (cross attention): no bias for them.
        if value is None or value.ndim != 4 or value.shape[:3] != key.shape[:3]:
            raise ShapeError(
                f"{op_type}: a 4-D key needs a 4-D value of the same (batch, num_heads, "
                f"kv_sequence), got {key.shape} and {None if value is None else value.shape}"
            )
        k, v = key, value
    elif key.ndim == 3:
        if value is None or value.ndim != 3 or value.shape[:2] != key.shape[:2]:
            raise ShapeError(
                f"{op_type}: a 3-D key needs a 3-D value of the same (batch, kv_sequence), got "
                f"{key.shape} and {None if value is None else value.shape}"
            )
        if bias is not None:
            k_hidden = key.shape[2]
            if bias.shape[0] != hidden + k_hidden + value.shape[2]:
                raise ShapeError(
                    f"{op_type}: bias must have query + key + value hidden = "
                    f"{hidden + k_hidden + value.shape[2]} values, got {bias.shape}"
                )
            key = key + bias[hidden : hidden + k_hidden]
            value = value + bias[hidden + k_hidden :]
        k = split_heads(op_type, "key", key, num_heads)
        v = split_heads(op_type, "value", value, num_heads)
    else:
        raise ShapeError(f"{op_type}: key must be 3-D, 4-D (BNSH) or packed 5-D, got {key.shape}")
    if k.shape[0] != q.shape[0] or k.shape[1] != num_heads or k.shape[3] != q.shape[3]:
        raise ShapeError(
            f"{op_type}: key {k.shape} does not match query {q.shape} in batch, num_heads "
            f"({num_heads}) and head size (as BNSH)"
        )
    return q, k.astype(q.dtype), v.astype(q.dtype)


@op("MultiHeadAttention", since=1, domain="com.microsoft", context=True)
def multi_head_attention(
    ctx,
    query,
    key=None,
    value=None,
    bias=None,
    key_padding_mask=None,
    attention_bias=None,
    past_key=None,
    past_value=None,
    past_sequence_length=None,
    cache_indirection=None,
    *,
    mask_filter_value=None,
    num_heads,
    scale=None,
    unidirectional=0,
):
    """com.microsoft MultiHeadAttention-1: self/cross attention with bias, masks and KV cache."""
    for name, value_ in (
        ("past_sequence_length", past_sequence_length),
        ("cache_indirection", cache_indirection),
    ):
        if value_ is not None:
            raise ValueError(
                f"MultiHeadAttention: the {name} input (shared past/present buffers, beam "
                "search) is not supported"
            )
    q, k, v = _mha_inputs(query, key, value, bias, num_heads)
    if (past_key is None) != (past_value is None):
        raise ValueError("MultiHeadAttention: past_key and past_value must be given together")
    k, v, past = append_past("MultiHeadAttention", past_key, past_value, k, v)
    # A causal mask aligns query i with key past + i; ONNX Runtime's CPU kernel gives
    # inconsistent rows when the query and new key lengths differ (cross attention).
    out, scores, _ = masked_attention(
        "MultiHeadAttention",
        q,
        k,
        v,
        key_padding_mask,
        attention_bias,
        past=past,
        unidirectional=unidirectional,
        scale=scale,
        mask_filter_value=mask_filter_value,
        end_start=False,
        full_mask=False,
    )
    outputs = (merge_heads(out), k, v)
    if ctx.wants(3):
        # Scaled scores plus mask and bias, as ONNX Runtime returns them. The node's declared
        # qk type is not visible here, so qk takes the query's type.
        outputs += (scores.astype(q.dtype),)
    return outputs


@op("RotaryEmbedding", since=1, domain="com.microsoft")
def rotary_embedding(
    input,
    position_ids,
    cos_cache,
    sin_cache,
    *,
    interleaved=None,
    is_packed_batching=None,
    num_heads=None,
    rotary_embedding_dim=None,
    scale=None,
):
    """com.microsoft RotaryEmbedding-1: RoPE on (batch, seq, hidden) or (batch, heads, seq, size)."""
    # ONNX Runtime's CPU kernel ignores `scale` and gives the same result for dense inputs with
    # is_packed_batching set, so both are accepted and have no effect here.
    x = jnp.asarray(input)
    cos = jnp.asarray(cos_cache)
    if x.ndim not in (3, 4) or cos.ndim != 2:
        raise ShapeError(
            f"RotaryEmbedding: input must be 3-D or 4-D and cos_cache 2-D, got {x.shape} and "
            f"{cos.shape}"
        )
    num_heads = num_heads or 0
    if rotary_embedding_dim and num_heads <= 0:
        raise ValueError("RotaryEmbedding: num_heads must be given with rotary_embedding_dim")
    heads = None
    if x.ndim == 3:
        head_size = x.shape[2] // num_heads if num_heads > 0 else 2 * cos.shape[1]
        if head_size == 0 or x.shape[2] % head_size:
            raise ShapeError(
                f"RotaryEmbedding: hidden size {x.shape[2]} is not a multiple of the head size "
                f"{head_size} (from num_heads or cos_cache)"
            )
        heads = x.shape[2] // head_size
    batch, seq = x.shape[0], x.shape[-2] if x.ndim == 4 else x.shape[1]
    ids = jnp.asarray(position_ids).astype(np.int64)
    if ids.ndim == 1 and ids.shape[0] == 1:
        # One start position for every batch entry.
        ids = jnp.broadcast_to(ids + jnp.arange(seq, dtype=np.int64), (batch, seq))
    elif ids.shape != (batch, seq):
        raise ShapeError(
            f"RotaryEmbedding: position_ids must be (1) or (batch, sequence) = ({batch}, {seq}), "
            f"got {ids.shape}"
        )
    return _rotary_v23(
        x,
        cos,
        sin_cache,
        ids,
        interleaved=interleaved or 0,
        num_heads=heads,
        rotary_embedding_dim=rotary_embedding_dim or 0,
    )
