"""Declared dims with a negative dim_value (Paddle writes a dynamic dim as -1): free dims, as in
ONNX Runtime, for inputs, outputs and value_info."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from opcheck import ort_run

import transmuter
from transmuter import ir
from transmuter.cli import main
from transmuter.frontend import load_model


def _negative_dims_model() -> onnx.ModelProto:
    """x[-1, 3, -1, -1] -> Relu -> h (value_info [-1, 3, -1, -1]) -> ReduceMean -> y[-1, 3]."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"]),
            helper.make_node("ReduceMean", ["h"], ["y"], axes=[2, 3], keepdims=0),
        ],
        "paddle_style",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, -1, -1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [-1, 3, -1, -1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_negative_dim_values_load_as_free_dims():
    model_ir = load_model(_negative_dims_model())
    (x,) = model_ir.graph.inputs
    (y,) = model_ir.graph.outputs
    free = ir.SymbolicDim
    assert x.type.shape == (free("x_dim0"), 3, free("x_dim2"), free("x_dim3"))
    assert y.type.shape == (free("y_dim0"), 3)
    assert model_ir.graph.value_info["h"].type.shape == (
        free("h_dim0"),
        3,
        free("h_dim2"),
        free("h_dim3"),
    )


def test_negative_dims_accept_any_size_eager_and_compiled():
    proto = _negative_dims_model()
    model = transmuter.load(proto)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape).astype(np.float32) for shape in [(1, 3, 4, 5), (2, 3, 7, 2)]]
    compiled = transmuter.compile(model, {"x": xs[0]})
    for x in xs:
        (want,) = ort_run(proto, {"x": x})
        eager = transmuter.run(model, {"x": x})["y"]
        np.testing.assert_allclose(np.asarray(eager), want, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(compiled({"x": x})["y"]), want, rtol=1e-6)


def test_info_shows_negative_dims_as_open(tmp_path, capsys):
    path = tmp_path / "paddle_style.onnx"
    onnx.save(_negative_dims_model(), path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "x: tensor(float32)[?, 3, ?, ?]" in out
    assert "y: tensor(float32)[?, 3]" in out
