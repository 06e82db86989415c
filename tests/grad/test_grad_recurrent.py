"""Gradients through recurrences and control flow (LSTM, GRU, RNN; If as lax.cond or a host
choice, Loop as lax.scan, Scan), training-mode Dropout with a key, and `jax.vmap` of a
gradient, against float64 finite differences (tolerance: see grad_harness.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from grad_harness import (
    KEY,
    check_gradients,
    check_gradients_jit_and_eager,
    graph_model,
    node_model,
)
from onnx import TensorProto, helper

import transmuter

DOUBLE = TensorProto.DOUBLE


def data(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape) * scale


def value_info(name: str, shape: list, elem: int = DOUBLE):
    return helper.make_tensor_value_info(name, elem, shape)


# ---- recurrent layers ---------------------------------------------------------------------

SEQ, BATCH, IN, HIDDEN = 3, 2, 2, 3


def recurrent_case(op_type: str, gates: int, attrs: dict, extra_weights: dict):
    """X [seq, batch, in] and initial_h (and initial_c) as inputs; W, R, B (and P) as params.
    Scaled weights keep the gates out of saturation, where the gradient is near zero."""
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    x = data(SEQ, BATCH, IN)
    weights = {
        "W": data(directions, gates * HIDDEN, IN, seed=1, scale=0.5),
        "R": data(directions, gates * HIDDEN, HIDDEN, seed=2, scale=0.5),
        "B": data(directions, 2 * gates * HIDDEN, seed=3, scale=0.5),
    }
    inputs = {"X": x, "initial_h": data(directions, BATCH, HIDDEN, seed=4)}
    node_inputs = ["X", "W", "R", "B", "", "initial_h"]
    outputs = ["Y", "Y_h"]
    if op_type == "LSTM":
        inputs["initial_c"] = data(directions, BATCH, HIDDEN, seed=5)
        node_inputs.append("initial_c")
        outputs.append("Y_c")
    for name, value in extra_weights.items():
        weights[name] = value(directions)
        node_inputs.append(name)
    proto = node_model(
        op_type,
        node_inputs,
        {"hidden_size": HIDDEN, **attrs},
        outputs=outputs,
        inputs=inputs,
        weights=weights,
    )
    return proto, inputs


RECURRENT = {
    "lstm_peepholes_bidirectional": (
        "LSTM",
        4,
        {"direction": "bidirectional"},
        {"P": lambda d: data(d, 3 * HIDDEN, seed=6, scale=0.5)},
    ),
    "lstm_reverse_clip": ("LSTM", 4, {"direction": "reverse", "clip": 50.0}, {}),
    "gru_linear_before_reset": ("GRU", 3, {"linear_before_reset": 1}, {}),
    "gru_reset_before_bidirectional": ("GRU", 3, {"direction": "bidirectional"}, {}),
    "rnn_tanh": ("RNN", 1, {}, {}),
    "rnn_sigmoid": ("RNN", 1, {"activations": ["Sigmoid"]}, {}),
}


# Eagerly as well only where a lowering can differ (the LSTM/GRU/RNN lowerings are a lax.scan,
# which JAX traces even in an eager jax.grad, so an eager check repeats the jitted one).
@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_recurrent_layers(name):
    check_gradients_jit_and_eager(*recurrent_case(*RECURRENT[name]))


# ---- control flow -------------------------------------------------------------------------


def if_model(cond_from: str):
    """Y = If(cond, X * W, Sin(X) + W), the branches reading X and the param W from the outer
    scope. cond is a bool graph input, or ReduceSum(X) > 0 computed in the graph."""
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["X", "W"], ["then_y"])], "then", [], [value_info("then_y", [3])]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Sin", ["X"], ["s"]), helper.make_node("Add", ["s", "W"], ["else_y"])],
        "else",
        [],
        [value_info("else_y", [3])],
    )
    nodes = [
        helper.make_node("If", ["cond"], ["Y"], then_branch=then_branch, else_branch=else_branch)
    ]
    constants = {}
    if cond_from == "graph":
        nodes[:0] = [
            helper.make_node("ReduceSum", ["X"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "zero"], ["cond"]),
        ]
        constants["zero"] = np.array(0.0)
    return nodes, constants


@pytest.mark.parametrize("eager", [False, True], ids=["jit", "eager"])
@pytest.mark.parametrize("cond", [True, False])
def test_if_with_a_condition_input(cond, eager):
    # Under jax.jit the condition is traced (lax.cond); eagerly it is a concrete value and the
    # branch is picked on the host. Both must differentiate the branch taken.
    nodes, constants = if_model("input")
    x = data(3)
    inputs = {"X": x, "cond": np.array(cond)}
    proto = graph_model(nodes, inputs=inputs, weights={"W": data(3, seed=1)}, constants=constants)
    check_gradients(proto, inputs, eager=eager)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_with_a_condition_computed_from_the_data(sign):
    # The condition depends on X, so under jax.grad it is traced even eagerly: lax.cond. X's
    # sum is at least 0.5 from 0, so no finite-difference step flips the branch.
    nodes, constants = if_model("graph")
    x = sign * (np.abs(data(3)) + 0.2)
    proto = graph_model(nodes, inputs={"X": x}, weights={"W": data(3, seed=1)}, constants=constants)
    check_gradients(proto, {"X": x}, eager=True)


def loop_model():
    """h_{i+1} = Tanh(h_i @ W + X) for a host-known trip count of 3 (lax.scan); outputs the
    final h and every h_i (a scan output)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
            helper.make_node("Add", ["hw", "X"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_out"]),
            helper.make_node("Identity", ["h_out"], ["h_scan"]),
        ],
        "body",
        [
            value_info("i", [], TensorProto.INT64),
            value_info("cond_in", [], TensorProto.BOOL),
            value_info("h_in", [2, 3]),
        ],
        [
            value_info("cond_out", [], TensorProto.BOOL),
            value_info("h_out", [2, 3]),
            value_info("h_scan", [2, 3]),
        ],
    )
    loop = helper.make_node("Loop", ["trips", "keep", "H0"], ["H", "Hs"], body=body)
    return loop


def test_loop_with_a_host_trip_count():
    h0, x = data(2, 3), data(2, 3, seed=1)
    proto = graph_model(
        [loop_model()],
        inputs={"H0": h0, "X": x},
        weights={"W": data(3, 3, seed=2, scale=0.5)},
        constants={"trips": np.array(3), "keep": np.array(True)},
        outputs=["H", "Hs"],
    )
    check_gradients(proto, {"H0": h0, "X": x})


@pytest.mark.parametrize("reverse", [0, 1])
def test_scan_with_state_and_scan_output(reverse):
    # s_{t+1} = s_t * w + x_t; y_t = Sin(s_{t+1}); over 4 steps, forwards or backwards.
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["s_in", "w"], ["sw"]),
            helper.make_node("Add", ["sw", "x_t"], ["s_out"]),
            helper.make_node("Sin", ["s_out"], ["y_t"]),
        ],
        "body",
        [value_info("s_in", [2]), value_info("x_t", [2])],
        [value_info("s_out", [2]), value_info("y_t", [2])],
    )
    scan = helper.make_node(
        "Scan",
        ["S0", "Xs"],
        ["S", "Ys"],
        body=body,
        num_scan_inputs=1,
        scan_input_directions=[reverse],
    )
    s0, xs = data(2), data(4, 2, seed=1)
    proto = graph_model(
        [scan],
        inputs={"S0": s0, "Xs": xs},
        weights={"w": data(2, seed=2, scale=0.5)},
        outputs=["S", "Ys"],
    )
    check_gradients(proto, {"S0": s0, "Xs": xs})


# ---- training-mode Dropout ---------------------------------------------------------------


@pytest.mark.parametrize("eager", [False, True], ids=["jit", "eager"])
def test_dropout_training_mode_with_a_key(eager):
    # One key for every evaluation, so the mask is fixed and Y = X * mask / (1 - ratio) is
    # linear in X and W: its gradient is mask / (1 - ratio), which finite differences see.
    x = data(4, 6)
    proto = graph_model(
        [
            helper.make_node("Mul", ["X", "W"], ["xw"]),
            helper.make_node("Dropout", ["xw", "ratio", "training"], ["Y", "mask"]),
        ],
        inputs={"X": x},
        weights={"W": data(6, seed=1)},
        constants={"ratio": np.array(0.4), "training": np.array(True)},
        outputs=["Y", "mask"],
        opset=13,
    )
    grads, _ = check_gradients(proto, {"X": x}, key=KEY, eager=eager)
    dropped = np.asarray(grads["X"]) == 0
    assert 0 < dropped.mean() < 1, "the key dropped nothing or everything"


# ---- vmap ---------------------------------------------------------------------------------


def test_vmap_of_grad_matches_per_example_gradients():
    # A layer norm and a GELU on a matmul: per-example gradients w.r.t. the params, batched by
    # jax.vmap over the examples, against one jax.grad call per example; the first example's
    # gradient against finite differences.
    x = data(3, 1, 4)
    proto = graph_model(
        [
            helper.make_node("MatMul", ["X", "W"], ["xw"]),
            helper.make_node("LayerNormalization", ["xw", "gamma"], ["n"], stash_type=DOUBLE),
            helper.make_node("Gelu", ["n"], ["Y"]),
        ],
        inputs={"X": x[0]},
        weights={"W": data(4, 3, seed=1), "gamma": data(3, seed=2)},
    )
    model = transmuter.load(proto, trainable=True)
    readout = data(1, 3, seed=3)

    def loss(params, example):
        return jnp.sum(transmuter.run(model, {"X": example}, params=params)["Y"] * readout)

    with jax.enable_x64(True):
        batched = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0)))(model.params, x)
        single = jax.jit(jax.grad(loss))
        for i, example in enumerate(x):
            expected = single(model.params, example)
            for name in model.params:
                np.testing.assert_allclose(batched[name][i], expected[name], rtol=1e-12, atol=1e-12)
    check_gradients(proto, {"X": x[0]})
