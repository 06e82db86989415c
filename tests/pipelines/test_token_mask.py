"""`mask_padded_tokens` on the class of graph it is for: a duration-predicting speech graph that
takes its token count from the ids' shape and masks nothing (kokoro-onnx's int8 Kokoro: an
attention mask of ones built from the ids' shape, LSTMs without sequence_lens, integer
convolutions behind dynamic quantizers). Built here at toy size; the real file's check is
tests/models/test_kokoro_real.py."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import transmuter
from transmuter.frontend.graph_edits import DURATIONS_OUTPUT, TOKEN_COUNT_INPUT, load_speech_model

VOCAB, WIDTH, HIDDEN = 16, 8, 4
REAL, PADDED = 7, 16


def unmasked_speech_graph(variant: str = "masked attention") -> onnx.ModelProto:
    """tokens [1, T] -> embeddings -> one attention head whose mask is ConstantOfShape(ones) of
    the ids' shape, its weighted sum quantized -> DynamicQuantizeLinear + ConvInteger over the tokens -> bidirectional LSTM
    -> durations (Round, Clip, Cast: Kokoro's), and a float Conv over the embeddings that the
    durations do not read (`text_features`, as Kokoro's text encoder); the durations before
    rounding are an output too (`duration_row`). `variant`: "mean" adds a
    mean over the tokens before the durations, "unmasked softmax" drops the attention mask."""
    rng = np.random.default_rng(0)
    weights = {
        "table": rng.normal(size=(VOCAB, WIDTH)),
        "conv_w": rng.integers(-127, 128, (WIDTH, WIDTH, 3)).astype(np.int8),
        "conv_scale": np.float32(0.002),
        "lstm_w": rng.normal(0, 0.5, (2, 4 * HIDDEN, WIDTH)),
        "lstm_r": rng.normal(0, 0.5, (2, 4 * HIDDEN, HIDDEN)),
        "duration_w": rng.normal(0, 3, (2 * HIDDEN, 1)),
        "text_w": rng.normal(0, 0.3, (WIDTH, WIDTH, 5)),
        "one": np.float32(1),
        "minus_big": np.float32(-1e4),
        "eight": np.float32(8),
        "unsqueeze_axes": np.array([1], np.int64),
        "row": np.array([1, -1, 2 * HIDDEN], np.int64),
        "flat": np.array([1, -1], np.int64),
    }
    node = helper.make_node
    ones = numpy_helper.from_array(np.ones(1, np.float32))
    scores = "scores" if variant == "unmasked softmax" else "biased"
    lstm_in = "y_mixed" if variant == "mean" else "y"
    nodes = [
        node("Gather", ["table", "tokens"], ["emb"]),
        node("Shape", ["tokens"], ["ids_shape"]),
        node("ConstantOfShape", ["ids_shape"], ["attention_mask"], value=ones),
        node("Unsqueeze", ["attention_mask", "unsqueeze_axes"], ["mask_row"]),
        node("Sub", ["one", "mask_row"], ["inverted"]),
        node("Mul", ["inverted", "minus_big"], ["bias"]),
        node("Transpose", ["emb"], ["emb_t"], perm=[0, 2, 1]),
        node("MatMul", ["emb", "emb_t"], ["scores"]),
        node("Add", ["scores", "bias"], ["biased"]),
        node("Softmax", [scores], ["probs"], axis=-1),
        # the weighted sum quantized, as a dynamically quantized attention's: the scores' two
        # token axes masked, the product over the tokens read from the masked probabilities
        node("DynamicQuantizeLinear", ["probs"], ["probs_q", "probs_scale", "probs_zero"]),
        node("DynamicQuantizeLinear", ["emb"], ["emb_q", "emb_scale", "emb_zero"]),
        node("MatMulInteger", ["probs_q", "emb_q", "probs_zero", "emb_zero"], ["attended_int"]),
        node("Cast", ["attended_int"], ["attended_float"], to=TensorProto.FLOAT),
        node("Mul", ["probs_scale", "emb_scale"], ["attended_scale"]),
        node("Mul", ["attended_float", "attended_scale"], ["attended"]),
        node("Transpose", ["attended"], ["channels"], perm=[0, 2, 1]),
        node("DynamicQuantizeLinear", ["channels"], ["q", "q_scale", "q_zero"]),
        node("ConvInteger", ["q", "conv_w", "q_zero"], ["conv_int"], pads=[1, 1]),
        node("Cast", ["conv_int"], ["conv_float"], to=TensorProto.FLOAT),
        node("Mul", ["q_scale", "conv_scale"], ["conv_scales"]),
        node("Mul", ["conv_float", "conv_scales"], ["conv"]),
        node("Transpose", ["conv"], ["steps"], perm=[2, 0, 1]),
        node(
            "LSTM",
            ["steps", "lstm_w", "lstm_r"],
            ["lstm_y"],
            hidden_size=HIDDEN,
            direction="bidirectional",
        ),
        node("Transpose", ["lstm_y"], ["lstm_rows"], perm=[2, 0, 1, 3]),
        node("Reshape", ["lstm_rows", "row"], ["y"]),
    ]
    if variant == "mean":
        nodes += [
            node("ReduceMean", ["y"], ["y_mean"], axes=[1]),
            node("Add", ["y", "y_mean"], ["y_mixed"]),
        ]
    nodes += [
        node("MatMul", [lstm_in, "duration_w"], ["duration_logit"]),
        node("Sigmoid", ["duration_logit"], ["duration_unit"]),
        node("Mul", ["duration_unit", "eight"], ["duration_float"]),
        node("Reshape", ["duration_float", "flat"], ["duration_row"]),
        node("Round", ["duration_row"], ["rounded"]),
        node("Clip", ["rounded", "one"], ["clamped"]),
        node("Cast", ["clamped"], ["duration"], to=TensorProto.INT64),
        node("Conv", ["emb_t", "text_w"], ["text_features"], pads=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "unmasked_speech",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "T"])],
        [
            helper.make_tensor_value_info("duration", TensorProto.INT64, None),
            helper.make_tensor_value_info("text_features", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("duration_row", TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(
                v.astype(np.float32) if v.dtype == np.float64 else np.asarray(v), k
            )
            for k, v in weights.items()
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ids(length: int) -> np.ndarray:
    tokens = np.zeros((1, length), np.int64)  # padded with 0s, as the pipeline pads
    tokens[0, :REAL] = np.arange(1, REAL + 1) * 2 % VOCAB
    return tokens


def load(tmp_path, variant: str = "masked attention"):
    path = tmp_path / "model.onnx"
    onnx.save(unmasked_speech_graph(variant), path)
    return load_speech_model(path, fix_atan2=False, frames=8, token_inputs=("tokens",))


def test_padding_the_tokens_changes_nothing_real(tmp_path):
    unedited = transmuter.load(unmasked_speech_graph())
    want = transmuter.run(unedited, {"tokens": ids(REAL)})
    # The test can fail: padding the unedited graph moves the real tokens' results.
    moved = transmuter.run(unedited, {"tokens": ids(PADDED)})
    for name in ("text_features", "duration_row"):
        assert not np.allclose(moved[name][..., :REAL], want[name], atol=1e-3)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load(tmp_path)
    assert TOKEN_COUNT_INPUT in model.inputs
    got = transmuter.run(model, {"tokens": ids(PADDED), TOKEN_COUNT_INPUT: np.array([REAL])})
    durations = np.asarray(got[DURATIONS_OUTPUT]).reshape(-1)
    np.testing.assert_array_equal(durations[:REAL], np.asarray(want["duration"]).reshape(-1))
    assert not durations[REAL:].any()
    assert len(set(durations[:REAL].tolist())) > 2  # the durations vary with the tokens
    for name in ("text_features", "duration_row"):  # duration_row: before rounding
        np.testing.assert_allclose(
            np.asarray(got[name])[..., :REAL], want[name], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize(
    ("variant", "why"),
    [
        ("mean", "ReduceMean.*a reduction over the tokens"),
        ("unmasked softmax", "Softmax.*a softmax over the tokens without an attention mask"),
    ],
)
def test_a_graph_that_mixes_tokens_otherwise_warns_and_runs_unpadded(tmp_path, variant, why):
    with pytest.warns(UserWarning, match=f"nor can its tokens be masked: {why}"):
        model = load(tmp_path, variant)
    assert TOKEN_COUNT_INPUT not in model.inputs
