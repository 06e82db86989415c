"""If, Loop and Scan against ONNX Runtime, eager and compiled.

Subgraphs read outer-scope values, so most models here are built by hand rather than with
make_node_model (which makes every graph input a node input).
"""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs

import transmuter

F32 = np.float32


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _graph(nodes, inputs=(), outputs=(), initializers=None, name="body"):
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    return helper.make_graph(nodes, name, list(inputs), list(outputs), inits)


def _model(nodes, inputs, outputs, *, initializers=None, opset=21):
    """A model whose graph inputs are `inputs` (name -> example array) and whose outputs are
    untyped, so ONNX Runtime infers them."""
    graph = _graph(
        nodes,
        [_vi(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()],
        [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
        initializers,
        name="main",
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _check(model, inputs, *, compiled=True, rtol=1e-5, atol=1e-6):
    expected = ort_run(model, inputs)
    for mode, outputs in transmuter_runs(model, inputs, compiled=compiled).items():
        assert len(outputs) == len(expected)
        for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            assert_close(got, want, rtol=rtol, atol=atol, what=f"output {i} ({mode})")
    return expected


def _check_break(model, inputs, reason):
    """Eager and compiled against ONNX Runtime, where compiling breaks the graph at the (first)
    node; inside a caller's own jax.jit, which cannot break, the node raises HostValueNeeded."""
    _check(model, inputs)
    loaded = transmuter.load(model)
    assert transmuter.compile(loaded, inputs).segments[0][1] == 0
    with jax.enable_x64(True), pytest.raises(transmuter.HostValueNeeded, match=reason):
        jax.jit(lambda feeds: transmuter.run(loaded, feeds))(inputs)


# ---- If ---------------------------------------------------------------------------------------


def _branches(same_shape: bool):
    """then: x + 1 (shape [2, 3]); else: x * 2, or concat(x, x) when shapes differ."""
    then = _graph(
        [helper.make_node("Add", ["x", "one"], ["t"])],
        outputs=[_vi("t", TP.FLOAT, None)],
        initializers={"one": np.array(1, F32)},
        name="then",
    )
    other = (
        helper.make_node("Mul", ["x", "two"], ["e"])
        if same_shape
        else helper.make_node("Concat", ["x", "x"], ["e"], axis=0)
    )
    orelse = _graph(
        [other],
        outputs=[_vi("e", TP.FLOAT, None)],
        initializers={"two": np.array(2, F32)},
        name="else",
    )
    return {"then_branch": then, "else_branch": orelse}


@pytest.mark.parametrize("opset", [7, 11, 13, 16, 21, 25])
@pytest.mark.parametrize("value", [True, False])
def test_if_host_condition_picks_branch(rng, opset, value):
    # A constant condition is decided on the host, so even differently shaped branches compile.
    x = rng.standard_normal((2, 3)).astype(F32)
    node = helper.make_node("If", ["cond"], ["y"], **_branches(same_shape=opset < 11))
    model = _model([node], {"x": x}, ["y"], initializers={"cond": np.array(value)}, opset=opset)
    _check(model, {"x": x})


@pytest.mark.parametrize("value", [True, False])
def test_if_traced_condition_same_shapes_is_lax_cond(rng, value):
    x = rng.standard_normal((2, 3)).astype(F32)
    node = helper.make_node("If", ["cond"], ["y"], **_branches(same_shape=True))
    inputs = {"cond": np.array(value), "x": x}
    _check(_model([node], inputs, ["y"]), inputs)


@pytest.mark.parametrize("value", [True, False])
def test_if_traced_condition_different_shapes_is_a_break(rng, value):
    x = rng.standard_normal((2, 3)).astype(F32)
    node = helper.make_node("If", ["cond"], ["y"], **_branches(same_shape=False))
    inputs = {"cond": np.array(value), "x": x}
    _check_break(_model([node], inputs, ["y"]), inputs, "the If condition")


def _untraceable_else():
    """then: x + 1; else: MatMul(x, w) with w [4, 3], invalid for the x[2, 3] given here."""
    then = _graph(
        [helper.make_node("Add", ["x", "one"], ["t"])],
        outputs=[_vi("t", TP.FLOAT, None)],
        initializers={"one": np.array(1, F32)},
        name="then",
    )
    orelse = _graph(
        [helper.make_node("MatMul", ["x", "w"], ["e"])],
        outputs=[_vi("e", TP.FLOAT, None)],
        initializers={"w": np.ones((4, 3), F32)},
        name="else",
    )
    return {"then_branch": then, "else_branch": orelse}


def _open_x(model):
    """x's dims made symbolic, so that ONNX Runtime's load-time inference accepts the model
    (with static dims it rejects the else branch before running anything)."""
    (x,) = [v for v in model.graph.input if v.name == "x"]
    for axis, dim in enumerate(x.type.tensor_type.shape.dim):
        dim.dim_param = f"x{axis}"
    return model


def test_if_traced_condition_with_an_untraceable_branch_is_a_break(rng):
    # ONNX Runtime runs only the taken branch; tracing the other one fails for these shapes.
    x = rng.standard_normal((2, 3)).astype(F32)
    node = helper.make_node("If", ["cond"], ["y"], **_untraceable_else())
    inputs = {"cond": np.array(True), "x": x}
    _check_break(_open_x(_model([node], inputs, ["y"])), inputs, "else_branch cannot be traced")


def test_if_host_condition_traces_only_the_taken_branch(rng):
    x = rng.standard_normal((2, 3)).astype(F32)
    node = helper.make_node("If", ["cond"], ["y"], **_untraceable_else())
    model = _open_x(_model([node], {"x": x}, ["y"], initializers={"cond": np.array(True)}))
    _check(model, {"x": x})
    assert transmuter.compile(transmuter.load(model), {"x": x}).segments == [(0, "end", True)]


def test_if_single_element_condition_and_several_outputs(rng):
    x = rng.standard_normal((4,)).astype(F32)
    then = _graph(
        [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Identity", ["k"], ["b"])],
        outputs=[_vi("a", TP.FLOAT, None), _vi("b", TP.INT64, None)],
        initializers={"k": np.array([1, 2], np.int64)},
    )
    orelse = _graph(
        [helper.make_node("Mul", ["x", "x"], ["c"]), helper.make_node("Identity", ["k2"], ["d"])],
        outputs=[_vi("c", TP.FLOAT, None), _vi("d", TP.INT64, None)],
        initializers={"k2": np.array([3, 4], np.int64)},
    )
    node = helper.make_node("If", ["cond"], ["y", "z"], then_branch=then, else_branch=orelse)
    for value in (True, False):
        inputs = {"cond": np.array([value]), "x": x}
        _check(_model([node], inputs, ["y", "z"]), inputs)


@pytest.mark.parametrize("lengths", [(2, 2), (2, 3)])
def test_if_sequence_outputs(rng, lengths):
    # If-13 branches may return sequences: lax.cond when both have the same length, else a break.
    x = rng.standard_normal((2,)).astype(F32)
    branches = {}
    for key, length in zip(("then_branch", "else_branch"), lengths, strict=True):
        out = f"{key}_seq"
        node = helper.make_node("SequenceConstruct", ["x"] * length, [out])
        branches[key] = _graph(
            [node], outputs=[helper.make_tensor_sequence_value_info(out, TP.FLOAT, None)]
        )
    nodes = [
        helper.make_node("If", ["cond"], ["seq"], **branches),
        helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0),
    ]
    inputs = {"cond": np.array(False), "x": x}
    model = _model(nodes, inputs, ["y"], opset=13)
    if lengths[0] == lengths[1]:
        _check(model, inputs)
    else:
        _check_break(model, inputs, "the If condition")


# ---- Loop -------------------------------------------------------------------------------------


def _loop_body(nodes, carried, scans, initializers=None, cond_out=None):
    """A Loop body: inputs (i, cond_in, *carried), outputs (cond_out, *carried_out, *scans);
    without cond_out the condition passes through. carried: (name, elem type) pairs; scans:
    (name, elem type[, shape]) tuples."""
    inputs = [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, [])]
    inputs += [_vi(f"{n}_in", t, None) for n, t in carried]
    if cond_out is None:
        cond_out = "cond_out"
        nodes = [*nodes, helper.make_node("Identity", ["cond_in"], [cond_out])]
    outputs = [_vi(cond_out, TP.BOOL, [])]
    outputs += [_vi(f"{n}_out", t, None) for n, t in carried]
    outputs += [_vi(n, t, rest[0] if rest else None) for n, t, *rest in scans]
    return _graph(nodes, inputs, outputs, initializers)


def _accumulate_body(shape=None):
    """x_out = x_in + w * i (w read from the outer scope); scan output x_in * x_in."""
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
        helper.make_node("Mul", ["w", "fi"], ["wi"]),
        helper.make_node("Add", ["x_in", "wi"], ["x_out"]),
        helper.make_node("Mul", ["x_in", "x_in"], ["sq"]),
    ]
    return _loop_body(nodes, [("x", TP.FLOAT)], [("sq", TP.FLOAT, shape)])


@pytest.mark.parametrize("opset", [7, 11, 16, 25])
@pytest.mark.parametrize("trips", [0, 1, 4])
@pytest.mark.parametrize("with_cond", [False, True])
def test_loop_constant_trip_count_with_scan_outputs(rng, opset, trips, with_cond):
    x = rng.standard_normal((2, 3)).astype(F32)
    w = rng.standard_normal((3,)).astype(F32)
    constants = {"M": np.array(trips, np.int64), "keep": np.array(True)}
    # With no iteration ONNX Runtime shapes an empty scan output from the body's declared output
    # shape ([0] when undeclared); the stack of no [2, 3] rows is [0, 2, 3], so declare it.
    body = _accumulate_body(shape=[2, 3])
    node = helper.make_node(
        "Loop", ["M", "keep" if with_cond else "", "x"], ["x_final", "sqs"], body=body
    )
    inputs = {"x": x, "w": w}
    model = _model([node], inputs, ["x_final", "sqs"], initializers=constants, opset=opset)
    _check(model, inputs)


def test_loop_trip_count_input_without_scan_outputs_is_while_loop(rng):
    x = rng.standard_normal((3,)).astype(F32)
    w = rng.standard_normal((3,)).astype(F32)
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
        helper.make_node("Mul", ["w", "fi"], ["wi"]),
        helper.make_node("Add", ["x_in", "wi"], ["x_out"]),
    ]
    body = _loop_body(nodes, [("x", TP.FLOAT)], [])
    node = helper.make_node("Loop", ["M", "", "x"], ["x_final"], body=body)
    for trips in (0, 5):
        inputs = {"M": np.array(trips, np.int64), "x": x, "w": w}
        _check(_model([node], inputs, ["x_final"]), inputs)


def test_loop_trip_count_input_with_scan_outputs_is_a_break(rng):
    inputs = {"M": np.array(3, np.int64), "x": rng.standard_normal((2, 3)).astype(F32)}
    inputs["w"] = rng.standard_normal((3,)).astype(F32)
    node = helper.make_node("Loop", ["M", "", "x"], ["x_final", "sqs"], body=_accumulate_body())
    _check_break(_model([node], inputs, ["x_final", "sqs"]), inputs, "the Loop trip count")


def _while_body(with_scan: bool):
    """c_out = c_in * 2 and x_out = x_in + c_in; keep going while c_out < limit (an outer value)."""
    nodes = [
        helper.make_node("Mul", ["c_in", "two"], ["c_out"]),
        helper.make_node("Add", ["x_in", "c_in"], ["x_out"]),
        helper.make_node("Less", ["c_out", "limit"], ["go"]),
        helper.make_node("Identity", ["x_in"], ["seen"]),
    ]
    scans = [("seen", TP.FLOAT)] if with_scan else []
    carried = [("c", TP.FLOAT), ("x", TP.FLOAT)]
    return _loop_body(nodes, carried, scans, {"two": np.array(2, F32)}, cond_out="go")


@pytest.mark.parametrize("trip_count", [None, 3, 100])
def test_loop_condition_computed_in_body(trip_count):
    inputs = {"c": np.array(0.75, F32), "x": np.array([0.5, 0.25], F32), "limit": np.array(20, F32)}
    constants = {"keep": np.array(True)}
    if trip_count is not None:
        constants["M"] = np.array(trip_count, np.int64)
    node = helper.make_node(
        "Loop",
        ["M" if trip_count else "", "keep", "c", "x"],
        ["c_final", "x_final"],
        body=_while_body(False),
    )
    _check(_model([node], inputs, ["c_final", "x_final"], initializers=constants), inputs)


@pytest.mark.parametrize("keep", [True, False])
def test_loop_traced_condition_input_is_while_loop(keep):
    node = helper.make_node(
        "Loop", ["", "keep", "c", "x"], ["c_final", "x_final"], body=_while_body(False)
    )
    inputs = {"keep": np.array(keep), "c": np.array(0.75, F32), "x": np.array([0.5, 0.25], F32)}
    inputs["limit"] = np.array(20, F32)
    model = _model([node], inputs, ["c_final", "x_final"])
    _check(model, inputs)
    assert transmuter.compile(transmuter.load(model), inputs).segments == [(0, "end", True)]


def test_loop_condition_in_body_with_scan_outputs_is_a_break():
    # The number of stacked rows depends on data.
    inputs = {"c": np.array(0.75, F32), "x": np.array([0.5, 0.25], F32), "limit": np.array(20, F32)}
    node = helper.make_node(
        "Loop", ["", "keep", "c", "x"], ["c_final", "x_final", "seen"], body=_while_body(True)
    )
    model = _model(
        [node], inputs, ["c_final", "x_final", "seen"], initializers={"keep": np.array(True)}
    )
    _check_break(model, inputs, "the Loop condition")


def test_loop_growing_concat_unrolls_with_constant_trip_count(rng):
    x = rng.standard_normal((1, 2)).astype(F32)
    nodes = [
        helper.make_node("Concat", ["acc_in", "x"], ["acc_out"], axis=0),
        helper.make_node("Identity", ["i"], ["iters"]),
    ]
    body = _loop_body(nodes, [("acc", TP.FLOAT)], [("iters", TP.INT64)])
    node = helper.make_node("Loop", ["M", "", "x"], ["acc_final", "all_i"], body=body)
    inputs = {"x": x}
    model = _model(
        [node], inputs, ["acc_final", "all_i"], initializers={"M": np.array(3, np.int64)}
    )
    _check(model, inputs)


def test_loop_carrying_a_growing_sequence(rng):
    x = rng.standard_normal((2,)).astype(F32)
    nodes = [
        helper.make_node("Add", ["x", "x"], ["doubled"]),
        helper.make_node("SequenceInsert", ["seq_in", "doubled"], ["seq_out"]),
    ]
    seq_type = helper.make_tensor_sequence_value_info
    body = _graph(
        [*nodes, helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), seq_type("seq_in", TP.FLOAT, None)],
        [_vi("cond_out", TP.BOOL, []), seq_type("seq_out", TP.FLOAT, None)],
    )
    main = [
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=TP.FLOAT),
        helper.make_node("Loop", ["M", "", "empty"], ["seq"], body=body),
        helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0, new_axis=1),
    ]
    inputs = {"x": x}
    _check(_model(main, inputs, ["y"], initializers={"M": np.array(3, np.int64)}), inputs)


def test_loop_carrying_a_fixed_length_sequence(rng):
    a, b = rng.standard_normal((2, 2)).astype(F32), rng.standard_normal((2, 2)).astype(F32)
    seq_type = helper.make_tensor_sequence_value_info
    body = _graph(
        [
            helper.make_node("SequenceAt", ["seq_in", "zero"], ["first"]),
            helper.make_node("Add", ["first", "b"], ["bumped"]),
            helper.make_node("SequenceErase", ["seq_in", "zero"], ["rest"]),
            helper.make_node("SequenceInsert", ["rest", "bumped"], ["seq_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), seq_type("seq_in", TP.FLOAT, None)],
        [_vi("cond_out", TP.BOOL, []), seq_type("seq_out", TP.FLOAT, None)],
        {"zero": np.array(0, np.int64)},
    )
    main = [
        helper.make_node("SequenceConstruct", ["a", "b"], ["start"]),
        helper.make_node("Loop", ["M", "", "start"], ["seq"], body=body),
        helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0),
    ]
    inputs = {"a": a, "b": b}
    _check(_model(main, inputs, ["y"], initializers={"M": np.array(5, np.int64)}), inputs)


def test_loop_iteration_number_as_host_value(rng):
    # Slice bounds from the iteration number need it on the host: the loop unrolls.
    x = rng.standard_normal((5, 2)).astype(F32)
    nodes = [
        helper.make_node("Add", ["i", "one"], ["end"]),
        helper.make_node("Unsqueeze", ["i", "axes"], ["starts"]),
        helper.make_node("Unsqueeze", ["end", "axes"], ["ends"]),
        helper.make_node("Slice", ["x", "starts", "ends"], ["row"]),
        helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
    ]
    init = {"one": np.array(1, np.int64), "axes": np.array([0], np.int64)}
    body = _loop_body(nodes, [("acc", TP.FLOAT)], [("row", TP.FLOAT)], init)
    node = helper.make_node("Loop", ["M", "", "acc0"], ["acc", "rows"], body=body)
    inputs = {"x": x}
    constants = {"M": np.array(5, np.int64), "acc0": np.zeros((1, 2), F32)}
    _check(_model([node], inputs, ["acc", "rows"], initializers=constants), inputs)


def test_loop_over_host_values_stays_on_the_host(rng):
    # A loop computing a shape from constants folds on the host, so Reshape needs no break.
    nodes = [helper.make_node("Mul", ["shape_in", "factor"], ["shape_out"])]
    body = _loop_body(nodes, [("shape", TP.INT64)], [], {"factor": np.array([2, 1], np.int64)})
    main = [
        helper.make_node("Loop", ["M", "", "shape0"], ["shape"], body=body),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inputs = {"x": rng.standard_normal((24,)).astype(F32)}
    constants = {"M": np.array(2, np.int64), "shape0": np.array([1, 6], np.int64)}
    model = _model(main, inputs, ["y", "shape"], initializers=constants)
    _check(model, inputs)
    assert transmuter.compile(transmuter.load(model), inputs).segments == [(0, "end", True)]


def test_if_nested_in_loop(rng):
    # The inner If's condition depends on the (traced) iteration number: lax.cond inside lax.scan.
    x = rng.standard_normal((3,)).astype(F32)
    then = _graph(
        [helper.make_node("Add", ["x_in", "x"], ["t"])],
        outputs=[_vi("t", TP.FLOAT, None)],
        name="then",
    )
    orelse = _graph(
        [helper.make_node("Mul", ["x_in", "x"], ["e"])],
        outputs=[_vi("e", TP.FLOAT, None)],
        name="else",
    )
    nodes = [
        helper.make_node("Less", ["i", "two"], ["early"]),
        helper.make_node("If", ["early"], ["x_out"], then_branch=then, else_branch=orelse),
        helper.make_node("Identity", ["x_out"], ["trace"]),
    ]
    body = _loop_body(
        nodes, [("x", TP.FLOAT)], [("trace", TP.FLOAT)], {"two": np.array(2, np.int64)}
    )
    node = helper.make_node("Loop", ["M", "", "x"], ["x_final", "traces"], body=body)
    inputs = {"x": x}
    _check(
        _model([node], inputs, ["x_final", "traces"], initializers={"M": np.array(4, np.int64)}),
        inputs,
    )


def test_loop_is_differentiable(rng):
    x = rng.standard_normal((3,)).astype(F32)
    w = rng.standard_normal((3,)).astype(F32)
    node = helper.make_node("Loop", ["M", "", "x"], ["x_final", "sqs"], body=_accumulate_body())
    inputs = {"x": x, "w": w}
    model = transmuter.load(
        _model([node], inputs, ["x_final", "sqs"], initializers={"M": np.array(3, np.int64)})
    )

    def loss(x):
        out = transmuter.run(model, {"x": x, "w": w})
        return out["x_final"].sum() + out["sqs"].sum()

    # x_final = x + w*(0+1+2); sqs rows are x_t^2 with x_t = x, x, x + w, x + 3w.
    expected = 1 + 2 * (x + x + (x + w))
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(x), expected, rtol=1e-5)


# ---- Scan -------------------------------------------------------------------------------------


def _scan_body():
    """state: running sum s [2]; scan input elements x_t [2]; outputs s + x_t, s * x_t."""
    return _graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            helper.make_node("Mul", ["s_in", "x_t"], ["y_t"]),
        ],
        [_vi("s_in", TP.FLOAT, [2]), _vi("x_t", TP.FLOAT, [2])],
        [_vi("s_out", TP.FLOAT, [2]), _vi("y_t", TP.FLOAT, [2])],
    )


@pytest.mark.parametrize("opset", [9, 11, 16, 25])
@pytest.mark.parametrize(
    "attrs, x_shape",
    [
        ({}, (4, 2)),
        ({"scan_input_directions": [1]}, (4, 2)),
        ({"scan_output_directions": [1]}, (4, 2)),
        ({"scan_input_axes": [1], "scan_output_axes": [1]}, (2, 4)),
        ({"scan_input_axes": [-1], "scan_input_directions": [1], "scan_output_axes": [-1]}, (2, 5)),
    ],
)
def test_scan(rng, opset, attrs, x_shape):
    if opset < 11 and any(a < 0 for key in attrs if "axes" in key for a in attrs[key]):
        pytest.skip("negative axes arrived with Scan-11")
    inputs = {
        "s0": rng.standard_normal((2,)).astype(F32),
        "xs": rng.standard_normal(x_shape).astype(F32),
    }
    check_node(
        "Scan",
        inputs,
        {"body": _scan_body(), "num_scan_inputs": 1, **attrs},
        opset=opset,
        outputs=2,
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64])
def test_scan_dtypes(rng, dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    body = _graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            helper.make_node("Mul", ["s_in", "x_t"], ["y_t"]),
        ],
        [_vi("s_in", elem, [2]), _vi("x_t", elem, [2])],
        [_vi("s_out", elem, [2]), _vi("y_t", elem, [2])],
    )
    inputs = {
        "s0": (rng.standard_normal(2) * 3).astype(dtype),
        "xs": (rng.standard_normal((3, 2)) * 3).astype(dtype),
    }
    tol = 1e-2 if dtype == np.float16 else 1e-6
    check_node(
        "Scan",
        inputs,
        {"body": body, "num_scan_inputs": 1},
        opset=21,
        outputs=2,
        rtol=tol,
        atol=tol,
    )


@pytest.mark.parametrize("opset", [8, 16])
def test_scan_zero_length(opset):
    # Neither ONNX Runtime nor onnx.reference runs a scan of length 0; the spec's loop runs no
    # iteration: the state stays, the scan output is an empty stack.
    inputs = {"s0": np.array([1, 2], F32), "xs": np.zeros((0, 2), F32)}
    if opset == 8:  # a batch of 3, no steps
        inputs = {"L": None, "s0": np.tile(inputs["s0"], (3, 1)), "xs": np.zeros((3, 0, 2), F32)}
    attrs = {"body": _scan_body(), "num_scan_inputs": 1}
    model = make_node_model("Scan", inputs, attrs, opset=opset, outputs=2)
    empty = np.zeros((0, 2) if opset > 8 else (3, 0, 2), F32)
    for outputs in transmuter_runs(model, inputs).values():
        assert_close(outputs[0], inputs["s0"], rtol=0, atol=0, what="final state")
        assert_close(outputs[1], empty, rtol=0, atol=0, what="scan output")


def test_scan_two_inputs_two_states_outer_scope(rng):
    body = _graph(
        [
            helper.make_node("Add", ["a_in", "x_t"], ["a_out"]),
            helper.make_node("Mul", ["b_in", "w"], ["b_out"]),
            helper.make_node("Sub", ["x_t", "z_t"], ["d_t"]),
        ],
        [
            _vi("a_in", TP.FLOAT, [3]),
            _vi("b_in", TP.FLOAT, [3]),
            _vi("x_t", TP.FLOAT, [3]),
            _vi("z_t", TP.FLOAT, [3]),
        ],
        [_vi("a_out", TP.FLOAT, [3]), _vi("b_out", TP.FLOAT, [3]), _vi("d_t", TP.FLOAT, [3])],
    )
    node = helper.make_node(
        "Scan",
        ["a", "b", "xs", "zs"],
        ["a_f", "b_f", "ds"],
        body=body,
        num_scan_inputs=2,
        scan_input_axes=[0, 1],
        scan_input_directions=[0, 1],
        scan_output_axes=[1],
    )
    inputs = {
        name: rng.standard_normal(shape).astype(F32)
        for name, shape in [("a", (3,)), ("b", (3,)), ("xs", (4, 3)), ("zs", (3, 4)), ("w", (3,))]
    }
    _check(_model([node], inputs, ["a_f", "b_f", "ds"], opset=16), inputs)


def test_scan_state_that_grows_is_unrolled(rng):
    """ONNX lets a Scan's state change shape (lax.scan does not): the state collects the
    elements, [1] -> [2] -> [3] -> [4]; the loop runs unrolled. ONNX Runtime refuses it."""
    body = _graph(
        [
            helper.make_node("Concat", ["s_in", "x_t"], ["s_out"], axis=0),
            helper.make_node("ReduceSum", ["s_out"], ["y_t"], keepdims=1),
        ],
        [_vi("s_in", TP.FLOAT, ["n"]), _vi("x_t", TP.FLOAT, [1])],
        [_vi("s_out", TP.FLOAT, ["m"]), _vi("y_t", TP.FLOAT, [1])],
    )
    node = helper.make_node("Scan", ["s0", "xs"], ["s_f", "ys"], body=body, num_scan_inputs=1)
    inputs = {"s0": np.array([1], F32), "xs": rng.standard_normal((3, 1)).astype(F32)}
    model = _model([node], inputs, ["s_f", "ys"], opset=16)
    xs = inputs["xs"][:, 0]
    state = np.concatenate([[1], xs]).astype(F32)
    sums = np.cumsum(state)[1:].reshape(3, 1)
    for mode, (final, ys) in transmuter_runs(model, inputs).items():
        assert_close(final, state, rtol=1e-6, atol=1e-6, what=f"final state ({mode})")
        assert_close(ys, sums, rtol=1e-6, atol=1e-6, what=f"scan output ({mode})")


@pytest.mark.parametrize("directions", [None, [0], [1]])
@pytest.mark.parametrize("lengths", [None, [4, 2, 1]])
def test_scan_v8_batch_and_sequence_lens(rng, directions, lengths):
    inputs = {
        "L": None if lengths is None else np.array(lengths, np.int64),
        "s0": rng.standard_normal((3, 2)).astype(F32),
        "xs": rng.standard_normal((3, 4, 2)).astype(F32),
    }
    attrs = {"body": _scan_body(), "num_scan_inputs": 1}
    if directions is not None:
        attrs["directions"] = directions
    check_node("Scan", inputs, attrs, opset=8, outputs=2)
