"""`transmuter.load(..., compute_type=...)`: a graph's float tensors computed in another type,
with the file's declared input and output types kept."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from opcheck import ort_run

import transmuter

RNG = np.random.default_rng(0)


def _mlp(dtype: int, np_dtype) -> onnx.ModelProto:
    """x -> MatMul -> Add -> Softmax -> y, plus a float32 side output through a Cast and a
    Constant(value_float), as fp16 exports keep some reductions in float32."""
    w = onnx.numpy_helper.from_array((RNG.standard_normal((8, 6)) / 3).astype(np_dtype), "w")
    b = onnx.numpy_helper.from_array(RNG.standard_normal(6).astype(np_dtype), "b")
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Softmax", ["a"], ["y"], axis=-1),
        helper.make_node("Cast", ["a"], ["a32"], to=T.FLOAT),
        helper.make_node("Constant", [], ["two"], value_float=2.0),
        helper.make_node("Mul", ["a32", "two"], ["a2"]),
        helper.make_node("ReduceSum", ["a2", "axes"], ["s"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", dtype, ["batch", 8])],
        [
            helper.make_tensor_value_info("y", dtype, ["batch", 6]),
            helper.make_tensor_value_info("s", T.FLOAT, ["batch"]),
        ],
        [w, b, axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph stored in float32 (what compute_type="float32" should compute)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        if init.data_type == T.FLOAT16:
            init.CopyFrom(
                onnx.numpy_helper.from_array(
                    onnx.numpy_helper.to_array(init).astype(np.float32), init.name
                )
            )
    for value in list(out.graph.input) + list(out.graph.output):
        if value.type.tensor_type.elem_type == T.FLOAT16:
            value.type.tensor_type.elem_type = T.FLOAT
    return out


def test_float16_graph_in_float32_keeps_the_declared_interface():
    fp16 = _mlp(T.FLOAT16, np.float16)
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    model = transmuter.load(fp16, compute_type="float32")
    assert model.input_specs["x"].dtype == np.float16
    assert all(v.dtype == np.float32 for v in model.host_constants.values() if v.dtype.kind == "f")

    got = transmuter.run(model, {"x": x})
    compiled = transmuter.compile(model, {"x": x})({"x": x})
    want_y, want_s = ort_run(_as_float32(fp16), {"x": x.astype(np.float32)})
    for out in (got, compiled):
        assert out["y"].dtype == np.float16 and out["s"].dtype == np.float32
        # Only the final rounding to float16 separates y from the float32 computation.
        np.testing.assert_allclose(np.asarray(out["y"], np.float32), want_y, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(np.asarray(out["s"]), want_s, rtol=1e-5, atol=1e-5)


def test_float16_graph_as_stored_is_close_to_onnx_runtime():
    fp16 = _mlp(T.FLOAT16, np.float16)
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    got = transmuter.run(transmuter.load(fp16), {"x": x})
    want_y, want_s = ort_run(fp16, {"x": x})
    assert got["y"].dtype == np.float16
    np.testing.assert_allclose(np.asarray(got["y"], np.float32), want_y, rtol=1e-2, atol=1e-3)
    np.testing.assert_allclose(np.asarray(got["s"]), want_s, rtol=1e-2, atol=1e-2)


def test_float32_graph_in_bfloat16():
    fp32 = _mlp(T.FLOAT, np.float32)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    model = transmuter.load(fp32, trainable=True, compute_type="bfloat16")
    assert {p.dtype for p in model.params.values()} == {np.dtype(jnp.bfloat16)}
    got = transmuter.compile(model, {"x": x})({"x": x})
    want_y, want_s = ort_run(fp32, {"x": x})
    assert got["y"].dtype == np.float32 and got["s"].dtype == np.float32
    # bfloat16 keeps 8 significant bits: weights, inputs and every intermediate are rounded
    # to about 0.4 %, so a few roundings deep the results agree to a few percent.
    np.testing.assert_allclose(np.asarray(got["y"]), want_y, rtol=5e-2, atol=1e-2)
    np.testing.assert_allclose(np.asarray(got["s"]), want_s, rtol=5e-2, atol=5e-2)


def test_subgraphs_and_dtype_attributes_are_rewritten():
    then_c = onnx.numpy_helper.from_array(np.array([1.5], np.float16), "tc")
    then_g = helper.make_graph(
        [helper.make_node("Add", ["x", "tc"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", T.FLOAT16, [2])],
        [then_c],
    )
    else_g = helper.make_graph(
        [
            helper.make_node("EyeLike", ["x2"], ["eye"], dtype=T.FLOAT16),
            helper.make_node("ReduceSum", ["eye"], ["e"], keepdims=0),
            helper.make_node("Expand", ["e", "shape"], ["t2"]),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("t2", T.FLOAT16, [2])],
    )
    nodes = [
        helper.make_node("Reshape", ["x", "shape2"], ["x2"]),
        helper.make_node("If", ["cond"], ["out"], then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("cond", T.BOOL, []),
            helper.make_tensor_value_info("x", T.FLOAT16, [2]),
        ],
        [
            helper.make_tensor_value_info("out", T.FLOAT16, [2]),
            helper.make_tensor_value_info("x", T.FLOAT16, [2]),
        ],
        [
            onnx.numpy_helper.from_array(np.array([2], np.int64), "shape"),
            onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "shape2"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = transmuter.load(proto, compute_type="float32")
    eye = next(n for n in model.ir.graph.nodes if n.op_type == "If").attrs["else_branch"].nodes[0]
    assert eye.attrs["dtype"] == T.FLOAT
    x = np.array([0.25, 2.0], np.float16)
    for cond, want in ((True, [1.75, 3.5]), (False, [1.0, 1.0])):
        out = transmuter.run(model, {"cond": np.array(cond), "x": x})
        assert out["out"].dtype == np.float16
        np.testing.assert_array_equal(np.asarray(out["out"], np.float32), want)
        # An input passed through as an output keeps its declared type and value.
        np.testing.assert_array_equal(np.asarray(out["x"]), x)


def test_float64_and_int_tensors_are_left_alone():
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=T.DOUBLE)],
        "g",
        [helper.make_tensor_value_info("x", T.INT32, [2])],
        [helper.make_tensor_value_info("y", T.DOUBLE, [2])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = transmuter.run(
        transmuter.load(proto, compute_type="bfloat16"), {"x": np.array([1, 2], np.int32)}
    )
    assert out["y"].dtype == np.float64


@pytest.mark.parametrize("bad", ["int8", "float64", "fp16"])
def test_unknown_compute_type_is_an_error(bad):
    with pytest.raises(transmuter.TransmuterError, match="compute_type must be"):
        transmuter.load(_mlp(T.FLOAT, np.float32), compute_type=bad)


def test_bfloat16_inputs_are_cast_at_the_boundary():
    model = transmuter.load(_mlp(T.BFLOAT16, ml_dtypes.bfloat16), compute_type="float32")
    x = RNG.standard_normal((2, 8)).astype(ml_dtypes.bfloat16)
    out = transmuter.run(model, {"x": x})
    assert out["y"].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out["y"], np.float32).sum(axis=1), 1.0, rtol=1e-2)
