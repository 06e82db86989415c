"""The XLA options the runtime compiles with (runtime/xla_options.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from jax import lax

import transmuter
from transmuter.runtime import xla_options


def _ynn_fusion_ops(text: str) -> list[set[str]]:
    """The ops inside each computation the compiled program runs as a YNNPACK fusion."""
    called = re.findall(r'calls=%?([\w.\-]+).*"kind":"__ynn_fusion"', text)
    bodies = []
    for name in called:
        start = text.index(f"%{name} ")
        body = text[start : text.index("\n}", start)]
        bodies.append(set(re.findall(r"= \S+ ([a-z][\w-]*)\(", body)))
    return bodies


def _feed_forward(x, w1, b1, w2, b2):
    """A transformer's FFN with its residual and LayerNorm (MiniLM's, at batch 32)."""
    h = x @ w1 + b1
    y = h * 0.5 * (1 + lax.erf(h * 0.7071)) @ w2 + b2 + x
    mean = y.mean(-1, keepdims=True)
    return (y - mean) * lax.rsqrt(((y - mean) ** 2).mean(-1, keepdims=True) + 1e-12)


def test_cpu_programs_keep_ynnpack_to_single_dots(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert xla_options.compiler_options({"x": jnp.ones(3), "host": 1.0}) == xla_options.CPU
    shapes = [(4096, 384), (384, 1536), (1536,), (1536, 384), (384,)]
    lowered = jax.jit(_feed_forward).lower(*(jnp.ones(s) for s in shapes))
    # XLA's default: both dots and the work between them in one fusion.
    assert any({"dot", "erf"} <= ops for ops in _ynn_fusion_ops(lowered.compile().as_text()))
    fused = _ynn_fusion_ops(lowered.compile(xla_options.compiler_options([jnp.ones(1)])).as_text())
    assert fused and all(ops <= {"parameter", "dot", "bitcast"} for ops in fused)


def test_a_users_xla_flags_setting_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=dot")
    assert xla_options.compiler_options([jnp.ones(2)]) == {}


def test_transmuter_jit_gives_a_program_of_ones_own_the_same_options(monkeypatch):
    """The pipelines' own programs (the diffusion loop, decoding steps) and a user's jitted
    function around `transmuter.run` compile as `transmuter.compile`'s do: SD 1.5's UNet took
    3.6 s a call under plain jax.jit, 2.3-2.5 s with these options."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    args = [jnp.ones(s) for s in [(4096, 384), (384, 1536), (1536,), (1536, 384), (384,)]]
    fused = _ynn_fusion_ops(transmuter.jit(_feed_forward).lower(*args).compile().as_text())
    assert fused and all(ops <= {"parameter", "dot", "bitcast"} for ops in fused)

    @transmuter.jit(static_argnames=("scale",))
    def scaled(x, scale):
        return _feed_forward(x, *args[1:]) * scale

    want = jax.jit(_feed_forward)(*args) * 2
    assert jnp.allclose(scaled(args[0], scale=2), want, rtol=1e-5, atol=1e-5)
