"""Gradients through elementwise ops and activations, reductions, data movement, indexing,
pooling, Resize and GridSample against float64 finite differences (tolerance: see grad_harness.py).

Non-differentiable points are kept out of the data, since finite differences across a kink or a
jump measure nothing: inputs of Relu-like, Abs, Clip, Floor and Round ops stay at least 0.05
from their kinks and jumps (h is 1e-5), and inputs of max-like ops (MaxPool, ReduceMax, Max,
TopK, GlobalMaxPool) are distinct values at least 0.05 apart, so no window or top-k set has a
tie or changes under a step. Floor, Round and Sign are checked to give JAX's zero gradient.
"""

from __future__ import annotations

import numpy as np
import pytest
from grad_harness import check_gradients, check_gradients_jit_and_eager, graph_model, node_model
from onnx import TensorProto, helper

import transmuter


def data(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape) * scale


def positive(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).uniform(0.5, 1.5, shape)


def distinct(*shape: int, seed: int = 0) -> np.ndarray:
    """Values 0.1 apart in random order, plus < 0.05 of noise: no ties, stable ordering."""
    rng = np.random.default_rng(seed + sum(shape))
    size = int(np.prod(shape))
    values = (rng.permutation(size) - size / 2) * 0.1 + rng.uniform(0, 0.05, size)
    return values.reshape(shape)


def away_from(points: list[float], *shape: int, seed: int = 0) -> np.ndarray:
    """Uniform in [-3, 3], moved to at least 0.05 from each of `points` (kinks, jumps)."""
    x = np.random.default_rng(seed + sum(shape)).uniform(-3, 3, shape)
    for p in points:
        near = np.abs(x - p) < 0.05
        x[near] = p + np.where(x[near] >= p, 0.06, -0.06)
    return x


def unary_ops_model(ops: list[tuple[str, dict, np.ndarray]]):
    """One node per entry, each on its own input X<i> to its own output Y<i>, so a wrong
    gradient names its input. Opset 24, where Swish is defined."""
    nodes = [helper.make_node(op, [f"X{i}"], [f"Y{i}"], **a) for i, (op, a, _) in enumerate(ops)]
    inputs = {f"X{i}": x for i, (_, _, x) in enumerate(ops)}
    outputs = [f"Y{i}" for i in range(len(ops))]
    return graph_model(nodes, inputs=inputs, outputs=outputs, opset=24), inputs


# ---- elementwise --------------------------------------------------------------------------

SMOOTH = [
    ("Exp", {}, data(5)),
    ("Log", {}, positive(5)),
    ("Sqrt", {}, positive(5)),
    ("Reciprocal", {}, positive(5)),
    ("Erf", {}, data(5)),
    ("Tanh", {}, data(5)),
    ("Sigmoid", {}, data(5)),
    ("Sin", {}, data(5)),
    ("Cos", {}, data(5)),
    ("Atan", {}, data(5)),
    ("Softplus", {}, data(5)),
    ("Softsign", {}, away_from([0.0], 5)),
    ("Gelu", {}, data(5)),
    ("Gelu", {"approximate": "tanh"}, data(5)),
    ("Mish", {}, data(5)),
    ("Swish", {"alpha": 1.5}, data(5)),
    ("Neg", {}, data(5)),
]

# Kinks: 0 for the Relu family, Abs and Sign; -3 and 3 for HardSwish; -beta/alpha and
# (1 - beta)/alpha for HardSigmoid; alpha for ThresholdedRelu; +-lambd for Shrink. Jumps: the
# integers for Floor, the half-integers for Round.
PIECEWISE = [
    ("Relu", {}, away_from([0.0], 6)),
    ("LeakyRelu", {"alpha": 0.1}, away_from([0.0], 6)),
    ("Elu", {"alpha": 0.7}, away_from([0.0], 6)),
    ("Selu", {}, away_from([0.0], 6)),
    ("Celu", {"alpha": 1.3}, away_from([0.0], 6)),
    ("Abs", {}, away_from([0.0], 6)),
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, away_from([-2.5, 2.5], 6)),
    ("HardSwish", {}, away_from([-3.0, 3.0], 6)),
    ("ThresholdedRelu", {"alpha": 0.5}, away_from([0.5], 6)),
    ("Shrink", {"lambd": 0.5, "bias": 0.2}, away_from([-0.5, 0.5], 6)),
    ("Floor", {}, away_from([-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0], 6)),
    ("Round", {}, away_from([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], 6)),
    ("Sign", {}, away_from([0.0], 6)),
]


@pytest.mark.parametrize("table", [SMOOTH, PIECEWISE], ids=["smooth", "piecewise"])
def test_unary_elementwise_and_activations(table):
    proto, inputs = unary_ops_model(table)
    check_gradients(proto, inputs)


def test_binary_elementwise_with_broadcasting():
    # Pow: base positive (a real power of a negative base is not defined), exponent a param.
    # Max/Min/PRelu read M and N, distinct values, so no pair ties.
    a, b = positive(2, 3), data(3, seed=1)
    values = distinct(3, 3, seed=2)
    m, n = values[:2], values[2]
    nodes = [
        helper.make_node("Add", ["A", "B"], ["add"]),
        helper.make_node("Sub", ["A", "B"], ["sub"]),
        helper.make_node("Mul", ["A", "B"], ["mul"]),
        helper.make_node("Div", ["B", "A"], ["div"]),
        helper.make_node("Pow", ["A", "E"], ["pow"]),
        helper.make_node("Max", ["M", "N"], ["max"]),
        helper.make_node("Min", ["N", "M"], ["min"]),
        helper.make_node("Mean", ["M", "A"], ["mean"]),
        helper.make_node("Sum", ["M", "A", "B"], ["sum"]),
        helper.make_node("PRelu", ["M", "slope"], ["prelu"]),
    ]
    outputs = ["add", "sub", "mul", "div", "pow", "max", "min", "mean", "sum", "prelu"]
    inputs = {"A": a, "B": b, "M": m, "N": n}
    proto = graph_model(
        nodes,
        inputs=inputs,
        weights={"E": data(2, 3, seed=3), "slope": positive(3, seed=4) * 0.2},
        outputs=outputs,
    )
    check_gradients(proto, inputs)


def test_clip_with_min_and_max_as_params():
    # Clip's bounds are differentiable too: d/dmin is 1 where x < min.
    x = away_from([-0.4, 0.6], 10)
    proto = node_model(
        "Clip",
        ["X", "min", "max"],
        inputs={"X": x},
        weights={"min": np.array(-0.4), "max": np.array(0.6)},
    )
    check_gradients(proto, {"X": x})


def test_where_both_branches():
    x, y = data(2, 3), data(3, seed=1)
    cond = np.array([[True, False, True], [False, False, True]])
    proto = node_model("Where", ["C", "X", "Y"], inputs={"X": x, "Y": y}, constants={"C": cond})
    check_gradients(proto, {"X": x, "Y": y})


# ---- reductions ---------------------------------------------------------------------------

REDUCTIONS = [
    ("ReduceSum", data(2, 3, 4)),
    ("ReduceMean", data(2, 3, 4)),
    ("ReduceProd", positive(2, 3, 4)),
    ("ReduceL1", away_from([0.0], 2, 3, 4)),
    ("ReduceL2", data(2, 3, 4)),
    ("ReduceLogSum", positive(2, 3, 4)),
    ("ReduceLogSumExp", data(2, 3, 4)),
    ("ReduceSumSquare", data(2, 3, 4)),
    ("ReduceMax", distinct(2, 3, 4)),
    ("ReduceMin", distinct(2, 3, 4)),
]


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_over_axes_input(keepdims):
    # Opset 18: axes is an input (a host constant here); two of three axes reduced.
    nodes = [
        helper.make_node(op, [f"X{i}", "axes"], [f"Y{i}"], keepdims=keepdims)
        for i, (op, _) in enumerate(REDUCTIONS)
    ]
    inputs = {f"X{i}": x for i, (_, x) in enumerate(REDUCTIONS)}
    proto = graph_model(
        nodes,
        inputs=inputs,
        constants={"axes": np.array([0, -1])},
        outputs=[f"Y{i}" for i in range(len(REDUCTIONS))],
        opset=18,
    )
    check_gradients(proto, inputs)


@pytest.mark.parametrize("attrs", [{}, {"exclusive": 1, "reverse": 1}], ids=["plain", "excl_rev"])
def test_cumsum(attrs):
    x = data(3, 4)
    proto = node_model(
        "CumSum", ["X", "axis"], attrs, inputs={"X": x}, constants={"axis": np.array(-1)}
    )
    check_gradients(proto, {"X": x})


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_values(largest):
    # Only the values output carries a gradient; the indices (int64) are not read out.
    x = distinct(3, 5)
    proto = node_model(
        "TopK",
        ["X", "K"],
        {"axis": 1, "largest": largest},
        outputs=["values", "indices"],
        inputs={"X": x},
        constants={"K": np.array([2])},
    )
    check_gradients(proto, {"X": x})


# ---- data movement ------------------------------------------------------------------------

MOVEMENT = {
    "pad_constant": ("Pad", {"mode": "constant"}, {"pads": [0, 1, 1, 2], "value": 0.5}),
    "pad_reflect": ("Pad", {"mode": "reflect"}, {"pads": [1, 2, 0, 1]}),
    "pad_edge": ("Pad", {"mode": "edge"}, {"pads": [2, 0, 1, 3]}),
    "slice_negative_step": (
        "Slice",
        {},
        {"starts": [-1, 0], "ends": [0, 4], "axes": [0, 1], "steps": [-2, 3]},
    ),
    "transpose": ("Transpose", {"perm": [1, 0]}, {}),
    "reshape": ("Reshape", {}, {"shape": [2, -1, 2]}),
    "expand": ("Expand", {}, {"shape": [2, 3, 4]}),
    "tile": ("Tile", {}, {"repeats": [2, 3]}),
}


@pytest.mark.parametrize("name", sorted(MOVEMENT))
def test_data_movement(name):
    op_type, attrs, constants = MOVEMENT[name]
    # Pad's constant value is a float input: it is a param here, and gets a gradient too.
    weights = {k: np.array(v, np.float64) for k, v in constants.items() if k == "value"}
    consts = {k: np.array(v, np.int64) for k, v in constants.items() if k != "value"}
    x = data(3, 4)
    proto = node_model(
        op_type, ["X", *constants], attrs, inputs={"X": x}, weights=weights, constants=consts
    )
    check_gradients(proto, {"X": x})


def test_concat_of_an_input_and_a_param():
    x = data(2, 3)
    proto = node_model(
        "Concat", ["X", "W"], {"axis": -1}, inputs={"X": x}, weights={"W": data(2, 2, seed=1)}
    )
    check_gradients(proto, {"X": x})


# ---- indexing -----------------------------------------------------------------------------

# Gathers use repeated and negative indices: their backward pass must add the repeats.
INDEXING = {
    "gather": ("Gather", {"axis": 1}, data(3, 4), {"I": np.array([[0, -1], [3, 0]])}),
    "gather_elements": (
        "GatherElements",
        {"axis": 0},
        data(3, 2),
        {"I": np.array([[0, 2], [0, 1], [2, 2]])},
    ),
    "gather_nd_batch": (
        "GatherND",
        {"batch_dims": 1},
        data(2, 3, 2),
        {"I": np.array([[[1], [1]], [[0], [2]]])},
    ),
}


@pytest.mark.parametrize("name", sorted(INDEXING))
def test_gathers(name):
    op_type, attrs, x, constants = INDEXING[name]
    proto = node_model(op_type, ["X", *constants], attrs, inputs={"X": x}, constants=constants)
    check_gradients(proto, {"X": x})


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
def test_scatter_elements(reduction):
    # Unique positions for "none" (the spec leaves duplicates undefined) and "mul" (JAX has a
    # scatter-multiply gradient only for unique host indices; test_grad_refusals.py has the
    # repeated case); "add" writes (1, 0) and (2, 2) twice, so its backward pass must hand both
    # updates the same gradient.
    indices = np.array([[1, 0, 2], [1, 2, 2] if reduction == "add" else [0, 2, 1]])
    x, updates = data(3, 3), data(2, 3, seed=1)
    proto = node_model(
        "ScatterElements",
        ["X", "I", "U"],
        {"axis": 0, "reduction": reduction},
        inputs={"X": x, "U": updates},
        constants={"I": indices},
    )
    check_gradients(proto, {"X": x, "U": updates})


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
def test_scatter_nd(reduction):
    indices = np.array([[2], [2]]) if reduction == "add" else np.array([[2], [0]])
    x, updates = data(3, 4), data(2, 4, seed=1)
    proto = node_model(
        "ScatterND",
        ["X", "I", "U"],
        {"reduction": reduction},
        inputs={"X": x, "U": updates},
        constants={"I": indices},
    )
    check_gradients(proto, {"X": x, "U": updates})


# ---- pooling ------------------------------------------------------------------------------

WINDOWED_POOLS = {
    "max_pads_strides": (
        "MaxPool",
        {"kernel_shape": [2, 3], "pads": [1, 1, 0, 1], "strides": [2, 1]},
    ),
    "max_ceil": ("MaxPool", {"kernel_shape": [2, 2], "ceil_mode": 1, "strides": [2, 2]}),
    # Dilated max windows are lowered as a max over kernel taps (JAX's max-window gradient has
    # no rule for window dilation).
    "max_dilated": ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 1]}),
    "max_dilated_pads_ceil": (
        "MaxPool",
        {
            "kernel_shape": [2, 2],
            "dilations": [2, 2],
            "pads": [1, 0, 1, 1],
            "strides": [2, 1],
            "ceil_mode": 1,
        },
    ),
    "average_dilated": (
        "AveragePool",
        {"kernel_shape": [2, 2], "dilations": [1, 2], "pads": [0, 1, 1, 1]},
    ),
    "average_count_pad": (
        "AveragePool",
        {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1},
    ),
    "average_exclude_pad_ceil": (
        "AveragePool",
        {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "strides": [2, 2], "ceil_mode": 1},
    ),
    "lp_p2": ("LpPool", {"kernel_shape": [2, 2], "p": 2}),
    "lp_p3_strided": ("LpPool", {"kernel_shape": [3, 2], "p": 3, "strides": [2, 1]}),
}
GLOBAL_POOLS = {
    "global_average": ("GlobalAveragePool", {}),
    "global_max": ("GlobalMaxPool", {}),
    "global_lp": ("GlobalLpPool", {"p": 3}),
}


def pool_case(table: dict, name: str):
    op_type, attrs = table[name]
    # Distinct values: max windows have no ties; Lp norms of a p=3 pool avoid |x| = 0.
    x = distinct(1, 2, 5, 4) + 0.2
    return node_model(op_type, ["X"], attrs, inputs={"X": x}), {"X": x}


@pytest.mark.parametrize("name", sorted(WINDOWED_POOLS))
def test_windowed_pooling(name):
    check_gradients_jit_and_eager(*pool_case(WINDOWED_POOLS, name))


@pytest.mark.parametrize("name", sorted(GLOBAL_POOLS))
def test_global_pooling(name):
    check_gradients(*pool_case(GLOBAL_POOLS, name))


# With the Indices output wanted, Y still comes from the max reduction alone: JAX cannot
# differentiate the (value, index) reduction that gives the indices.
@pytest.mark.parametrize("dilations", [[1, 1], [2, 1]], ids=["plain", "dilated"])
def test_max_pool_with_indices_output(dilations):
    x = distinct(1, 1, 5, 4)
    attrs = {"kernel_shape": [2, 2], "dilations": dilations}
    proto = node_model("MaxPool", ["X"], attrs, outputs=["Y", "I"], inputs={"X": x})
    check_gradients_jit_and_eager(proto, {"X": x})


# ---- Resize -------------------------------------------------------------------------------

RESIZES = {
    "linear_scales_half_pixel": (
        {"mode": "linear"},
        {"scales": np.array([1, 1, 1.5, 2.0], np.float32)},
    ),
    "linear_sizes_align_corners": (
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        {"sizes": np.array([1, 2, 5, 3])},
    ),
    "linear_antialias_downsample": (
        {"mode": "linear", "antialias": 1},
        {"scales": np.array([1, 1, 0.6, 0.5], np.float32)},
    ),
    "cubic_scales": (
        {"mode": "cubic", "cubic_coeff_a": -0.5},
        {"scales": np.array([1, 1, 2.0, 1.5], np.float32)},
    ),
    "cubic_sizes_exclude_outside": (
        {"mode": "cubic", "exclude_outside": 1},
        {"sizes": np.array([1, 2, 3, 6])},
    ),
}


@pytest.mark.parametrize("name", sorted(RESIZES))
def test_resize(name):
    # scales and sizes are Constant nodes: they decide the output shape (host values).
    attrs, constants = RESIZES[name]
    x = data(1, 2, 4, 4)
    inputs = ["X", "", *constants] if "scales" in constants else ["X", "", "", "sizes"]
    proto = node_model("Resize", inputs, attrs, inputs={"X": x}, constants=constants, opset=19)
    check_gradients(proto, {"X": x})


@pytest.mark.parametrize("attrs", [{"mode": "linear"}, {"mode": "cubic", "align_corners": 1}])
def test_grid_sample_with_respect_to_image_and_grid(attrs):
    # Random sample positions: none on a pixel centre, where linear interpolation has a kink.
    x = data(1, 2, 4, 5)
    grid = np.random.default_rng(3).uniform(-1.1, 1.1, (1, 3, 2, 2))
    inputs = {"X": x, "grid": grid}
    proto = node_model("GridSample", ["X", "grid"], attrs, inputs=inputs, opset=22)
    check_gradients(proto, inputs)


# trainable=True makes float initializers params, but not those a node reads as a host input
# (Resize's scales): traced under jax.grad w.r.t. the params, they could not decide a shape.
def test_resize_with_scales_as_an_initializer_of_a_trainable_model():
    x = data(1, 2, 4, 4)
    proto = node_model(
        "Resize",
        ["X", "", "scales"],
        {"mode": "linear"},
        inputs={"X": x},
        weights={"scales": np.array([1, 1, 1.5, 2.0], np.float32)},
        opset=19,
    )
    assert not transmuter.load(proto, trainable=True).params
    check_gradients(proto, {"X": x})


def test_host_read_initializer_in_a_subgraph_stays_out_of_the_params():
    # An If branch resizes X with the outer graph's scales; W, read as data, stays a param. The
    # other branch defines its own "scales", which does not hide the outer one from the first.
    info = helper.make_tensor_value_info
    resize = helper.make_graph(
        [helper.make_node("Resize", ["X", "", "scales"], ["resized"], mode="linear")],
        "resize",
        [],
        [info("resized", TensorProto.DOUBLE, None)],
    )
    shadow = helper.make_graph(
        [
            helper.make_node("Mul", ["W", "X"], ["scales"]),
            helper.make_node("Identity", ["scales"], ["scaled"]),
        ],
        "shadow",
        [],
        [info("scaled", TensorProto.DOUBLE, None)],
    )
    x = data(1, 2, 3, 3)
    proto = graph_model(
        [
            helper.make_node("If", ["flag"], ["R"], then_branch=resize, else_branch=shadow),
            helper.make_node("Mul", ["R", "W"], ["Y"]),
        ],
        inputs={"X": x},
        weights={"scales": np.array([1, 1, 2.0, 1.5], np.float32), "W": np.array(0.5)},
        constants={"flag": np.array(True)},
        opset=19,
    )
    model = transmuter.load(proto, trainable=True)
    assert set(model.params) == {"W"}
    assert "scales" in model.host_constants
    check_gradients(proto, {"X": x})
