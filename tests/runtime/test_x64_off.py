"""Operators under a caller's `jax.jit` and `jax.grad` in a process with x64 off (JAX's default).

`transmuter.run` traces inside `jax.enable_x64(True)`, but the caller's program is lowered (and,
under `jax.grad`, transposed) after that scope has closed, where some JAX rules read the x64
flag again and break on 64-bit values: argmax's canonical index type and its initial value for
64-bit data, the index clamps of gathers and scatters. One case per operator that met one: its
outputs under the caller's jit, and the gradient of its float outputs under the caller's
`jax.jit(jax.grad(...))`, against `transmuter.run` with x64 on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from opcheck import make_node_model

import transmuter

RNG = np.random.default_rng(0)
F32 = RNG.standard_normal((4, 5)).astype(np.float32)
ML = {"domain": "ai.onnx.ml", "opset": 1, "outputs": 2}

# name: (op_type, inputs, attributes, make_node_model options). 64-bit inputs hold values that
# 32 bits hold too: a caller with x64 off passes 32-bit arrays (the runtime widens them back).
CASES = {
    "ArgMax": ("ArgMax", {"X": F32}, {"axis": 1, "select_last_index": 1}, {"opset": 13}),
    "ArgMin-int64": (
        "ArgMin",
        {"X": np.array([[3, -1, 7], [-1, 5, -1]], np.int64)},
        {"axis": 1, "keepdims": 0},
        {"opset": 13},
    ),
    "Hardmax-float64": ("Hardmax", {"X": F32.astype(np.float64)}, {"axis": 0}, {"opset": 13}),
    "Gather": (
        "Gather",
        {"data": F32, "indices": np.array([[0, -1], [3, 1]], np.int64)},
        {"axis": 0},
        {},
    ),
    "GatherElements": (
        "GatherElements",
        {"data": F32, "indices": np.array([[0, -1, 2, 1, 0]] * 3, np.int64)},
        {"axis": 0},
        {},
    ),
    "GatherND": (
        "GatherND",
        {"data": F32, "indices": np.array([[0, 4], [-1, 2]], np.int64)},
        {},
        {},
    ),
    "ScatterElements": (
        "ScatterElements",
        {
            "data": F32,
            "indices": np.array([[1, -1, 0, 2, 3]], np.int64),
            "updates": F32[:1] * 2,
        },
        {"axis": 0, "reduction": "add"},
        {},
    ),
    "ScatterND": (
        "ScatterND",
        {"data": F32, "indices": np.array([[2], [0]], np.int64), "updates": F32[:2] * 3},
        {},
        {},
    ),
    "LinearClassifier": (
        "LinearClassifier",
        {"X": F32[:, :2]},
        {
            "coefficients": [0.3, -0.2, 0.1, 0.4, -1.0, 0.0],
            "intercepts": [0.1, 0.0, 0.0],
            "classlabels_ints": [1, 2, 3],
        },
        ML,
    ),
    "SVMClassifier": (
        "SVMClassifier",
        {"X": F32[:, :3]},
        {
            "coefficients": list(RNG.standard_normal(9)),
            "rho": [0.25],
            "kernel_params": [0.0, 0.0, 0.0],
            "classlabels_ints": [1, 2, 3],
        },
        ML,
    ),
    "TreeEnsembleClassifier": (
        "TreeEnsembleClassifier",
        {"X": F32[:, :2]},
        {
            "nodes_treeids": [0, 0, 0],
            "nodes_nodeids": [0, 1, 2],
            "nodes_featureids": [0, 0, 0],
            "nodes_modes": ["BRANCH_LEQ", "LEAF", "LEAF"],
            "nodes_values": [0.0, 0.0, 0.0],
            "nodes_truenodeids": [1, 0, 0],
            "nodes_falsenodeids": [2, 0, 0],
            "class_treeids": [0] * 6,
            "class_nodeids": [1, 1, 1, 2, 2, 2],
            "class_ids": [0, 1, 2, 0, 1, 2],
            "class_weights": [0.1, 0.7, 0.2, 0.5, 0.2, 0.3],
            "classlabels_int64s": [4, 7, 9],
        },
        ML,
    ),
    "Multinomial": ("Multinomial", {"X": F32}, {"sample_size": 3, "dtype": 7}, {"opset": 22}),
}
# Cases whose gradient goes through a rule that broke: the transposes of gathers and scatters.
GRADIENTS = ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND")


def _model(name):
    op_type, inputs, attrs, options = CASES[name]
    return transmuter.load(make_node_model(op_type, inputs, attrs, **options)), inputs


@pytest.mark.parametrize("name", CASES)
def test_outputs_under_a_callers_jit(name):
    model, inputs = _model(name)
    key = jax.random.key(0)
    want = transmuter.run(model, inputs, key=key)
    with jax.enable_x64(False):
        got = jax.jit(lambda feeds, k: transmuter.run(model, feeds, key=k))(inputs, key)
    for output in model.outputs:
        actual, expected = np.asarray(got[output]), np.asarray(want[output])
        assert actual.dtype == expected.dtype, f"{output}: {actual.dtype}, {expected.dtype}"
        np.testing.assert_allclose(actual, expected, rtol=1e-6, err_msg=output)


@pytest.mark.parametrize("name", GRADIENTS)
def test_gradients_under_a_callers_jit(name):
    model, inputs = _model(name)
    floats = {k: v for k, v in inputs.items() if v.dtype == np.float32}

    def loss(floats):
        outputs = transmuter.run(model, {**inputs, **floats})
        return sum(jnp.sum(jnp.square(v)) for v in outputs.values())

    with jax.enable_x64(True):
        want = jax.grad(loss)(floats)
    with jax.enable_x64(False):
        got = jax.jit(jax.grad(loss))(floats)
    for k in floats:
        assert got[k].dtype == np.float32
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-6, err_msg=k)


def test_32_bit_jax_values_stand_for_64_bit_inputs_but_numpy_ones_do_not():
    """With x64 off, JAX holds int64 ids as int32 (a caller's jit makes its arguments so): such
    a JAX array is widened back; a numpy int32 array is a wrong type, as with x64 on."""
    model, inputs = _model("Gather")
    (output,) = model.outputs
    want = transmuter.run(model, inputs)[output]
    narrow = {**inputs, "indices": inputs["indices"].astype(np.int32)}
    with jax.enable_x64(False):
        got = transmuter.run(model, {**inputs, "indices": jnp.asarray(inputs["indices"])})[output]
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        with pytest.raises(transmuter.InputError, match="expects tensor\\(int64\\)"):
            transmuter.run(model, narrow)
    with jax.enable_x64(True), pytest.raises(transmuter.InputError, match="int32"):
        transmuter.run(model, {**narrow, "indices": jnp.asarray(narrow["indices"])})
