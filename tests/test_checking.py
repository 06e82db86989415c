"""transmuter.checking, shared by `transmuter check` and the coverage scripts: inputs made from
input specs and configs, the reference model and run, per-output differences, and the search for
the first diverging node. Small graphs built here and fixture models; nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import transmuter
from transmuter import checking
from transmuter.errors import TransmuterError
from transmuter.frontend import edit, load_model

FIXTURES = Path(__file__).parent / "fixtures" / "models"
SIZES = checking.DEFAULT_SIZES


def spec_model(inputs) -> onnx.ModelProto:
    """A graph with the given inputs (name, elem type, dims) and one Identity node."""
    values = [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs]
    nodes = [helper.make_node("Identity", [inputs[0][0]], ["out"])]
    out = [helper.make_tensor_value_info("out", inputs[0][1], None)]
    graph = helper.make_graph(nodes, "g", values, out)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def made(inputs, config=None, **kwargs) -> dict:
    return checking.example_inputs(load_model(spec_model(inputs)), config=config, **kwargs)


# ------------------------------------------------------------------------------------------------
# Inputs made from input specs and configs
# ------------------------------------------------------------------------------------------------


def test_inputs_of_an_optimum_style_decoder():
    inputs = made(
        [
            ("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
            ("attention_mask", TensorProto.INT64, ["batch_size", "past_sequence_length + 1"]),
            ("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
            (
                "past_key_values.0.key",
                TensorProto.FLOAT,
                ["batch_size", 2, "past_sequence_length", 4],
            ),
            ("use_cache_branch", TensorProto.BOOL, [1]),
        ],
        {"text_config": {"vocab_size": 7}},
        seed=1,
    )
    batch, sequence, past = SIZES["batch"], SIZES["sequence"], SIZES["past"]
    assert inputs["input_ids"].shape == (batch, sequence)
    assert inputs["input_ids"].max() < 7  # the vocabulary of the nested text config
    # The mask spans past + new tokens, whatever its dim is named.
    assert inputs["attention_mask"].shape == (batch, past + sequence)
    assert np.all(inputs["attention_mask"] == 1)
    assert inputs["position_ids"].tolist() == [list(range(past, past + sequence))]
    assert inputs["past_key_values.0.key"].shape == (batch, 2, past, 4)
    assert inputs["use_cache_branch"].tolist() == [past > 0]


def test_inputs_of_audio_and_image_models():
    audio = [
        (
            "input_features",
            TensorProto.FLOAT,
            ["batch_size", "feature_size", "encoder_sequence_length"],
        )
    ]
    got = made(audio, {"num_mel_bins": 128})
    assert got["input_features"].shape == (1, 128, SIZES["audio_frames"])
    assert made(audio)["input_features"].shape == (1, SIZES["mel_bins"], SIZES["audio_frames"])
    image = [("pixel_values", TensorProto.FLOAT, ["batch", "channels", "height", "width"])]
    got = made(image, {"vision_config": {"image_size": 32}})
    assert got["pixel_values"].shape == (1, 3, 32, 32)
    assert made(image, {"image_size": [16, 24]})["pixel_values"].shape == (1, 3, 16, 24)
    size = SIZES["image_size"]
    assert made(image)["pixel_values"].shape == (1, 3, size, size)


def test_vocabulary_size_read_from_the_embedding_table():
    graph = load_model(FIXTURES / "gpt2.onnx")
    assert checking.embedding_rows(graph.graph, "input_ids") == [256]
    ids = checking.example_inputs(graph)["input_ids"]
    assert SIZES["vocab"] <= ids.max() < 256  # the table's rows, not the fallback
    ids = checking.example_inputs(graph, config={"vocab_size": 5})["input_ids"]
    assert ids.max() < 5  # the smaller of config and table


def test_dims_and_given_inputs_carry_to_masks_and_positions():
    llama = load_model(FIXTURES / "llama.onnx")  # mask [batch, total_sequence]
    inputs = checking.example_inputs(llama, {"past_sequence": 2})
    assert inputs["attention_mask"].shape == (1, 2 + SIZES["sequence"])
    assert inputs["position_ids"].tolist() == [list(range(2, 2 + SIZES["sequence"]))]
    assert inputs["past_key_values.0.key"].shape == (1, 2, 2, 8)
    ids = np.array([[5, 6, 7]], np.int64)
    inputs = checking.example_inputs(llama, given={"input_ids": ids})
    assert inputs["input_ids"] is ids
    assert inputs["attention_mask"].shape == (1, 3) and inputs["position_ids"].tolist() == [
        [0, 1, 2]
    ]
    model = transmuter.load(FIXTURES / "gpt2.onnx")  # a loaded Model works as its IR does
    inputs = checking.example_inputs(model, {"sequence": 5, "batch": 2})
    assert list(inputs) == model.inputs
    assert inputs["input_ids"].shape == inputs["attention_mask"].shape == (2, 5)
    assert inputs["past_key_values.1.value"].shape == (2, 4, 0, 8)


def test_unnamed_dims_other_inputs_and_undeclared_shapes():
    inputs = made(
        [
            ("x", TensorProto.FLOAT, [None, 4]),  # the loader names the open dim "x_dim0"
            ("segment_ids", TensorProto.INT32, [None, None]),
            ("k", TensorProto.INT64, [1]),
            ("flag", TensorProto.BOOL, []),
        ]
    )
    assert inputs["x"].shape == (SIZES["batch"], 4)
    assert inputs["segment_ids"].shape == (SIZES["batch"], SIZES["sequence"])
    assert not inputs["segment_ids"].any() and inputs["k"].tolist() == [0]
    assert inputs["flag"].dtype == np.bool_ and inputs["flag"].shape == ()
    with pytest.raises(
        TransmuterError, match=r"'x' is tensor\(float32\)\[\?\]: give it explicitly"
    ):
        made([("x", TensorProto.FLOAT, None)])
    with pytest.raises(TransmuterError, match="cannot make example values of type"):
        made([("text", TensorProto.STRING, [2])])


# ------------------------------------------------------------------------------------------------
# Differences
# ------------------------------------------------------------------------------------------------


def test_differences_of_floats_integers_and_shapes():
    ref = np.array([1.0, -np.inf, np.nan, 4.0], np.float32)
    same = checking.difference("y", ref.copy(), ref, rtol=0, atol=0)
    assert same.ok and same.max_abs == 0.0  # equal infinities and NaN where the reference has NaN
    off = checking.difference("y", ref + np.float32([0, 0, 0, 0.04]), ref, rtol=1e-3, atol=1e-3)
    assert not off.ok and off.max_abs == pytest.approx(0.04)
    assert off.max_rel == pytest.approx(0.01)  # relative to the largest finite magnitude, 4
    nan = checking.difference("y", np.zeros(4, np.float32), ref, rtol=1, atol=1)
    assert not nan.ok and nan.detail == "NaN placement differs"
    ints = checking.difference("i", np.array([3, 5]), np.array([3, 2]), rtol=1, atol=1)
    assert not ints.ok and ints.max_abs == 3.0 and ints.detail == "1 of 2 elements differ"
    shape = checking.difference("s", np.zeros((2, 1)), np.zeros(2), rtol=1, atol=1)
    assert not shape.ok and shape.detail == "float64[2, 1] vs reference float64[2]"


# ------------------------------------------------------------------------------------------------
# The reference model and run
# ------------------------------------------------------------------------------------------------


def matmul_nbits_model(accuracy_level: int) -> onnx.ModelProto:
    """y = x @ dequantize(B): K 16, N 2, 4-bit blocks of 16, scale 1 and no zero point."""
    rng = np.random.default_rng(0)
    blob = onnx.numpy_helper.from_array(rng.integers(0, 256, (2, 1, 8), dtype=np.uint8), "B")
    scales = onnx.numpy_helper.from_array(np.ones(2, np.float32), "scales")
    node = helper.make_node(
        "MatMulNBits",
        ["x", "B", "scales"],
        ["y"],
        domain="com.microsoft",
        K=16,
        N=2,
        bits=4,
        block_size=16,
        accuracy_level=accuracy_level,
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [blob, scales],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def accuracy_levels(data: bytes) -> list[int]:
    proto = onnx.load_from_string(data)
    return [a.i for n in proto.graph.node for a in n.attribute if a.name == "accuracy_level"]


def test_reference_pins_matmulnbits_to_full_precision_and_lists_the_edit():
    proto = matmul_nbits_model(accuracy_level=4)
    assert edit.reference_edits(proto) == ["MatMulNBits accuracy_level -> 0 on 1 nodes"]
    prepared = edit.reference_model(proto)
    assert accuracy_levels(prepared.data) == [0] and prepared.data_dir is None
    assert accuracy_levels(proto.SerializeToString()) == [4]  # the caller's proto is left alone
    assert edit.reference_edits(prepared.data) == []
    assert edit.reference_edits(matmul_nbits_model(accuracy_level=0)) == []
    x = np.ones((1, 16), np.float32)
    outputs = checking.reference_outputs(proto, {"x": x})
    assert outputs["y"].shape == (1, 2)


def test_external_data_is_read_in_or_left_for_onnx_runtime(tmp_path, monkeypatch):
    weight = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [onnx.numpy_helper.from_array(weight, "w")],
    )
    path = tmp_path / "model" / "m.onnx"
    path.parent.mkdir()
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        path,
        save_as_external_data=True,
        location="m.data",
        size_threshold=0,
    )
    x = np.ones((1, 64), np.float32)
    monkeypatch.chdir(tmp_path)  # not the model's folder: the data is found by where it lies
    assert edit.reference_model(path).data_dir is None
    small = checking.reference_outputs(path, {"x": x})
    # A limit between the graph alone (a few hundred bytes) and graph + weights (16 KiB) makes
    # the model "too large": its data stays in its file and ONNX Runtime reads it from there.
    monkeypatch.setattr(edit, "PROTOBUF_LIMIT", 4096)
    assert edit.reference_model(path).data_dir == str(path.parent)
    large = checking.reference_outputs(path, {"x": x})
    np.testing.assert_allclose(large["y"], small["y"])
    np.testing.assert_allclose(small["y"], x @ weight, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# The first diverging node
# ------------------------------------------------------------------------------------------------


def test_first_divergence_searches_unseeded_random_graphs_with_a_key():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("RandomNormalLike", ["r"], ["noise"], name="draw"),
        helper.make_node("Add", ["r", "noise"], ["out"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "noise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = transmuter.load(proto)
    inputs = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}
    with pytest.raises(TransmuterError, match="has no seed attribute"):
        checking.first_divergence(model, proto, inputs)
    found = checking.first_divergence(model, proto, inputs, key=jax.random.key(0))
    assert (found.node, found.op_type, found.output) == ("draw", "RandomNormalLike", "noise")
    assert found.inputs == ("r",) and not found.difference.ok


def test_a_cache_head_size_the_inputs_do_not_give_is_asked_for():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["past_key_values.0.key"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info(
                "past_key_values.0.key",
                TensorProto.FLOAT,
                ["batch", 2, "past_sequence_length", "kv_cache_dim"],
            )
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = transmuter.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(transmuter.TransmuterError, match="--dim kv_cache_dim=SIZE"):
        checking.example_inputs(model)
    made = checking.example_inputs(model, config={"hidden_size": 64, "num_attention_heads": 4})
    assert made["past_key_values.0.key"].shape == (1, 2, 0, 16)
    made = checking.example_inputs(model, dims={"kv_cache_dim": 8})
    assert made["past_key_values.0.key"].shape == (1, 2, 0, 8)


def test_a_reference_failure_is_a_transmuter_error():
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = {"x": np.zeros(4, np.float32), "shape": np.array([3])}
    with pytest.raises(transmuter.TransmuterError, match="ONNX Runtime \\(the reference\\) failed"):
        checking.reference_outputs(proto, inputs)


# ------------------------------------------------------------------------------------------------
# Where ONNX Runtime's u8 x s8 kernels may saturate
# ------------------------------------------------------------------------------------------------


def int8_matmul_model(weight: np.ndarray, *, nested: bool = False) -> onnx.ModelProto:
    """x (float) -> DynamicQuantizeLinear -> MatMulInteger with `weight`, an initializer; in an
    If branch when `nested`."""
    matmul = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "scale", "zero"]),
        helper.make_node("MatMulInteger", ["q", "w", "zero"], ["y"], name="int8_matmul"),
    ]
    w = onnx.numpy_helper.from_array(weight, "w")
    out = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", weight.shape[0]])
    if not nested:
        graph = helper.make_graph(matmul, "g", [x], [out], [w])
    else:
        branch = helper.make_graph(matmul, "then", [], [out])
        zeros = np.zeros((1, weight.shape[1]), np.int32)
        other = helper.make_graph(
            [helper.make_node("Constant", [], ["y"], value=onnx.numpy_helper.from_array(zeros))],
            "else",
            [],
            [out],
        )
        cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
        node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)
        graph = helper.make_graph([node], "g", [x, cond], [out], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("nested", [False, True])
def test_u8_s8_products_that_can_pass_16_bits_are_named_without_vnni(nested):
    weight = np.array([[127, -128], [5, 3]], np.int8)
    model = load_model(int8_matmul_model(weight, nested=nested))
    (found,) = checking.reference_saturation(model, vnni=False)
    assert (found.node, found.op_type, found.inputs) == ("int8_matmul", "MatMulInteger", ("q", "w"))
    assert found.largest == 2 * 255 * 128
    assert checking.reference_saturation(model, vnni=True) == []


@pytest.mark.parametrize(
    "weight",
    [
        np.array([[64, -64], [-64, 64]], np.int8),  # 7-bit weights (reduce_range): 2*255*64 fits
        np.array([[255, 0], [0, 255]], np.uint8),  # u8 x u8 is exact on every CPU
    ],
)
def test_products_that_cannot_saturate_are_not_named(weight):
    model = load_model(int8_matmul_model(weight))
    assert checking.reference_saturation(model, vnni=False) == []


def test_saturation_follows_this_cpu_by_default(monkeypatch):
    model = load_model(int8_matmul_model(np.array([[127, -128]], np.int8).T))
    monkeypatch.setattr(transmuter.cpu, "has_vnni", lambda: False)
    assert [p.node for p in checking.reference_saturation(model)] == ["int8_matmul"]
    monkeypatch.setattr(transmuter.cpu, "has_vnni", lambda: True)
    assert checking.reference_saturation(model) == []
