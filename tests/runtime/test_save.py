"""transmuter.save: new weights written over the source model's initializers, everything else
kept; checks of names, dtypes and shapes; external data asked for, automatic, and in the source."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from opcheck import ort_run

import transmuter
from transmuter.frontend import saver


def mlp(rng, hidden: int = 300) -> onnx.ModelProto:
    """y = relu(x @ W + b) * scale, with metadata, doc strings and a value_info to keep."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul", doc_string="the weights"),
        helper.make_node("Add", ["xw", "b"], ["xwb"], name="add"),
        helper.make_node("Relu", ["xwb"], ["act"], name="relu"),
        helper.make_node("Mul", ["act", "scale"], ["y"], name="mul"),
    ]
    weights = numpy_helper.from_array(rng.standard_normal((4, hidden)).astype(np.float32), "W")
    weights.doc_string = "first layer"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", hidden])],
        [
            weights,
            numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b"),
            numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
        ],
        value_info=[helper.make_tensor_value_info("act", TensorProto.FLOAT, ["batch", hidden])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.producer_name = "test"
    helper.set_model_props(model, {"author": "transmuter tests"})
    return model


@pytest.fixture
def proto(rng):
    return mlp(rng)


@pytest.fixture
def x(rng):
    return rng.standard_normal((3, 4)).astype(np.float32)


def changed(params):
    return {name: value * 2 + 1 for name, value in params.items()}


def initializers(path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def without_initializers(model: onnx.ModelProto) -> bytes:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.initializer[:]
    return copy.SerializeToString(deterministic=True)


def test_saved_model_has_the_new_weights_and_everything_else(proto, x, tmp_path):
    source = tmp_path / "mlp.onnx"
    onnx.save(proto, source)
    model = transmuter.load(source, trainable=True)
    params = changed(model.params)
    target = tmp_path / "tuned.onnx"
    transmuter.save(model, target, params=params)

    saved = onnx.load(target)
    assert without_initializers(saved) == without_initializers(proto)
    assert [t.name for t in saved.graph.initializer] == ["W", "b", "scale"]
    assert saved.graph.initializer[0].doc_string == "first layer"
    for name, value in initializers(target).items():
        np.testing.assert_array_equal(value, params[name])
    expected = transmuter.run(model, {"x": x}, params=params)["y"]
    np.testing.assert_allclose(ort_run(saved, {"x": x})[0], expected, rtol=1e-6, atol=1e-6)
    reloaded = transmuter.load(target)
    np.testing.assert_array_equal(transmuter.run(reloaded, {"x": x})["y"], expected)


def test_a_subset_of_params_and_the_default(proto, tmp_path):
    model = transmuter.load(proto, trainable=True)
    transmuter.save(model, tmp_path / "w_only.onnx", params={"W": model.params["W"] + 1})
    values = initializers(tmp_path / "w_only.onnx")
    np.testing.assert_array_equal(values["W"], model.params["W"] + 1)
    np.testing.assert_array_equal(values["b"], numpy_helper.to_array(proto.graph.initializer[1]))
    transmuter.save(model, tmp_path / "same.onnx")  # params default to model.params
    assert onnx.load(tmp_path / "same.onnx") == proto


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"W": np.zeros((4, 300), np.float64)}, r"'W' is float64\[4, 300\] .* float32\[4, 300\]"),
        ({"b": np.zeros((299,), np.float32)}, r"'b' is float32\[299\] .* float32\[300\]"),
        ({"W2": np.zeros((4, 300), np.float32)}, r"not initializers .*\['W2'\]"),
    ],
)
def test_params_must_match_the_initializers(proto, tmp_path, params, message):
    model = transmuter.load(proto)
    with pytest.raises(transmuter.InputError, match=message):
        transmuter.save(model, tmp_path / "bad.onnx", params=params)
    assert not list(tmp_path.iterdir())  # nothing written


def test_external_data_when_asked(proto, x, tmp_path):
    model = transmuter.load(proto, trainable=True)
    params = changed(model.params)
    transmuter.save(model, tmp_path / "big.onnx", params=params, external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "big.onnx_data"]
    stored = onnx.load(tmp_path / "big.onnx", load_external_data=False)
    external = {t.name for t in stored.graph.initializer if t.data_location == 1}
    assert external == {"W", "b"}  # tensors under 1 KB stay in the model file
    reloaded = transmuter.load(tmp_path / "big.onnx")
    np.testing.assert_array_equal(
        transmuter.run(reloaded, {"x": x})["y"],
        transmuter.run(model, {"x": x}, params=params)["y"],
    )


def test_external_data_is_automatic_past_the_limit(proto, tmp_path, monkeypatch):
    model = transmuter.load(proto)
    monkeypatch.setattr(saver, "INLINE_LIMIT", 4000)  # W alone takes 4800 bytes
    transmuter.save(model, tmp_path / "auto.onnx")
    assert (tmp_path / "auto.onnx_data").is_file()
    with pytest.raises(transmuter.TransmuterError, match="external_data=True"):
        transmuter.save(model, tmp_path / "inline.onnx", external_data=False)


def test_source_with_external_data_saved_elsewhere_is_self_contained(proto, x, tmp_path):
    folder = tmp_path / "source"
    folder.mkdir()
    onnx.save(proto, folder / "m.onnx", save_as_external_data=True, location="m.bin")
    model = transmuter.load(folder / "m.onnx")
    target = tmp_path / "copy.onnx"
    transmuter.save(model, target, params={"b": model.params["b"] + 1})
    assert not (tmp_path / "copy.onnx_data").exists()
    saved = onnx.load(target)
    expected = transmuter.run(model, {"x": x}, params={**model.params, "b": model.params["b"] + 1})
    np.testing.assert_allclose(ort_run(saved, {"x": x})[0], expected["y"], rtol=1e-6)


def test_saving_over_the_source_twice_then_a_changed_source_is_refused(proto, x, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(proto, path, save_as_external_data=True, location="m.onnx_data")
    model = transmuter.load(path, trainable=True)
    before = transmuter.run(model, {"x": x})["y"]
    for step in (1, 2):
        params = {name: value + step for name, value in model.params.items()}
        transmuter.save(model, path, params=params, external_data=True)
        np.testing.assert_array_equal(initializers(path)["W"], params["W"])
    # The loaded model still reads its original weights from the replaced files.
    np.testing.assert_array_equal(transmuter.run(model, {"x": x})["y"], before)
    onnx.save(mlp(np.random.default_rng(1), hidden=8), path)
    with pytest.raises(transmuter.ModelLoadError, match="changed or was removed since"):
        transmuter.save(model, tmp_path / "other.onnx")


def test_source_linked_into_a_store_like_a_hub_cache(proto, x, tmp_path):
    """The model and its data are links into a store under other names (as in the Hugging Face
    cache), and a Constant node keeps its tensor in the data file too."""
    constant = helper.make_node(
        "Constant", [], ["shift"], value=numpy_helper.from_array(np.full(300, 0.25, np.float32))
    )
    proto.graph.node.insert(0, constant)
    proto.graph.node.append(helper.make_node("Add", ["y", "shift"], ["z"]))
    proto.graph.output[0].name = "z"
    expected = ort_run(proto, {"x": x})[0]
    store, snapshot = tmp_path / "blobs", tmp_path / "snapshot"
    store.mkdir()
    snapshot.mkdir()
    onnx.save(
        proto,
        store / "m.onnx",
        save_as_external_data=True,
        location="m.onnx_data",
        convert_attribute=True,
    )
    os.rename(store / "m.onnx_data", store / "blob1")
    os.symlink(store / "m.onnx", snapshot / "m.onnx")
    os.symlink(store / "blob1", snapshot / "m.onnx_data")
    model = transmuter.load(snapshot / "m.onnx")
    transmuter.save(model, tmp_path / "out.onnx")
    saved = onnx.load(tmp_path / "out.onnx")
    np.testing.assert_allclose(ort_run(saved, {"x": x})[0], expected, rtol=1e-6)


def test_bytes_and_model_proto_sources(proto, tmp_path):
    original = proto.SerializeToString()
    for source in (proto, original):
        model = transmuter.load(source, trainable=True)
        transmuter.save(model, tmp_path / "out.onnx", params=changed(model.params))
        np.testing.assert_array_equal(
            initializers(tmp_path / "out.onnx")["scale"], changed(model.params)["scale"]
        )
    assert proto.SerializeToString() == original  # the caller's ModelProto is left alone


def test_a_replaced_sparse_initializer_is_written_dense(rng, tmp_path):
    dense = np.zeros((4, 6), np.float32)
    dense[1, 2], dense[3, 5] = 1.5, -2.0
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "W"),
        numpy_helper.from_array(np.array([8, 23], np.int64), "W_indices"),
        [4, 6],
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6])],
        sparse_initializer=[sparse],
    )
    model = transmuter.load(helper.make_model(graph), trainable=True)
    np.testing.assert_array_equal(model.params["W"], dense)
    transmuter.save(model, tmp_path / "dense.onnx", params={"W": model.params["W"] + 1})
    saved = onnx.load(tmp_path / "dense.onnx")
    assert not saved.graph.sparse_initializer
    np.testing.assert_array_equal(initializers(tmp_path / "dense.onnx")["W"], dense + 1)


def test_a_model_not_made_by_load_cannot_be_saved(proto, tmp_path):
    model = transmuter.Model(transmuter.load(proto).ir)
    with pytest.raises(transmuter.TransmuterError, match="not made by transmuter.load"):
        transmuter.save(model, os.fspath(tmp_path / "none.onnx"))
