"""TransmuterBackend as a user of onnx.backend.base sees it: inputs as a list or a dict, outputs
as a list in graph order, one CompiledModel per prepared model, run_node, devices."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from transmuter import CompiledModel, InputError
from transmuter.backend import TransmuterBackend


def _two_outputs() -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Shape", ["a"], ["shape"]),
        ],
        "two_outputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n"]),
        ],
        [
            helper.make_tensor_value_info("shape", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["n"]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_list_and_dict_inputs_give_outputs_in_graph_order():
    rep = TransmuterBackend.prepare(_two_outputs())
    a, b = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    for inputs in ([a, b], {"b": b, "a": a}):
        shape, total = rep.run(inputs)
        assert isinstance(shape, np.ndarray) and shape.dtype == np.int64
        np.testing.assert_array_equal(shape, [3])
        np.testing.assert_array_equal(total, a + b)


def test_the_rep_compiles_once_and_keeps_the_compiled_model():
    rep = TransmuterBackend.prepare(_two_outputs())
    assert rep.compiled is None
    rep.run([np.zeros(2, np.float32), np.zeros(2, np.float32)])
    compiled = rep.compiled
    assert isinstance(compiled, CompiledModel)
    shape, _ = rep.run([np.zeros(5, np.float32), np.zeros(5, np.float32)])  # a new shape
    assert rep.compiled is compiled
    np.testing.assert_array_equal(shape, [5])


def test_too_many_inputs_is_an_input_error():
    rep = TransmuterBackend.prepare(_two_outputs())
    x = np.zeros(2, np.float32)
    with pytest.raises(InputError, match="3 inputs given"):
        rep.run([x, x, x])


def test_run_node_builds_a_one_node_model_at_the_given_opset():
    node = helper.make_node("Softmax", ["x"], ["y"], axis=0)
    x = np.array([[1.0, 2.0], [3.0, 5.0]], np.float32)
    (y,) = TransmuterBackend.run_node(node, [x], opset_version=11)
    # Softmax-11 flattens to 2-D at `axis`: axis=0 normalizes over every element.
    np.testing.assert_allclose(y, np.exp(x) / np.exp(x).sum(), rtol=1e-6)
    (y,) = TransmuterBackend.run_node(node, [x], opset_version=13)
    np.testing.assert_allclose(y, np.exp(x) / np.exp(x).sum(0), rtol=1e-6)


def test_sequences_come_back_as_lists_and_strings_as_object_arrays():
    graph = helper.make_graph(
        [
            helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0),
            helper.make_node("Identity", ["s"], ["s_out"]),
        ],
        "values",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2]),
            helper.make_tensor_value_info("s", TensorProto.STRING, [2]),
        ],
        [
            helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("s_out", TensorProto.STRING, [2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    s = np.array(["a", "bc"], dtype=object)
    parts, strings = TransmuterBackend.run_model(model, [x, s])
    assert isinstance(parts, list) and len(parts) == 2
    np.testing.assert_array_equal(parts[1], x[1:])
    assert strings.dtype == object and strings.tolist() == ["a", "bc"]


def test_devices():
    assert TransmuterBackend.supports_device("CPU")
    assert not TransmuterBackend.supports_device("CUDA:99")
