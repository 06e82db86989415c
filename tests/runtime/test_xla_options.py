"""The XLA options the runtime compiles with (runtime/xla_options.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from onnx import TensorProto, helper, numpy_helper

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


def _int8_dot(x, w):
    return lax.dot(x, w, preferred_element_type=jnp.int32)


_FFN_SHAPES = [(4096, 384), (384, 1536), (1536,), (1536, 384), (384,)]
_INT8 = [jnp.ones((128, 384), jnp.int8), jnp.ones((384, 1536), jnp.int8)]


def test_a_program_of_float_dots_leaves_ynnpack_off(monkeypatch):
    """Eigen's float32 dots are as fast or faster: 1.3-2x at a decode step's 4 to 16 rows."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    lowered = jax.jit(_feed_forward).lower(*(jnp.ones(s) for s in _FFN_SHAPES))
    # XLA's default: both dots and the work between them in one fusion.
    assert any({"dot", "erf"} <= ops for ops in _ynn_fusion_ops(lowered.compile().as_text()))
    options = xla_options.compiler_options(lowered, {"x": jnp.ones(3), "host": 1.0})
    assert options == xla_options.OWN_DOTS
    assert _ynn_fusion_ops(lowered.compile(options).as_text()) == []


def test_integer_and_bf16_dots_keep_ynnpack_for_single_dots(monkeypatch):
    """YNNPACK's int8 dot is 3-3.5x Eigen's; its fusion pass stays off the elementwise work."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)

    def mixed(x, w1, b1, w2, b2, q, p):
        return _feed_forward(x, w1, b1, w2, b2), _int8_dot(q, p)

    lowered = jax.jit(mixed).lower(*(jnp.ones(s) for s in _FFN_SHAPES), *_INT8)
    options = xla_options.compiler_options(lowered, [jnp.ones(1)])
    assert options == xla_options.LIBRARY_DOTS
    fused = _ynn_fusion_ops(lowered.compile(options).as_text())
    assert len(fused) == 3 and all(ops <= {"parameter", "dot", "bitcast"} for ops in fused)

    def bf16(x, w):
        return lax.dot(x, w, preferred_element_type=jnp.float32)

    bf = [jnp.ones((16, 768), jnp.bfloat16), jnp.ones((768, 3072), jnp.bfloat16)]
    assert xla_options.for_program(jax.jit(bf16).lower(*bf), "cpu") == xla_options.LIBRARY_DOTS


def test_a_dot_inside_a_loop_body_counts():
    def looped(q, p):
        return lax.fori_loop(
            0, 3, lambda i, c: c + _int8_dot(q, p), jnp.zeros((128, 1536), "int32")
        )

    assert xla_options.for_program(jax.jit(looped).lower(*_INT8), "cpu") == xla_options.LIBRARY_DOTS
    assert xla_options.for_program(jax.jit(looped).lower(*_INT8), "gpu") == {}


def test_a_users_xla_flags_setting_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=dot")
    lowered = jax.jit(_int8_dot).lower(*_INT8)
    assert xla_options.compiler_options(lowered, [jnp.ones(2)]) == {}


def test_transmuter_compile_chooses_by_the_graphs_dots(monkeypatch):
    """MatMulInteger's program keeps YNNPACK for its int8 dot; MatMul's leaves it off."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    chosen = []
    real = xla_options.for_program
    monkeypatch.setattr(
        xla_options, "for_program", lambda *a: chosen.append(real(*a)) or chosen[-1]
    )
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (64, 32), dtype=np.int8)
    x = rng.integers(0, 256, (8, 64), dtype=np.uint8)
    for op, x_type, w_value, feed in (
        ("MatMulInteger", TensorProto.UINT8, w, x),
        ("MatMul", TensorProto.FLOAT, w.astype(np.float32), x.astype(np.float32)),
    ):
        graph = helper.make_graph(
            [helper.make_node(op, ["x", "w"], ["y"])], op,
            [helper.make_tensor_value_info("x", x_type, [8, 64])],
            [helper.make_tensor_value_info("y", TensorProto.INT32 if op != "MatMul" else TensorProto.FLOAT, [8, 32])],
            [numpy_helper.from_array(w_value, "w")],
        )  # fmt: skip
        model = transmuter.load(
            helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        )
        got = transmuter.compile(model, {"x": feed})({"x": feed})["y"]
        np.testing.assert_array_equal(np.asarray(got), feed.astype(np.int64) @ w.astype(np.int64))
    assert chosen == [xla_options.LIBRARY_DOTS, xla_options.OWN_DOTS]


def test_transmuter_jit_chooses_per_program_of_ones_own(monkeypatch):
    """The pipelines' own programs (the diffusion loop, decoding steps) and a user's jitted
    function around `transmuter.run` choose as `transmuter.compile`'s do, per argument types."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    args = [jnp.ones(s) for s in _FFN_SHAPES]
    assert _ynn_fusion_ops(transmuter.jit(_feed_forward).lower(*args).compile().as_text()) == []

    @transmuter.jit(static_argnames=("scale",))
    def product(x, w, scale):
        if x.dtype == jnp.int8:
            return _int8_dot(x, w) * scale
        return (x @ w) * scale

    q, p = _INT8
    np.testing.assert_array_equal(product(q, p, scale=2), np.full((128, 1536), 768))
    fused = _ynn_fusion_ops(product.lower(q, p, scale=2).compile().as_text())
    assert fused and all(ops <= {"parameter", "dot", "bitcast"} for ops in fused)
    floats = (q.astype(jnp.float32), p.astype(jnp.float32))
    np.testing.assert_array_equal(product(*floats, scale=3), np.full((128, 1536), 1152.0))
    assert _ynn_fusion_ops(product.lower(*floats, scale=3).compile().as_text()) == []

    @transmuter.jit(
        compiler_options={
            "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
        }
    )
    def users(x, w):
        return x @ w

    assert _ynn_fusion_ops(users.lower(*floats).compile().as_text())
