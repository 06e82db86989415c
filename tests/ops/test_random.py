"""Random operators: shapes, dtypes, distributions (over 100k draws), and how keys are used.

The values are JAX's, not ONNX Runtime's (the spec leaves the generator open), so nothing is
compared element by element with a reference: the checks are statistical, with tolerances of
about five standard errors. A node with a seed draws the same values on every call, key or not;
a node without one draws from the key passed to `transmuter.run` (or to a compiled model's call).
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper
from opcheck import make_node_model

import transmuter
from transmuter.errors import TransmuterError, UnsupportedOpError

N = 100_000
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_CODES = {1: np.float32, 10: np.float16, 11: np.float64, 16: BF16}
KEY = jax.random.key(0)


def _run(model, inputs=None, key=KEY):
    return transmuter.run(transmuter.load(model), inputs or {}, key=key)["out0"]


def _np(value):
    return np.asarray(value)


def _moments(x):
    x = _np(x).astype(np.float64)
    return x.mean(), x.var()


# ------------------------------------------------------------------ RandomNormal / RandomUniform


# bfloat16 (16) arrives in version 22.
VERSIONED_CODES = [(1, c) for c in (None, 1, 10, 11)] + [(22, c) for c in (None, 1, 10, 11, 16)]


@pytest.mark.parametrize("opset, code", VERSIONED_CODES)
def test_random_normal_distribution(opset, code):
    attrs = {"shape": [250, 400], "mean": 2.0, "scale": 3.0}
    if code is not None:
        attrs["dtype"] = code
    out = _run(make_node_model("RandomNormal", {}, attrs, opset=opset))
    assert out.shape == (250, 400)
    assert out.dtype == FLOAT_CODES[code or 1]
    mean, var = _moments(out)
    # half types round each draw: allow for that on top of the sampling error.
    assert abs(mean - 2.0) < 0.05
    assert abs(var - 9.0) < 0.25


@pytest.mark.parametrize("opset, code", VERSIONED_CODES)
def test_random_uniform_distribution(opset, code):
    attrs = {"shape": [N], "low": -2.0, "high": 5.0}
    if code is not None:
        attrs["dtype"] = code
    out = _np(_run(make_node_model("RandomUniform", {}, attrs, opset=opset)))
    assert out.shape == (N,)
    assert out.dtype == FLOAT_CODES[code or 1]
    x = out.astype(np.float64)
    assert x.min() >= -2.0 and x.max() <= 5.0
    mean, var = _moments(x)
    assert abs(mean - 1.5) < 0.05
    assert abs(var - 49 / 12) < 0.1
    # Every tenth of the interval gets its share.
    counts = np.histogram(x, bins=10, range=(-2.0, 5.0))[0]
    np.testing.assert_allclose(counts / N, 0.1, atol=0.01)


def test_default_attributes():
    normal = _np(_run(make_node_model("RandomNormal", {}, {"shape": [N]}, opset=22)))
    uniform = _np(_run(make_node_model("RandomUniform", {}, {"shape": [N]}, opset=22)))
    assert normal.dtype == uniform.dtype == np.float32
    mean, var = _moments(normal)
    assert abs(mean) < 0.02 and abs(var - 1.0) < 0.03
    assert uniform.min() >= 0.0 and uniform.max() < 1.0
    assert abs(uniform.mean() - 0.5) < 0.01


@pytest.mark.parametrize("op_type", ["RandomNormal", "RandomUniform"])
def test_zero_size_and_scalar_shapes(op_type):
    assert _run(make_node_model(op_type, {}, {"shape": [3, 0]}, opset=22)).shape == (3, 0)
    assert _run(make_node_model(op_type, {}, {"shape": [2, 1, 3]}, opset=22)).shape == (2, 1, 3)


@pytest.mark.parametrize("op_type", ["RandomNormal", "RandomUniform"])
def test_integer_dtype_is_rejected(op_type):
    with pytest.raises(UnsupportedOpError, match="int32"):
        _run(make_node_model(op_type, {}, {"shape": [2], "dtype": 6}, opset=22))


# --------------------------------------------------------------------------------- -Like forms


@pytest.mark.parametrize("op_type", ["RandomNormalLike", "RandomUniformLike"])
@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_like_takes_shape_and_type_of_input(op_type, opset, dtype):
    x = np.zeros((4, 0, 3), dtype) if dtype == np.float64 else np.zeros((3, 5), dtype)
    out = _run(make_node_model(op_type, {"X": x}, {}, opset=opset), {"X": x})
    assert out.shape == x.shape and out.dtype == dtype


@pytest.mark.parametrize("op_type", ["RandomNormalLike", "RandomUniformLike"])
@pytest.mark.parametrize("code", [1, 11, 16])
def test_like_dtype_attribute_overrides_input_type(op_type, code):
    x = np.zeros((2, 3), np.int64)
    out = _run(make_node_model(op_type, {"X": x}, {"dtype": code}, opset=22), {"X": x})
    assert out.shape == (2, 3) and out.dtype == FLOAT_CODES[code]


@pytest.mark.parametrize("op_type", ["RandomNormalLike", "RandomUniformLike"])
def test_like_needs_dtype_for_integer_input(op_type):
    x = np.zeros((2, 3), np.int32)
    with pytest.raises(UnsupportedOpError, match="input's type"):
        _run(make_node_model(op_type, {"X": x}, {}, opset=22), {"X": x})


def test_like_distributions():
    x = np.zeros((N,), np.float64)
    normal = _run(
        make_node_model("RandomNormalLike", {"X": x}, {"mean": -1.0, "scale": 0.5}, opset=22),
        {"X": x},
    )
    mean, var = _moments(normal)
    assert abs(mean + 1.0) < 0.01 and abs(var - 0.25) < 0.01
    uniform = _np(
        _run(
            make_node_model("RandomUniformLike", {"X": x}, {"low": 10.0, "high": 11.0}, opset=22),
            {"X": x},
        )
    )
    assert uniform.min() >= 10.0 and uniform.max() < 11.0
    assert abs(uniform.mean() - 10.5) < 0.01


# ----------------------------------------------------------------------------------- Bernoulli


@pytest.mark.parametrize("opset", [15, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_bernoulli_frequencies(opset, dtype):
    p = np.array([0.0, 0.1, 0.5, 0.9, 1.0], dtype)
    x = np.broadcast_to(p, (N // 5, 5)).copy()
    out = _np(_run(make_node_model("Bernoulli", {"X": x}, {}, opset=opset), {"X": x}))
    assert out.shape == x.shape and out.dtype == dtype
    assert set(np.unique(out.astype(np.float64))) <= {0.0, 1.0}
    freq = out.astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(freq, p.astype(np.float64), atol=0.01)
    assert freq[0] == 0.0 and freq[-1] == 1.0


@pytest.mark.parametrize(
    "code, dtype",
    [(9, np.bool_), (6, np.int32), (7, np.int64), (2, np.uint8), (11, np.float64), (16, BF16)],
)
def test_bernoulli_dtype_attribute(code, dtype):
    x = np.full((N,), 0.3, np.float32)
    out = _np(_run(make_node_model("Bernoulli", {"X": x}, {"dtype": code}, opset=22), {"X": x}))
    assert out.dtype == dtype and out.shape == (N,)
    assert abs(out.astype(np.float64).mean() - 0.3) < 0.01


def test_bernoulli_bfloat16_input_and_zero_size():
    x = np.full((1000,), 0.5, BF16)
    out = _np(_run(make_node_model("Bernoulli", {"X": x}, {}, opset=22), {"X": x}))
    assert out.dtype == BF16
    empty = np.zeros((0, 4), np.float32)
    assert _run(make_node_model("Bernoulli", {"X": empty}, {}, opset=22), {"X": empty}).shape == (
        0,
        4,
    )


# --------------------------------------------------------------------------------- Multinomial


@pytest.mark.parametrize("opset", [7, 22])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("code, out_dtype", [(None, np.int32), (6, np.int32), (7, np.int64)])
def test_multinomial_frequencies(opset, dtype, code, out_dtype):
    probs = np.array([[0.1, 0.2, 0.7, 0.0], [0.25, 0.25, 0.25, 0.25]])
    # Unnormalized log-probabilities: shifting a row changes nothing.
    with np.errstate(divide="ignore"):
        logits = (np.log(probs) + np.array([[3.0], [-2.0]])).astype(dtype)
    attrs = {"sample_size": N // 2}
    if code is not None:
        attrs["dtype"] = code
    out = _np(
        _run(make_node_model("Multinomial", {"X": logits}, attrs, opset=opset), {"X": logits})
    )
    assert out.shape == (2, N // 2) and out.dtype == out_dtype
    assert out.min() >= 0 and out.max() <= 3
    for row, p in zip(out, probs):
        freq = np.bincount(row, minlength=4) / row.size
        np.testing.assert_allclose(freq, p, atol=0.015)
    assert not (out[0] == 3).any()  # probability zero is never drawn


def test_multinomial_defaults_and_edges():
    logits = np.zeros((3, 5), np.float32)
    out = _run(make_node_model("Multinomial", {"X": logits}, {}, opset=22), {"X": logits})
    assert out.shape == (3, 1) and out.dtype == np.int32
    empty = np.zeros((0, 5), np.float32)
    assert _run(make_node_model("Multinomial", {"X": empty}, {}, opset=22), {"X": empty}).shape == (
        0,
        1,
    )
    with pytest.raises(TransmuterError, match=r"\[batch_size, class_size\]"):
        x = np.zeros((5,), np.float32)
        _run(make_node_model("Multinomial", {"X": x}, {}, opset=22), {"X": x})
    with pytest.raises(UnsupportedOpError, match="float32"):
        _run(make_node_model("Multinomial", {"X": logits}, {"dtype": 1}, opset=22), {"X": logits})


# ----------------------------------------------------------------------------- keys and seeds

ALL_OPS = [
    ("RandomNormal", {"shape": [64]}, None),
    ("RandomUniform", {"shape": [64]}, None),
    ("RandomNormalLike", {}, np.zeros((64,), np.float32)),
    ("RandomUniformLike", {}, np.zeros((64,), np.float32)),
    ("Bernoulli", {}, np.full((64,), 0.5, np.float32)),
    ("Multinomial", {"sample_size": 64}, np.zeros((1, 16), np.float32)),
]


def _single(op_type, attrs, x, **extra):
    inputs = {} if x is None else {"X": x}
    return make_node_model(op_type, inputs, {**attrs, **extra}, opset=22), inputs


@pytest.mark.parametrize("op_type, attrs, x", ALL_OPS, ids=[o[0] for o in ALL_OPS])
def test_seed_gives_same_values_on_every_call(op_type, attrs, x):
    model, inputs = _single(op_type, attrs, x, seed=7.0)
    loaded = transmuter.load(model)
    first = _np(transmuter.run(loaded, inputs, key=jax.random.key(1))["out0"])
    again = _np(transmuter.run(loaded, inputs, key=jax.random.key(2))["out0"])
    keyless = _np(transmuter.run(loaded, inputs)["out0"])  # a seeded node needs no key
    jitted = jax.jit(lambda k: transmuter.run(loaded, inputs, key=k)["out0"])
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, keyless)
    np.testing.assert_array_equal(first, _np(jitted(jax.random.key(3))))
    other_seed = _np(_run(_single(op_type, attrs, x, seed=8.0)[0], inputs))
    assert not np.array_equal(first, other_seed)


@pytest.mark.parametrize("op_type, attrs, x", ALL_OPS, ids=[o[0] for o in ALL_OPS])
def test_unseeded_draws_follow_the_key(op_type, attrs, x):
    model, inputs = _single(op_type, attrs, x)
    loaded = transmuter.load(model)
    a = _np(transmuter.run(loaded, inputs, key=jax.random.key(1))["out0"])
    a_again = _np(transmuter.run(loaded, inputs, key=jax.random.key(1))["out0"])
    b = _np(transmuter.run(loaded, inputs, key=jax.random.key(2))["out0"])
    np.testing.assert_array_equal(a, a_again)
    assert not np.array_equal(a, b)
    jitted = jax.jit(lambda k: transmuter.run(loaded, inputs, key=k)["out0"])
    np.testing.assert_allclose(_np(jitted(jax.random.key(1))).astype(np.float64), a, rtol=1e-6)
    assert not np.array_equal(_np(jitted(jax.random.key(2))), a)


@pytest.mark.parametrize("op_type, attrs, x", ALL_OPS, ids=[o[0] for o in ALL_OPS])
def test_unseeded_without_key_raises(op_type, attrs, x):
    model, inputs = _single(op_type, attrs, x)
    with pytest.raises(TransmuterError, match="no seed attribute.*key=jax.random.key"):
        transmuter.run(transmuter.load(model), inputs)


def test_raw_uint32_key_works():
    out = _run(
        make_node_model("RandomNormal", {}, {"shape": [8]}, opset=22), key=jax.random.PRNGKey(0)
    )
    assert out.shape == (8,)


def test_two_nodes_draw_independently():
    nodes = [
        helper.make_node("RandomNormal", [], ["a"], shape=[1000]),
        helper.make_node("RandomNormal", [], ["b"], shape=[1000]),
        helper.make_node("RandomNormal", [], ["c"], shape=[1000], seed=3.0),
        helper.make_node("RandomNormal", [], ["d"], shape=[1000], seed=3.0),
    ]
    outputs = [helper.make_value_info(n, onnx.TypeProto()) for n in "abcd"]
    graph = helper.make_graph(nodes, "random", [], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    out = transmuter.run(transmuter.load(model), {}, key=KEY)
    assert not np.array_equal(_np(out["a"]), _np(out["b"]))
    # Same seed, same values: the key comes from the seed alone.
    np.testing.assert_array_equal(_np(out["c"]), _np(out["d"]))
    # Float seeds truncate toward zero.
    truncated = make_node_model("RandomNormal", {}, {"shape": [1000], "seed": 3.9}, opset=22)
    np.testing.assert_array_equal(_np(_run(truncated)), _np(out["c"]))


@pytest.mark.parametrize("op_type, attrs, x", ALL_OPS, ids=[o[0] for o in ALL_OPS])
def test_compiled(op_type, attrs, x):
    model, inputs = _single(op_type, attrs, x)
    compiled = transmuter.compile(transmuter.load(model), inputs)
    a = _np(compiled(inputs, key=jax.random.key(1))["out0"])
    np.testing.assert_array_equal(a, _np(compiled(inputs, key=jax.random.key(1))["out0"]))
    assert not np.array_equal(a, _np(compiled(inputs, key=jax.random.key(2))["out0"]))
    # Without a key, each call draws from the callable's own stream.
    assert not np.array_equal(_np(compiled(inputs)["out0"]), _np(compiled(inputs)["out0"]))
    seeded, inputs = _single(op_type, attrs, x, seed=5.0)
    compiled = transmuter.compile(transmuter.load(seeded), inputs)
    np.testing.assert_array_equal(
        _np(compiled(inputs)["out0"]), _np(compiled(inputs, key=jax.random.key(9))["out0"])
    )
    np.testing.assert_array_equal(_np(compiled(inputs)["out0"]), _np(_run(seeded, inputs)))
