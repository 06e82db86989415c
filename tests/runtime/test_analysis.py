"""Graph analysis reads every fact about an operator from its registration: certain breaks from
declared host inputs and data-dependent shapes, possible ones from `may_need_host` and
`strings_on_host`; and an op may only ask for a host value its registration declares."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import transmuter
from transmuter import ir
from transmuter.errors import HostValueNeeded
from transmuter.lowering import OpContext, lookup, registered

F, I64, STR, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING, TensorProto.BOOL


def load(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return transmuter.load(model.SerializeToString())


def breaks_of(model, static=()):
    return [(b.node, b.input, b.certain) for b in model.graph_breaks(static)]


def test_declared_host_input_and_data_dependent_shape_are_certain_breaks():
    model = load(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
            helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
        ],
        [
            helper.make_tensor_value_info("x", F, [6]),
            helper.make_tensor_value_info("shape", I64, [2]),
        ],
        [
            helper.make_tensor_value_info("r", F, [2, 3]),
            helper.make_tensor_value_info("nz", I64, [1, "k"]),
        ],
    )
    assert breaks_of(model) == [("reshape", "shape", True), ("nonzero", "x", True)]
    assert "target shape" in model.graph_breaks()[0].reason
    # A static shape input folds the Reshape; NonZero still reads data.
    assert breaks_of(model, {"shape"}) == [("nonzero", "x", True)]


def test_shape_readers_make_host_values():
    model = load(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape"),
        ],
        [helper.make_tensor_value_info("x", F, ["n"])],
        [helper.make_tensor_value_info("y", F, ["n"])],
    )
    assert breaks_of(model) == []


def test_an_if_on_data_may_break():
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, None)],
    )
    model = load(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
        [helper.make_tensor_value_info("c", BOOL, []), helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
    )
    assert breaks_of(model) == [("if", "c", False)]
    assert model.graph_breaks()[0].reason == lookup("", "If", 17).may_need_host


def test_ops_on_strings_may_break_only_where_strings_are():
    table = numpy_helper.from_array(np.array(["a", "b", "c"], dtype=object), "table")
    weights = numpy_helper.from_array(np.ones((3, 2), np.float32), "weights")
    model = load(
        [
            helper.make_node("Gather", ["table", "i"], ["word"], name="words"),
            helper.make_node("Gather", ["weights", "i"], ["row"], name="rows"),
            helper.make_node("Cast", ["x"], ["text"], name="print", to=STR),
        ],
        [helper.make_tensor_value_info("i", I64, [2]), helper.make_tensor_value_info("x", F, [2])],
        [
            helper.make_tensor_value_info("word", STR, [2]),
            helper.make_tensor_value_info("row", F, [2, 2]),
            helper.make_tensor_value_info("text", STR, [2]),
        ],
        [table, weights],
    )
    assert breaks_of(model) == [("words", "i", False), ("print", "x", False)]
    compiled = transmuter.compile(
        model, {"i": np.array([2, 0]), "x": np.array([1.5, 2], np.float32)}
    )
    out = compiled({"i": np.array([1, 2]), "x": np.array([3, 4], np.float32)})
    assert out["word"].tolist() == ["b", "c"] and out["text"].tolist() == ["3", "4"]


def context(asks_host: bool) -> OpContext:
    node = ir.Node("Where", "", ("c", "x", "y"), ("z",), name="w")
    never = lambda *args: None  # noqa: E731
    return OpContext(node, 17, never, never, never, asks_host)


def test_need_host_raises_the_break_for_a_declaring_op():
    with pytest.raises(HostValueNeeded, match="'c'"):
        context(True).need_host(0, "the condition")


def test_need_host_is_refused_to_an_op_that_does_not_declare_it():
    with pytest.raises(TypeError, match="declares no may_need_host or strings_on_host"):
        context(False).need_host(0, "the condition")


def test_every_op_that_asks_for_host_values_takes_a_context():
    asking = [d for d in registered() if d.asks_host]
    assert asking and all(d.context for d in asking)
    assert {"If", "Loop", "RoiAlign", "Where", "Cast", "Gather", "LabelEncoder"} <= {
        d.op_type for d in asking
    }
