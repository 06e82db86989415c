"""A hand-written JAX BERT encoder: the XLA reference for the MiniLM-sized export.

It reads bench/.cache/minilm_weights.npz (bench/make_minilm.py: the same seeded weights as
minilm.onnx, torch names) and computes what transformers' BertModel does in eval mode with eager
attention: embeddings + LayerNorm, then per layer self-attention with the additive mask, output
projection + residual + LayerNorm, erf GELU feed-forward + residual + LayerNorm. Written the
way a JAX user would write it, jitted whole, so the gap between it and the compiled ONNX graph is
what the lowering costs on top of plain XLA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

HEADS = 12
EPS = 1e-12


def load_params(path: Path) -> dict[str, jax.Array]:
    """The state dict, with each Linear weight transposed to [in, out] once, for x @ w."""
    with np.load(path) as data:
        params = {}
        for name in data.files:
            value = data[name]
            if name.endswith(".weight") and value.ndim == 2 and "embeddings" not in name:
                value = value.T
            params[name] = jax.device_put(value)
    return params


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + EPS) * scale + bias


def dense(p: dict[str, jax.Array], prefix: str, x: jax.Array) -> jax.Array:
    return x @ p[f"{prefix}.weight"] + p[f"{prefix}.bias"]


def norm(p: dict[str, jax.Array], prefix: str, x: jax.Array) -> jax.Array:
    return layer_norm(x, p[f"{prefix}.weight"], p[f"{prefix}.bias"])


def attention(p: dict[str, jax.Array], prefix: str, x: jax.Array, mask: jax.Array) -> jax.Array:
    batch, seq, hidden = x.shape
    head = hidden // HEADS

    def heads(name: str) -> jax.Array:
        y = dense(p, f"{prefix}.self.{name}", x)
        return y.reshape(batch, seq, HEADS, head).transpose(0, 2, 1, 3)

    q, k, v = heads("query"), heads("key"), heads("value")
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head) + mask
    context = jax.nn.softmax(scores, axis=-1) @ v
    context = context.transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    return norm(p, f"{prefix}.output.LayerNorm", dense(p, f"{prefix}.output.dense", context) + x)


def encoder_layer(p: dict[str, jax.Array], i: int, x: jax.Array, mask: jax.Array) -> jax.Array:
    prefix = f"encoder.layer.{i}"
    x = attention(p, f"{prefix}.attention", x, mask)
    inner = jax.nn.gelu(dense(p, f"{prefix}.intermediate.dense", x), approximate=False)
    return norm(p, f"{prefix}.output.LayerNorm", dense(p, f"{prefix}.output.dense", inner) + x)


def bert(
    p: dict[str, jax.Array],
    input_ids: jax.Array,
    attention_mask: jax.Array,
    token_type_ids: jax.Array,
) -> jax.Array:
    seq = input_ids.shape[1]
    x = (
        p["embeddings.word_embeddings.weight"][input_ids]
        + p["embeddings.position_embeddings.weight"][:seq]
        + p["embeddings.token_type_embeddings.weight"][token_type_ids]
    )
    x = norm(p, "embeddings.LayerNorm", x)
    # transformers' extended mask: 0 where attended, the dtype's minimum where masked.
    mask = (1.0 - attention_mask[:, None, None, :].astype(x.dtype)) * jnp.finfo(x.dtype).min
    layers = 1 + max(int(name.split(".")[2]) for name in p if name.startswith("encoder.layer."))
    for i in range(layers):
        x = encoder_layer(p, i, x, mask)
    return x


def compiled(path: Path) -> Callable[..., jax.Array]:
    """bert jitted with its params bound: call it with the three input arrays."""
    params = load_params(path)
    fn = jax.jit(bert)
    return lambda input_ids, attention_mask, token_type_ids: fn(
        params, input_ids, attention_mask, token_type_ids
    )
