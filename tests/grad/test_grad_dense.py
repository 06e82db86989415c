"""Gradients through products, convolutions (DeformConv included), normalizations, softmax,
attention (ai.onnx and com.microsoft) and the training losses against float64 finite
differences (tolerance: see grad_harness.py)."""

from __future__ import annotations

import numpy as np
import pytest
from grad_harness import check_gradients, check_gradients_jit_and_eager, node_model
from onnx import TensorProto

MS = "com.microsoft"
# stash_type for the normalizations that compute their statistics in float32 by default
# (stash_type=1): float64 statistics keep the finite differences at float64 precision.
DOUBLE = TensorProto.DOUBLE


def data(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape) * scale


def positive(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).uniform(0.5, 1.5, shape)


# ---- products -----------------------------------------------------------------------------


def test_matmul_broadcast_batch():
    x, w = data(2, 3, 4), data(4, 5, seed=1)
    check_gradients(node_model("MatMul", ["X", "W"], inputs={"X": x}, weights={"W": w}), {"X": x})


@pytest.mark.parametrize("trans", [(0, 0), (1, 1)])
def test_gemm_transposes_alpha_beta_and_bias(trans):
    a = data(3, 4) if not trans[0] else data(4, 3)
    b = data(4, 2, seed=1) if not trans[1] else data(2, 4, seed=1)
    attrs = {"transA": trans[0], "transB": trans[1], "alpha": 0.7, "beta": 1.3}
    proto = node_model(
        "Gemm", ["A", "B", "C"], attrs, inputs={"A": a}, weights={"B": b, "C": data(1, 2, seed=2)}
    )
    check_gradients(proto, {"A": a})


def test_einsum_contraction_with_a_repeated_operand_index():
    x, y = data(2, 3, 4), data(2, 4, 3, seed=1)
    proto = node_model("Einsum", ["X", "Y"], {"equation": "bij,bjk->bik"}, inputs={"X": x, "Y": y})
    check_gradients(proto, {"X": x, "Y": y})


# ---- convolutions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs",
    [
        {"pads": [1, 0, 1, 2], "strides": [2, 1]},
        {"group": 2, "dilations": [2, 1], "auto_pad": "SAME_UPPER"},
    ],
    ids=["pads_strides", "group_dilation_same"],
)
def test_conv_2d(attrs):
    x = data(1, 4, 5, 4)
    w = data(2, 4 // attrs.get("group", 1), 3, 2, seed=1)
    proto = node_model(
        "Conv", ["X", "W", "B"], attrs, inputs={"X": x}, weights={"W": w, "B": data(2, seed=2)}
    )
    check_gradients(proto, {"X": x})


def test_conv_transpose_strides_output_padding_and_group():
    x, w = data(1, 2, 3, 3), data(2, 1, 2, 3, seed=1)
    attrs = {"strides": [2, 2], "output_padding": [1, 0], "group": 2, "pads": [0, 1, 0, 1]}
    proto = node_model(
        "ConvTranspose", ["X", "W", "B"], attrs, inputs={"X": x}, weights={"W": w, "B": data(2)}
    )
    check_gradients(proto, {"X": x})


def test_deform_conv_with_respect_to_offsets_and_mask():
    # Random offsets: no sample lands on a pixel centre, where bilinear sampling has a kink.
    x, w = data(1, 2, 4, 4), data(2, 2, 2, 2, seed=1)
    offset = np.random.default_rng(3).uniform(-0.9, 0.9, (1, 8, 3, 3))
    mask = np.random.default_rng(4).uniform(0.2, 1.0, (1, 4, 3, 3))
    inputs = {"X": x, "offset": offset, "mask": mask}
    proto = node_model(
        "DeformConv",
        ["X", "W", "offset", "B", "mask"],
        {"kernel_shape": [2, 2]},
        inputs=inputs,
        weights={"W": w, "B": data(2, seed=2)},
        opset=22,
    )
    check_gradients(proto, inputs)


# ---- normalizations ---------------------------------------------------------------------


def test_batch_normalization_inference():
    x = data(2, 3, 4)
    weights = {"scale": positive(3), "B": data(3), "mean": data(3, seed=1), "var": positive(3)}
    proto = node_model("BatchNormalization", ["X", *weights], inputs={"X": x}, weights=weights)
    check_gradients(proto, {"X": x})


def test_batch_normalization_training_mode_with_running_statistics():
    # Outputs 1 and 2 (running mean and variance) are checked too: they depend on the batch
    # statistics, so their gradient reaches X.
    x = data(3, 2, 4) * 2 + 1
    weights = {"scale": positive(2), "B": data(2), "mean": data(2, seed=1), "var": positive(2)}
    proto = node_model(
        "BatchNormalization",
        ["X", *weights],
        {"training_mode": 1, "momentum": 0.8, "epsilon": 1e-3},
        outputs=["Y", "running_mean", "running_var"],
        inputs={"X": x},
        weights=weights,
    )
    check_gradients(proto, {"X": x})


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_normalization_with_mean_and_inverse_std_outputs(axis):
    x = data(2, 3, 4)
    shape = x.shape[axis:]
    proto = node_model(
        "LayerNormalization",
        ["X", "scale", "B"],
        {"axis": axis, "epsilon": 1e-3, "stash_type": DOUBLE},
        outputs=["Y", "mean", "inv_std"],
        inputs={"X": x},
        weights={"scale": positive(*shape), "B": data(*shape, seed=1)},
        opset=17,
    )
    check_gradients(proto, {"X": x})


def test_group_normalization_per_channel_scale():
    x = data(2, 4, 3)
    proto = node_model(
        "GroupNormalization",
        ["X", "scale", "B"],
        {"num_groups": 2, "epsilon": 1e-3, "stash_type": DOUBLE},
        inputs={"X": x},
        weights={"scale": positive(4), "B": data(4, seed=1)},
    )
    check_gradients(proto, {"X": x})


def test_instance_normalization():
    x = data(2, 3, 5)
    proto = node_model(
        "InstanceNormalization",
        ["X", "scale", "B"],
        {"epsilon": 1e-3},
        inputs={"X": x},
        weights={"scale": positive(3), "B": data(3, seed=1)},
    )
    check_gradients(proto, {"X": x})


def test_rms_normalization_over_two_axes():
    x = data(2, 3, 4)
    proto = node_model(
        "RMSNormalization",
        ["X", "scale"],
        {"axis": -2, "epsilon": 1e-3, "stash_type": DOUBLE},
        inputs={"X": x},
        weights={"scale": positive(3, 4)},
        opset=23,
    )
    check_gradients(proto, {"X": x})


def test_lrn():
    x = data(1, 4, 3)
    proto = node_model(
        "LRN", ["X"], {"size": 3, "alpha": 0.1, "beta": 0.75, "bias": 1.0}, inputs={"X": x}
    )
    check_gradients_jit_and_eager(proto, {"X": x})


# ---- softmax ------------------------------------------------------------------------------


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13], ids=["flatten_to_2d", "one_axis"])
def test_softmax_family(op_type, opset):
    x = data(2, 3, 4, scale=2.0)
    proto = node_model(op_type, ["X"], {"axis": 1}, inputs={"X": x}, opset=opset)
    check_gradients(proto, {"X": x})


# ---- attention ----------------------------------------------------------------------------


def test_onnx_attention_causal_with_float_mask_and_cache():
    q, k, v = data(1, 2, 3, 4), data(1, 2, 3, 4, seed=1), data(1, 2, 3, 4, seed=2)
    past_k, past_v = data(1, 2, 2, 4, seed=3), data(1, 2, 2, 4, seed=4)
    mask = data(3, 5, seed=5)
    proto = node_model(
        "Attention",
        ["Q", "K", "V", "mask", "past_key", "past_value"],
        {"is_causal": 1, "softcap": 3.0},
        outputs=["Y", "present_key", "present_value"],
        inputs={"Q": q, "K": k, "V": v, "past_key": past_k, "past_value": past_v},
        weights={"mask": mask},
        opset=23,
    )
    check_gradients(proto, {"Q": q, "K": k, "V": v, "past_key": past_k, "past_value": past_v})


def test_onnx_attention_grouped_heads_3d_inputs():
    q, k, v = data(2, 3, 8), data(2, 4, 4, seed=1), data(2, 4, 4, seed=2)
    proto = node_model(
        "Attention",
        ["Q", "K", "V"],
        {"q_num_heads": 4, "kv_num_heads": 2, "scale": 0.4},
        inputs={"Q": q, "K": k, "V": v},
        opset=23,
    )
    check_gradients(proto, {"Q": q, "K": k, "V": v})


def test_contrib_attention_packed_projection_causal_with_padding_mask():
    x = data(2, 3, 4)
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.int32)
    proto = node_model(
        "Attention",
        ["input", "weights", "bias", "mask_index"],
        {"num_heads": 2, "unidirectional": 1},
        domain=MS,
        inputs={"input": x},
        weights={"weights": data(4, 12, seed=1, scale=0.5), "bias": data(12, seed=2)},
        constants={"mask_index": mask},
    )
    check_gradients(proto, {"input": x})


def test_contrib_multi_head_attention_cross_with_bias_and_attention_bias():
    q, k, v = data(1, 2, 4), data(1, 3, 4, seed=1), data(1, 3, 4, seed=2)
    proto = node_model(
        "MultiHeadAttention",
        ["query", "key", "value", "bias", "", "attention_bias"],
        {"num_heads": 2},
        outputs=["Y", "present_key", "present_value"],
        domain=MS,
        inputs={"query": q, "key": k, "value": v},
        weights={"bias": data(12, seed=3), "attention_bias": data(1, 2, 2, 3, seed=4)},
    )
    check_gradients(proto, {"query": q, "key": k, "value": v})


def test_contrib_group_query_attention_with_past_cache():
    # Second step of a cached decode: one past row per sequence, two new ones; kv heads shared
    # by two query heads each.
    q, k, v = data(1, 2, 8), data(1, 2, 4, seed=1), data(1, 2, 4, seed=2)
    past_k, past_v = data(1, 2, 1, 2, seed=3), data(1, 2, 1, 2, seed=4)
    inputs = {"query": q, "key": k, "value": v, "past_key": past_k, "past_value": past_v}
    proto = node_model(
        "GroupQueryAttention",
        [*inputs, "seqlens_k", "total_sequence_length"],
        {"num_heads": 4, "kv_num_heads": 2},
        outputs=["Y", "present_key", "present_value"],
        domain=MS,
        inputs=inputs,
        constants={
            "seqlens_k": np.array([2], np.int32),
            "total_sequence_length": np.array(3, np.int32),
        },
    )
    check_gradients(proto, inputs)


def test_contrib_skip_layer_normalization_with_sum_output():
    # The mean and inv_std outputs are float32 whatever the input type (ORT's schema), too
    # coarse for float64 finite differences; Y and the sum input + skip + bias are checked.
    x, skip = data(2, 3, 4), data(2, 3, 4, seed=1)
    proto = node_model(
        "SkipLayerNormalization",
        ["input", "skip", "gamma", "beta", "bias"],
        {"epsilon": 1e-3},
        outputs=["Y", "", "", "sum"],
        domain=MS,
        inputs={"input": x, "skip": skip},
        weights={"gamma": positive(4), "beta": data(4, seed=2), "bias": data(4, seed=3)},
    )
    check_gradients(proto, {"input": x, "skip": skip})


def test_contrib_fast_gelu_with_bias():
    x = data(2, 5, scale=2.0)
    proto = node_model(
        "FastGelu", ["X", "bias"], domain=MS, inputs={"X": x}, weights={"bias": data(5, seed=1)}
    )
    check_gradients(proto, {"X": x})


# ---- training losses ----------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_softmax_cross_entropy_loss_with_class_weights_and_ignored_labels(reduction):
    # Label -1 is ignored: its row must get no gradient from the loss, and the mean divides by
    # the weights of the rows that count. (log_prob, which covers every row, is not read out.)
    scores = data(4, 3, 2)
    labels = np.array([[0, 2], [1, -1], [2, 2], [0, 1]])
    proto = node_model(
        "SoftmaxCrossEntropyLoss",
        ["scores", "labels", "weights"],
        {"reduction": reduction, "ignore_index": -1},
        inputs={"scores": scores},
        weights={"weights": positive(3)},
        constants={"labels": labels},
    )
    grads, _ = check_gradients(proto, {"scores": scores})
    np.testing.assert_array_equal(grads["scores"][1, :, 1], 0)
