"""ai.onnx.preview.training optimizers against onnx.reference (ONNX Runtime has no kernels)."""

import functools

import numpy as np
import pytest
from opcheck import (
    assert_close,
    check_node,
    feeds,
    make_node_model,
    reference_run,
    transmuter_runs,
)

import transmuter
from transmuter.errors import TransmuterError

TRAINING = "ai.onnx.preview.training"
check = functools.partial(check_node, domain=TRAINING, opset=1, reference="onnx")

rng = np.random.default_rng(0)


def tensors(count, shapes, dtype=np.float32, positive=False):
    """`count` groups of random tensors, one per shape, named by group letter and index."""
    out = {}
    for group in range(count):
        for i, shape in enumerate(shapes):
            value = rng.standard_normal(shape)
            out[f"{'XGVH'[group]}{i}"] = (
                np.abs(value) if positive and group == count - 1 else value
            ).astype(dtype)
    return out


def inputs(r, t, groups, dtype=np.float32):
    return {"R": np.array(r, dtype), "T": np.array(t, np.int64), **groups}


@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("shapes", [[(3,)], [(2, 3), (4,)], [(0, 2)]])
@pytest.mark.parametrize(
    "attrs", [{}, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01}]
)
def test_adagrad(t, shapes, attrs):
    groups = tensors(3, shapes, positive=True)
    check("Adagrad", inputs(0.1, t, groups), attrs, outputs=2 * len(shapes))


def test_adagrad_float64():
    groups = tensors(3, [(5,)], np.float64, positive=True)
    attrs = {"decay_factor": 0.5, "norm_coefficient": 0.1}
    check("Adagrad", inputs(0.2, 2, groups, np.float64), attrs, outputs=2, rtol=1e-12)


@pytest.mark.parametrize("t", [0, 1, 5])
@pytest.mark.parametrize("shapes", [[(3,)], [(2, 3), (4,)]])
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"alpha": 0.95, "beta": 0.1, "epsilon": 1e-7, "norm_coefficient": 0.001},
        {"alpha": 0.8, "beta": 0.9, "norm_coefficient_post": 0.05},
    ],
)
def test_adam(t, shapes, attrs):
    # onnx.reference returns float64 for one float32 tensor once T > 0 (its bias-corrected rate
    # is a float64 scalar); the spec's outputs have the tensors' type, so compare values in it.
    feed = inputs(0.1, t, tensors(4, shapes, positive=True))
    model = make_node_model("Adam", feed, attrs, opset=1, domain=TRAINING, outputs=3 * len(shapes))
    want = [w.astype(np.float32) for w in reference_run(model, feed)]
    for mode, got in transmuter_runs(model, feed).items():
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, rtol=1e-5, atol=1e-6, what=f"Adam output {i} ({mode})")


def test_adam_float64():
    # onnx.reference casts the results of several tensors to float32: one float64 tensor here.
    groups = tensors(4, [(2, 2)], np.float64, positive=True)
    check("Adam", inputs(0.05, 4, groups, np.float64), {"alpha": 0.5}, outputs=3, rtol=1e-12)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
@pytest.mark.parametrize("shapes", [[(3,)], [(2, 3), (1,)], [(0,)]])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_momentum(mode, t, shapes, dtype):
    attrs = {"alpha": 0.9, "beta": 0.3, "mode": mode, "norm_coefficient": 0.01}
    groups = tensors(3, shapes, dtype)
    check("Momentum", inputs(0.1, t, groups, dtype), attrs, outputs=2 * len(shapes), rtol=1e-6)


def test_learning_rate_of_another_type():
    # R is T1 and the tensors T3: a float64 rate still gives float32 results (onnx.reference
    # would return float64 for Momentum, so the values are written out here).
    groups = tensors(3, [(4,)])
    feed = {"R": np.array(0.5), "T": np.array(1, np.int64), **groups}
    attrs = {"alpha": 0.5, "beta": 0.25, "mode": "standard", "norm_coefficient": 0.0}
    v_new = 0.5 * groups["V0"] + 0.25 * groups["G0"]
    want = [(groups["X0"] - 0.5 * v_new).astype(np.float32), v_new.astype(np.float32)]
    model = make_node_model("Momentum", feed, attrs, opset=1, domain=TRAINING, outputs=2)
    for mode, got in transmuter_runs(model, feed).items():
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, rtol=1e-6, atol=1e-6, what=f"Momentum output {i} ({mode})")


def test_errors():
    groups = tensors(3, [(2,)])
    model = make_node_model(
        "Momentum", inputs(0.1, 1, groups),
        {"alpha": 0.9, "beta": 0.3, "mode": "heavy", "norm_coefficient": 0.0},
        opset=1, domain=TRAINING, outputs=2,
    )  # fmt: skip
    with pytest.raises(TransmuterError, match="mode must be 'standard' or 'nesterov'"):
        transmuter.run(transmuter.load(model), feeds(model, inputs(0.1, 1, groups)))
    del groups["V0"]
    model = make_node_model("Adagrad", inputs(0.1, 1, groups), {}, opset=1, domain=TRAINING,
                            outputs=2)  # fmt: skip
    with pytest.raises(TransmuterError, match="3 groups of equal size"):
        transmuter.run(transmuter.load(model), feeds(model, inputs(0.1, 1, groups)))


def _gradient_model(gradient_first: bool):
    """W --> MatMul(X) --> H --> Mul(Z) --> Y, with Gradient(xs=[W, Z], zs=[X], y=Y) and, as the
    spec's intermediate example, Gradient(xs=[H, Z], y=Y). With gradient_first the Gradient
    nodes are listed before the nodes computing Y (nothing orders them after: they read only
    W, H, Z and X)."""
    from onnx import TensorProto, helper

    gradients = [
        helper.make_node(
            "Gradient",
            ["W", "Z", "X"],
            ["dW", "dZ"],
            domain=TRAINING,
            xs=["W", "Z"],
            zs=["X"],
            y="Y",
        ),
        helper.make_node("Gradient", ["H", "Z"], ["dH", ""], domain=TRAINING, xs=["H", "Z"], y="Y"),
    ]
    forward = [
        helper.make_node("MatMul", ["X", "W"], ["H"]),
        helper.make_node("Mul", ["H", "Z"], ["Y"]),
    ]
    f32 = TensorProto.FLOAT
    shapes = (("X", [2, 3]), ("W", [3, 4]), ("Z", [2, 4]))
    graph = helper.make_graph(
        [*gradients, *forward] if gradient_first else [*forward, *gradients],
        "gradient",
        [helper.make_tensor_value_info(n, f32, s) for n, s in shapes],
        [helper.make_tensor_value_info(n, f32, None) for n in ("Y", "dW", "dZ", "dH")],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)]
    )


@pytest.mark.parametrize("gradient_first", [False, True])
def test_gradient_of_weights_and_of_an_intermediate(gradient_first):
    rng = np.random.default_rng(0)
    x, w, z = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (3, 4), (2, 4)))
    model = transmuter.load(_gradient_model(gradient_first))
    feed = {"X": x, "W": w, "Z": z}
    for out in (transmuter.run(model, feed), transmuter.compile(model, feed)(feed)):
        # Y = (X W) * Z, summed: dY/dW = X^T Z, dY/dZ = X W, dY/dH = Z.
        assert_close(out["dW"], x.T @ z, rtol=1e-5, atol=1e-6, what="dW")
        assert_close(out["dZ"], x @ w, rtol=1e-5, atol=1e-6, what="dZ")
        assert_close(out["dH"], z, rtol=1e-6, atol=0, what="dH")
        assert_close(out["Y"], (x @ w) * z, rtol=1e-5, atol=1e-6, what="Y")


def test_gradient_checks_its_input_count():
    from onnx import helper

    model = _gradient_model(False)
    node = model.graph.node[2]
    node.attribute.remove(next(a for a in node.attribute if a.name == "zs"))
    node.attribute.append(helper.make_attribute("zs", ["X", "Z"]))
    rng = np.random.default_rng(0)
    feed = {
        n: rng.standard_normal(s).astype(np.float32)
        for n, s in (("X", (2, 3)), ("W", (3, 4)), ("Z", (2, 4)))
    }
    with pytest.raises(TransmuterError, match="one input per name in xs and zs"):
        transmuter.run(transmuter.load(model), feed)
