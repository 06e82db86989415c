"""Invalid models that used to raise a foreign exception (MemoryError, IndexError, ValueError,
OverflowError) or load although ONNX Runtime refuses them (issue 18): each is a ModelLoadError
naming what is wrong. Big-endian inputs are converted to the native byte order."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import transmuter
from transmuter.errors import ModelLoadError
from transmuter.frontend import load_model


def _model(
    *,
    initializers=(),
    sparse=(),
    opsets=(("", 17),),
    node=("Identity", ["w"]),
) -> onnx.ModelProto:
    """y = op(w) with w an initializer (dense or sparse); no graph inputs."""
    op_type, inputs = node
    graph = helper.make_graph(
        [helper.make_node(op_type, inputs, ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=list(initializers),
        sparse_initializer=list(sparse),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    return model


def _ort_refuses(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return True
    return False


def _sparse(values, indices, index_dims, dims):
    vals = helper.make_tensor("w", TensorProto.FLOAT, [len(values)], values)
    idx = helper.make_tensor("w_indices", TensorProto.INT64, index_dims, indices)
    return helper.make_sparse_tensor(vals, idx, dims)


# Sparse initializers.


def test_sparse_initializer_loads_dense():
    sparse = _sparse([1.0, 2.0], [1, 5], [2], [2, 3])
    w = load_model(_model(sparse=[sparse])).graph.initializers["w"]
    np.testing.assert_array_equal(w, [[0, 1, 0], [0, 0, 2]])
    sparse = _sparse([1.0, 2.0], [0, 1, 1, 2], [2, 2], [2, 3])
    w = load_model(_model(sparse=[sparse])).graph.initializers["w"]
    np.testing.assert_array_equal(w, [[0, 1, 0], [0, 0, 2]])


def test_sparse_initializer_too_large_to_densify_is_refused_before_allocating():
    sparse = _sparse([1.0], [5], [1], [10**6, 10**6])
    with pytest.raises(ModelLoadError, match=r"'w' of shape \[1000000, 1000000\].*4,000,000,0"):
        load_model(_model(sparse=[sparse]))


@pytest.mark.parametrize(
    "indices, index_dims, detail",
    [
        ([50], [1], r"linearized index 50 is out of range \[0, 6\)"),
        ([-1], [1], r"linearized index -1 is out of range \[0, 6\)"),
        ([0, 3], [1, 2], r"index on axis 1 3 is out of range \[0, 3\)"),
        ([2, 0], [1, 2], r"index on axis 0 2 is out of range \[0, 2\)"),
    ],
)
def test_sparse_index_out_of_range_is_refused(indices, index_dims, detail):
    sparse = _sparse([1.0], indices, index_dims, [2, 3])
    with pytest.raises(ModelLoadError, match=r"sparse tensor 'w' of shape \[2, 3\]: " + detail):
        load_model(_model(sparse=[sparse]))


def test_sparse_indices_of_the_wrong_shape_or_type_are_refused():
    sparse = _sparse([1.0, 2.0], [1, 2, 3], [3], [2, 3])
    with pytest.raises(ModelLoadError, match=r"2 values need indices of shape \[2\]"):
        load_model(_model(sparse=[sparse]))
    sparse = _sparse([1.0], [1], [1], [2, 3])
    sparse.indices.data_type = TensorProto.FLOAT
    sparse.indices.ClearField("int64_data")
    sparse.indices.float_data[:] = [1.0]
    with pytest.raises(ModelLoadError, match="indices are float32, not integers"):
        load_model(_model(sparse=[sparse]))


def test_sparse_initializer_with_a_negative_dim_is_refused():
    sparse = _sparse([1.0], [0], [1], [2, 3])
    sparse.dims[:] = [-2, 3]
    with pytest.raises(ModelLoadError, match=r"tensor 'w' has a negative dim: dims \[-2, 3\]"):
        load_model(_model(sparse=[sparse]))


# Initializers with a negative dim.


@pytest.mark.parametrize("dims", [[-1], [-2, 0], [3, -1]])
def test_initializer_with_a_negative_dim_is_refused_as_by_onnx_runtime(dims):
    w = helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    w.dims[:] = dims
    model = _model(initializers=[w])
    assert _ort_refuses(model)
    with pytest.raises(ModelLoadError, match=rf"tensor 'w' has a negative dim: dims \{dims}"):
        load_model(model)


def test_constant_attribute_with_a_negative_dim_is_refused():
    value = helper.make_tensor("c", TensorProto.FLOAT, [1], [1.0])
    value.dims[:] = [-1]
    model = _model(node=("Constant", []))
    model.graph.node[0].attribute.append(helper.make_attribute("value", value))
    with pytest.raises(ModelLoadError, match="tensor 'c' has a negative dim"):
        load_model(model)


# Opset versions.


@pytest.mark.parametrize(
    "domain, version", [("", 99), ("", 0), ("ai.onnx", 29), ("ai.onnx.ml", 99)]
)
def test_opset_onnx_does_not_define_is_refused(domain, version):
    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    ml = domain == "ai.onnx.ml"
    opsets = (("", 17), (domain, version)) if ml else ((domain, version),)
    model = _model(initializers=[w], opsets=opsets)
    if version > 0:
        assert _ort_refuses(model)
    last = onnx.defs.onnx_ml_opset_version() if ml else onnx.defs.onnx_opset_version()
    name = domain or "ai.onnx"
    with pytest.raises(ModelLoadError, match=rf"opset {version} of {name}.*versions 1\.\.{last}"):
        load_model(model)


def test_newest_known_opset_and_custom_domains_load():
    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    newest = onnx.defs.onnx_opset_version()
    model = _model(initializers=[w], opsets=(("", newest), ("my.custom", 99)))
    assert load_model(model).opsets == {"": newest, "my.custom": 99}


# External data fields.


def _external_model(tmp_path, **fields) -> str:
    np.arange(4, dtype=np.float32).tofile(tmp_path / "w.bin")
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [0.0, 0.0])
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "w.bin", **fields}.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    path = tmp_path / "model.onnx"
    path.write_bytes(_model(initializers=[w]).SerializeToString())
    return str(path)


def test_external_data_offset_and_length_are_read(tmp_path):
    w = load_model(_external_model(tmp_path, offset="8", length="8")).graph.initializers["w"]
    np.testing.assert_array_equal(w, [2.0, 3.0])


@pytest.mark.parametrize("field", ["offset", "length"])
@pytest.mark.parametrize("value", ["abc", "-4", "4.5", "", " 8", "0x8", "1_0"])
def test_external_data_field_that_is_not_a_byte_count_is_refused(tmp_path, field, value):
    path = _external_model(tmp_path, **{field: value})
    with pytest.raises(ModelLoadError, match=rf"tensor 'w': external data {field} '.*' is not a"):
        load_model(path)


def test_external_data_past_the_end_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="holds fewer bytes"):
        load_model(_external_model(tmp_path, offset="12"))
    with pytest.raises(ModelLoadError, match="holds fewer bytes"):
        load_model(_external_model(tmp_path, offset="99999999999999999999999"))


# Inputs in a non-native byte order.


def _add_one_model(elem_type) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", elem_type, [3])],
        [helper.make_tensor_value_info("y", elem_type, [3])],
        initializer=[helper.make_tensor("one", elem_type, [], [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(
    "elem_type, dtype",
    [(TensorProto.INT64, ">i8"), (TensorProto.FLOAT, ">f4"), (TensorProto.INT32, ">i4")],
)
def test_big_endian_input_is_converted(elem_type, dtype):
    model = transmuter.load(_add_one_model(elem_type))
    x = np.array([1, 2, 2**20], dtype=dtype)
    assert not x.dtype.isnative
    y = np.asarray(transmuter.run(model, {"x": x})["y"])
    assert y.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(y, [2, 3, 2**20 + 1])
    compiled = transmuter.compile(model, {"x": x})
    np.testing.assert_array_equal(np.asarray(compiled({"x": x})["y"]), [2, 3, 2**20 + 1])


def test_big_endian_input_of_another_type_names_the_type():
    model = transmuter.load(_add_one_model(TensorProto.INT64))
    with pytest.raises(transmuter.InputError, match="got float32.*cast it to int64"):
        transmuter.run(model, {"x": np.zeros(3, ">f4")})


# Found by tests/fuzz: bytes flipped into names and strings.


def _with_byte_flipped_in(model: onnx.ModelProto, text: bytes) -> bytes:
    data = bytearray(model.SerializeToString())
    data[data.index(text)] = 0xFF
    return bytes(data)


def test_name_that_is_not_utf8_is_refused():
    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    model = _model(initializers=[w], node=("Identity", ["w_name_in_node"]))
    model.graph.initializer[0].name = "w_name_in_node"
    data = _with_byte_flipped_in(model, b"w_name_in_node")  # the node input comes first
    with pytest.raises(ModelLoadError, match=r"NodeProto.input b.\\xff_name_in_node. is not UTF"):
        load_model(data)


def test_string_attribute_that_is_not_utf8_is_refused():
    model = _model(node=("Cast", ["w"]))
    model.graph.node[0].name = "cast"
    model.graph.node[0].attribute.append(helper.make_attribute("mode", "marker"))
    data = _with_byte_flipped_in(model, b"marker")
    with pytest.raises(ModelLoadError, match="node 'cast' .Cast. attribute 'mode' is not UTF-8"):
        load_model(data)


@pytest.mark.parametrize(
    "location, detail",
    [("w.bin\x00x", "holds a NUL byte"), ("x" * 5000, "cannot read external data")],
)
def test_external_data_location_the_os_cannot_open_is_refused(tmp_path, location, detail):
    with pytest.raises(ModelLoadError, match=f"tensor 'w': .*{detail}"):
        load_model(_external_model(tmp_path, location=location))


def test_declared_element_type_onnx_does_not_define_is_refused():
    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    model = _model(initializers=[w])
    model.graph.output[0].type.tensor_type.elem_type = 39
    with pytest.raises(ModelLoadError, match="declared type of 'y': ONNX element type 39"):
        load_model(model)
