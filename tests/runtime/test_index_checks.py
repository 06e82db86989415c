"""Token ids out of range: host-checked model inputs (InputError), one wrap on the device, and
compile(..., checks=True) for indices computed in the graph (issue 18, item 2)."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import transmuter
from transmuter import InputError, NodeError

V, D = 10, 4
TABLE = np.arange(V * D, dtype=np.float32).reshape(V, D)
BERT = pathlib.Path(__file__).parents[1] / "fixtures" / "models" / "bert.onnx"


def _embedding_model(extra_nodes=(), ids_to="ids2") -> onnx.ModelProto:
    """ids [B, S] int64 -> Unsqueeze -> Reshape -> Gather(table [V, D]); type ids [B, S] ->
    Gather(type table [2, D]); the sum."""
    nodes = [
        helper.make_node("Unsqueeze", ["ids", "axes"], ["ids1"]),
        helper.make_node("Reshape", ["ids1", "shape"], ["ids2"]),
        *extra_nodes,
        helper.make_node("Gather", ["table", ids_to], ["rows"]),
        helper.make_node("Gather", ["types", "type_ids"], ["type_rows"]),
        helper.make_node("Add", ["rows", "type_rows"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "embedding",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("type_ids", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(TABLE, "table"),
            numpy_helper.from_array(
                np.array([100.0, 200.0] * D, np.float32).reshape(2, D), "types"
            ),
            numpy_helper.from_array(np.array([0], np.int64), "axes"),
            numpy_helper.from_array(np.array([2, -1], np.int64), "shape"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(proto, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _feeds(ids, types=None):
    ids = np.array(ids, np.int64).reshape(2, -1)
    types = np.zeros_like(ids) if types is None else np.array(types, np.int64).reshape(ids.shape)
    return {"ids": ids, "type_ids": types}


VALID = _feeds([[0, 9, -1, -10], [3, -3, 5, 1]], [[0, 1, -1, -2], [1, 0, 0, 1]])


def test_valid_ids_including_negative_match_onnx_runtime():
    proto = _embedding_model()
    model = transmuter.load(proto.SerializeToString())
    (want,) = _ort(proto, VALID)
    np.testing.assert_array_equal(np.asarray(transmuter.run(model, VALID)["y"]), want)
    compiled = transmuter.compile(model, VALID)
    np.testing.assert_array_equal(np.asarray(compiled(VALID)["y"]), want)


@pytest.mark.parametrize(
    ("ids", "bad", "where"),
    [
        ([[0, 1, 2, 3], [4, 5, V, 7]], V, [1, 2]),  # ids >= V
        ([[0, 1, 2, 3], [4, 5, 6, 99]], 99, [1, 3]),
        ([[0, -V - 1, 2, 3], [4, 5, 6, 7]], -V - 1, [0, 1]),  # [-2V, -V-1]: once wrapped twice
        ([[0, 1, 2, -2 * V], [4, 5, 6, 7]], -2 * V, [0, 3]),
        ([[0, 1, 2, 3], [4, 5, 6, -1000]], -1000, [1, 3]),  # below -2V
    ],
)
def test_bad_ids_raise_in_run_and_compiled_call(ids, bad, where):
    proto = _embedding_model()
    model = transmuter.load(proto.SerializeToString())
    compiled = transmuter.compile(model, VALID)
    feeds = _feeds(ids)
    with pytest.raises(Exception, match="out of"):  # ONNX Runtime rejects them too
        _ort(proto, feeds)
    message = rf"'ids' holds {bad} at \{where}, outside the valid range \[-{V}, {V - 1}\].*'table'"
    with pytest.raises(InputError, match=message):
        transmuter.run(model, feeds)
    with pytest.raises(InputError, match=message):
        compiled(feeds)


def test_bad_ids_raise_at_a_cached_signature_too():
    """A second signature's calls take the hot path once compiled: the ranges are still read."""
    model = transmuter.load(_embedding_model().SerializeToString())
    compiled = transmuter.compile(model, VALID)
    other = _feeds([[0, 1, 2], [3, 4, 5]])
    want = np.asarray(compiled(other)["y"])
    np.testing.assert_array_equal(np.asarray(compiled(other)["y"]), want)
    with pytest.raises(InputError, match=r"'ids' holds 10 at \[1, 2\]"):
        compiled(_feeds([[0, 1, 2], [3, 4, V]]))


@pytest.mark.parametrize("bad", [2, -3, 7])
def test_bad_token_type_ids_raise(bad):
    model = transmuter.load(_embedding_model().SerializeToString())
    feeds = _feeds([[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 1, 0, 1], [0, bad, 0, 0]])
    with pytest.raises(InputError, match=rf"'type_ids' holds {bad} at \[1, 1\].*\[-2, 1\]"):
        transmuter.run(model, feeds)


def test_traced_inputs_are_not_checked_and_device_indices_clamp_once():
    import jax

    model = transmuter.load(_embedding_model().SerializeToString())
    feeds = _feeds([[V, 99, -V - 1, -2 * V], [-1000, 0, -1, 9]])
    with jax.enable_x64(True):  # int64 inputs in the caller's own trace
        y = np.asarray(jax.jit(lambda f: transmuter.run(model, f)["y"])(feeds))
    # One wrap, then XLA's clamp: >= V reads the last row, < -V the first; never a NaN.
    expect = TABLE[[V - 1, V - 1, 0, 0, 0, 0, V - 1, 9]].reshape(2, 4, D) + [100.0, 200.0] * 2
    np.testing.assert_array_equal(y, expect)


def _computed_index_model() -> onnx.ModelProto:
    """The Gather's indices are computed in the graph (ids + 100): no input check sees them."""
    offset = helper.make_node("Add", ["ids2", "hundred"], ["shifted"])
    proto = _embedding_model([offset], ids_to="shifted")
    proto.graph.initializer.append(numpy_helper.from_array(np.array(100, np.int64), "hundred"))
    return proto


def test_checks_true_catches_an_index_computed_in_the_graph():
    model = transmuter.load(_computed_index_model().SerializeToString())
    feeds = _feeds([[-100, -99, -98, -91], [-95, -94, -93, -92]])  # in range after + 100
    plain = transmuter.compile(model, feeds)
    checked = transmuter.compile(model, feeds, checks=True)
    np.testing.assert_array_equal(np.asarray(checked(feeds)["y"]), np.asarray(plain(feeds)["y"]))
    bad = _feeds([[0, -99, -98, -91], [-95, -94, -93, -92]])  # 0 + 100 is past the table
    with pytest.raises(NodeError, match="index 100 is out of bounds.*'Gather->rows'"):
        checked(bad)
    # Without checks the index clamps to the last row (the documented default).
    y = np.asarray(plain(bad)["y"])
    np.testing.assert_array_equal(y[0, 0], TABLE[V - 1] + [100.0, 200.0] * 2)


def _embed_layer_norm_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    hidden, sequence = 8, 4
    tables = {
        "word": rng.standard_normal((V, hidden)).astype(np.float32),
        "position": rng.standard_normal((sequence, hidden)).astype(np.float32),
        "segment": rng.standard_normal((2, hidden)).astype(np.float32),
        "gamma": np.ones(hidden, np.float32),
        "beta": np.zeros(hidden, np.float32),
    }
    node = helper.make_node(
        "EmbedLayerNormalization",
        ["ids", "type_ids", "word", "position", "segment", "gamma", "beta"],
        ["y", "mask_index"],
        domain="com.microsoft",
    )
    graph = helper.make_graph(
        [node],
        "embed",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT32, [2, sequence]),
            helper.make_tensor_value_info("type_ids", TensorProto.INT32, [2, sequence]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("mask_index", TensorProto.INT32, None),
        ],
        [numpy_helper.from_array(v, k) for k, v in tables.items()],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )


def test_embed_layer_normalization_ids_are_checked():
    proto = _embed_layer_norm_model()
    model = transmuter.load(proto.SerializeToString())
    good = {"ids": np.array([[1, 2, 3, 9], [0, 4, 5, 6]], np.int32)}
    good["type_ids"] = np.array([[0, 1, 0, 1], [1, 1, 0, 0]], np.int32)
    (want, _) = _ort(proto, good)
    np.testing.assert_allclose(np.asarray(transmuter.run(model, good)["y"]), want, atol=1e-5)
    for name, bad, message in [
        ("ids", V, rf"'ids' holds {V} at \[0, 3\], outside the valid range \[0, {V - 1}\]"),
        ("ids", -1, r"'ids' holds -1 at \[0, 3\], outside the valid range \[0, 9\]"),
        ("type_ids", 2, r"'type_ids' holds 2 at \[0, 3\].*\[0, 1\].*'segment'"),
    ]:
        feeds = {k: v.copy() for k, v in good.items()}
        feeds[name][0, 3] = bad
        with pytest.raises(Exception, match="out of"):  # ORT rejects them, negative ids too
            _ort(proto, feeds)
        with pytest.raises(InputError, match=message):
            transmuter.run(model, feeds)


@pytest.mark.slow
def test_bert_fixture_rejects_a_bad_token_id():
    model = transmuter.load(BERT)
    rows = model.ir.graph.initializers["model.embeddings.word_embeddings.weight"].shape[0]
    ids = np.arange(16, dtype=np.int64).reshape(2, 8) % rows
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids * 0}
    compiled = transmuter.compile(model, feeds)
    bad = dict(feeds, input_ids=np.where(ids == 5, rows, ids))
    message = rf"'input_ids' holds {rows} at \[0, 5\], outside the valid range \[-{rows}, "
    with pytest.raises(InputError, match=message):
        compiled(bad)
    with pytest.raises(InputError, match=message):
        transmuter.run(model, bad)
    with pytest.raises(InputError, match="'token_type_ids' holds 2"):
        compiled(dict(feeds, token_type_ids=ids * 0 + 2))
    assert np.isfinite(np.asarray(compiled(feeds)[model.outputs[0]])).all()
