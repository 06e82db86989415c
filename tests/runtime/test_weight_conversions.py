"""Conversions of stored weights (a half-precision weight's Cast, a QDQ weight's
DequantizeLinear) run next to the node reading them, waiting on its data (`Step.gate`), not at
the program's start where XLA:CPU's scheduler would put all of them at once."""

from __future__ import annotations

import jax
import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper

import transmuter

RNG = np.random.default_rng(0)
LAYERS = 3
WIDTH = 16


def _layers(weights: list[np.ndarray], convert) -> onnx.ModelProto:
    """x -> (MatMul by convert(w_i) -> Tanh) x LAYERS -> y, each weight's conversion listed
    first, as compute_type's storage Casts and exporters' weight DequantizeLinears are."""
    conversions, nodes, initializers = [], [], []
    value = "x"
    for i, w in enumerate(weights):
        made, inits = convert(i, w)
        conversions += made
        initializers += inits
        nodes += [
            helper.make_node("MatMul", [value, f"w{i}"], [f"m{i}"]),
            helper.make_node("Tanh", [f"m{i}"], [f"h{i}"]),
        ]
        value = f"h{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        conversions + nodes,
        "layers",
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["batch", WIDTH])],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _cast_from_half(i, w):
    stored = onnx.numpy_helper.from_array(w.astype(np.float16), f"w{i}_half")
    return [helper.make_node("Cast", [f"w{i}_half"], [f"w{i}"], to=T.FLOAT)], [stored]


def _cast_then_transposed(i, w):
    # The graph's own op on a converted weight moves with the conversion.
    stored = onnx.numpy_helper.from_array(w.T.astype(np.float16), f"w{i}_half_t")
    nodes = [
        helper.make_node("Cast", [f"w{i}_half_t"], [f"w{i}_t"], to=T.FLOAT),
        helper.make_node("Transpose", [f"w{i}_t"], [f"w{i}"], perm=[1, 0]),
    ]
    return nodes, [stored]


def _dequantized_int8(i, w):
    scale = np.abs(w).max(axis=0) / 127
    q = np.round(w / scale).astype(np.int8)
    inits = [
        onnx.numpy_helper.from_array(q, f"w{i}_q"),
        onnx.numpy_helper.from_array(scale.astype(np.float32), f"w{i}_scale"),
    ]
    node = helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_scale"], [f"w{i}"], axis=1)
    return [node], inits


def _weights():
    return [RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 4 for _ in range(LAYERS)]


def test_each_conversion_is_planned_before_its_matmul_waiting_on_its_activation():
    for convert in (_cast_from_half, _cast_then_transposed, _dequantized_int8):
        model = transmuter.load(_layers(_weights(), convert).SerializeToString(), optimize=False)
        steps = model.plan.steps
        for i in range(LAYERS):
            (at,) = [k for k, s in enumerate(steps) if s.node.outputs == (f"w{i}",)]
            reader = steps[at + 1]
            assert reader.node.op_type == "MatMul" and f"w{i}" in reader.node.inputs
            assert steps[at].gate == ("x" if i == 0 else f"h{i - 1}",)
        assert all(s.gate == () for s in steps if s.node.op_type in ("MatMul", "Tanh"))


def test_a_non_finite_first_activation_does_not_reach_the_weights():
    # The gate compares the activation's first element with itself; NaN and Inf there must
    # leave the other rows as the unconverted graph computes them.
    weights = _weights()
    for first in (np.nan, np.inf):
        x = RNG.standard_normal((4, WIDTH)).astype(np.float32)
        x[0, 0] = first
        for convert in (_cast_from_half, _cast_then_transposed, _dequantized_int8):
            model = transmuter.load(_layers(weights, convert).SerializeToString())
            eager = np.asarray(transmuter.run(model, {"x": x})["y"])
            compiled = np.asarray(transmuter.compile(model, {"x": x})({"x": x})["y"])
            assert np.isfinite(eager[1:]).all()  # op by op: no gate
            np.testing.assert_allclose(compiled, eager, rtol=1e-6, atol=1e-6)


def test_the_compiled_program_converts_each_weight_after_the_matmul_before_it():
    # XLA's scheduled program lists its instructions in the order they run.
    model = transmuter.load(_layers(_weights(), _cast_from_half).SerializeToString())
    x = RNG.standard_normal((4, WIDTH)).astype(np.float32)
    program = jax.jit(lambda params, x: transmuter.run(model, {"x": x}, params=params))
    text = program.lower(model.params, x).compile().as_text()
    lines = text[text.index("\nENTRY") :].splitlines()
    dots = [k for k, line in enumerate(lines) if 'op_name="jit(<lambda>)/dot_general' in line]
    for i in range(1, LAYERS):
        (converts,) = [
            k
            for k, line in enumerate(lines)
            if f"%params__w{i}_half" in line and " fusion(" in line
        ]
        # At or before its own dot (a CPU without YNNPACK's dots may fuse the two).
        assert dots[i - 1] < converts <= dots[i], "\n".join(lines)


def test_under_vmap_the_weights_stay_unbatched_and_gradients_reach_them():
    model = transmuter.load(_layers(_weights(), _cast_from_half).SerializeToString())
    xs = RNG.standard_normal((5, 4, WIDTH)).astype(np.float32)

    def forward(params, x):
        return transmuter.run(model, {"x": x}, params=params)["y"]

    batched = jax.vmap(forward, in_axes=(None, 0))
    jaxpr = str(jax.make_jaxpr(batched)(model.params, xs))
    assert f"[5,{WIDTH},{WIDTH}]" not in jaxpr  # a weight copied per batch element
    np.testing.assert_allclose(
        batched(model.params, xs), [forward(model.params, x) for x in xs], rtol=1e-6, atol=1e-6
    )
    grads = jax.grad(lambda p: forward(p, xs[0]).sum())(model.params)
    assert all(np.abs(np.asarray(g)).sum() > 0 for g in grads.values())


def test_a_conversion_read_inside_a_branch_runs_before_the_if():
    # An If's branches read the converted weight from outside: the If is its reader.
    w = _weights()[0]
    stored = onnx.numpy_helper.from_array(w.astype(np.float16), "w_half")
    out = helper.make_tensor_value_info("y", T.FLOAT, ["batch", WIDTH])

    def branch(name, op):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node(op, ["m"], ["y"])]
        return helper.make_graph(nodes, name, [], [out])

    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["w_half"], ["w"], to=T.FLOAT),
            helper.make_node(
                "If",
                ["flag"],
                ["y"],
                then_branch=branch("then", "Tanh"),
                else_branch=branch("else", "Neg"),
            ),
        ],
        "branches",
        [
            helper.make_tensor_value_info("x", T.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("flag", T.BOOL, []),
        ],
        [out],
        initializer=[stored],
    )
    model = transmuter.load(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    )
    x = RNG.standard_normal((4, WIDTH)).astype(np.float32)
    expected = np.tanh(x @ w.astype(np.float16).astype(np.float32))
    flag = {"flag": np.array(True)}
    compiled = transmuter.compile(model, {"x": x}, static_inputs=flag)
    np.testing.assert_allclose(compiled({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)
    eager = transmuter.run(model, {"x": x, **flag})["y"]
    np.testing.assert_allclose(eager, expected, rtol=1e-5, atol=1e-6)
