"""ORT's fused normalizations (SkipLayerNormalization, SkipSimplifiedLayerNormalization,
EmbedLayerNormalization, QEmbedLayerNormalization, GroupNorm) and its ai.onnx-domain
SimplifiedLayerNormalization-1 and LayerNormalization-1, against ONNX Runtime's CPU kernels
(NumPy where ORT has no CPU kernel)."""

import ml_dtypes
import numpy as np
import pytest
from opcheck import assert_close, check_node, make_node_model, transmuter_runs

from transmuter.errors import TransmuterError
from transmuter.lowering import lookup
from transmuter.lowering.ops.contrib.normalization import layer_normalization_v1
from transmuter.lowering.ops.normalization import layer_normalization

MS = "com.microsoft"
TOL = {np.float16: 3e-3, np.float32: 1e-5, np.float64: 1e-10}


def _data(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _check_against(expected, op_type, inputs, attrs=None, *, tol, **options):
    """Transmuter's outputs (eager and compiled) against values computed another way."""
    model = make_node_model(op_type, inputs, attrs, **options)
    for mode, outputs in transmuter_runs(model, inputs).items():
        assert len(outputs) == len(expected)
        for i, (got, want) in enumerate(zip(outputs, expected)):
            assert_close(got, want, rtol=tol, atol=tol, what=f"{op_type} output {i} ({mode})")


# ------------------------------------------------------------------- skip layer normalization


def _skip_inputs(rng, shape, skip_shape, dtype, *, beta=True, bias=True):
    hidden = shape[-1]
    inputs = {
        "input": _data(rng, shape, dtype),
        "skip": _data(rng, skip_shape, dtype),
        "gamma": _data(rng, (hidden,), dtype),
        "beta": _data(rng, (hidden,), dtype) if beta else None,
        "bias": _data(rng, (hidden,), dtype) if bias else None,
    }
    return inputs


@pytest.mark.parametrize("op_type", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize(
    "shape, skip_shape",
    [((2, 3, 16), (2, 3, 16)), ((2, 3, 16), (1, 3, 16)), ((2, 3, 16), (3, 16)), ((6, 8), (6, 8))],
)
def test_skip_layer_normalization(rng, op_type, shape, skip_shape):
    inputs = _skip_inputs(rng, shape, skip_shape, np.float32)
    if op_type == "SkipSimplifiedLayerNormalization":
        del inputs["beta"]
    check_node(op_type, inputs, domain=MS, outputs=4, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op_type", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("beta, bias", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("outputs", [1, ["out0", "", "", "out3"], ["out0", "out1", "out2"]])
def test_skip_layer_normalization_optional(rng, op_type, beta, bias, outputs):
    inputs = _skip_inputs(rng, (2, 4, 8), (2, 4, 8), np.float32, beta=beta, bias=bias)
    names = ["input", "skip", "gamma", "beta", "bias"]
    if op_type == "SkipSimplifiedLayerNormalization":
        del inputs["beta"]
        names.remove("beta")
    check_node(
        op_type,
        inputs,
        {"epsilon": 1e-3},
        domain=MS,
        outputs=outputs,
        input_names=names,
        rtol=1e-5,
        atol=1e-5,
        symbolic={"input": [0]},
    )


@pytest.mark.parametrize("op_type", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_layer_normalization_float16(rng, op_type):
    # The sum and the statistics are float32 (ORT's kernel too); output and sum are rounded once.
    inputs = _skip_inputs(rng, (2, 5, 32), (2, 5, 32), np.float16)
    if op_type == "SkipSimplifiedLayerNormalization":
        del inputs["beta"]
    check_node(op_type, inputs, domain=MS, outputs=4, rtol=3e-3, atol=3e-3)


def test_skip_layer_normalization_bfloat16(rng):
    inputs = _skip_inputs(rng, (2, 3, 8), (2, 3, 8), ml_dtypes.bfloat16)
    wide = {k: v.astype(np.float32) for k, v in inputs.items()}
    model = make_node_model("SkipLayerNormalization", wide, domain=MS, outputs=4)
    expected = transmuter_runs(model, wide, compiled=False)["eager"]
    expected = [e.astype(ml_dtypes.bfloat16) if i in (0, 3) else e for i, e in enumerate(expected)]
    _check_against(expected, "SkipLayerNormalization", inputs, tol=2e-2, domain=MS, outputs=4)


def test_skip_layer_normalization_zero_batch(rng):
    inputs = _skip_inputs(rng, (0, 3, 8), (3, 8), np.float32)
    check_node("SkipLayerNormalization", inputs, domain=MS, outputs=4)


@pytest.mark.parametrize(
    "shape, skip_shape, gamma_shape, match",
    [
        ((2, 2, 3, 8), (2, 2, 3, 8), (8,), "input must be"),
        ((2, 3, 8), (2, 1, 8), (8,), "skip must have"),
        ((2, 3, 8), (2, 3, 8), (3, 8), "gamma must have shape"),
    ],
)
def test_skip_layer_normalization_bad_shapes(rng, shape, skip_shape, gamma_shape, match):
    inputs = {
        "input": _data(rng, shape),
        "skip": _data(rng, skip_shape),
        "gamma": _data(rng, gamma_shape),
    }
    model = make_node_model("SkipLayerNormalization", inputs, domain=MS)
    with pytest.raises(TransmuterError, match=match):
        transmuter_runs(model, inputs, compiled=False)


# ------------------------------------------------------------------ embed layer normalization


def _embed_inputs(rng, dtype=np.float32, *, batch=2, seq=5, hidden=16, segment=True):
    ids = rng.integers(0, 30, (batch, seq)).astype(np.int32)
    return {
        "input_ids": ids,
        "segment_ids": rng.integers(0, 2, (batch, seq)).astype(np.int32) if segment else None,
        "word_embedding": _data(rng, (30, hidden), dtype),
        "position_embedding": _data(rng, (8, hidden), dtype),
        "segment_embedding": _data(rng, (2, hidden), dtype) if segment else None,
        "gamma": _data(rng, (hidden,), dtype),
        "beta": _data(rng, (hidden,), dtype),
        # Values other than 0 and 1: ORT counts the ones only.
        "mask": rng.integers(0, 3, (batch, seq)).astype(np.int32),
    }


EMBED_NAMES = [
    "input_ids",
    "segment_ids",
    "word_embedding",
    "position_embedding",
    "segment_embedding",
    "gamma",
    "beta",
    "mask",
    "position_ids",
]


@pytest.mark.parametrize("segment", [True, False])
@pytest.mark.parametrize("with_mask", [True, False])
@pytest.mark.parametrize("position_ids", [None, (1, 5), (2, 5)])
def test_embed_layer_normalization(rng, segment, with_mask, position_ids):
    inputs = _embed_inputs(rng, segment=segment)
    if not with_mask:
        inputs["mask"] = None
    if position_ids is not None:
        inputs["position_ids"] = rng.integers(0, 8, position_ids).astype(np.int32)
    check_node(
        "EmbedLayerNormalization",
        inputs,
        domain=MS,
        outputs=3,
        input_names=EMBED_NAMES,
        rtol=1e-5,
        atol=1e-5,
        symbolic={"input_ids": [0], "segment_ids": [0], "mask": [0]},
    )


@pytest.mark.parametrize(
    "attrs, outputs",
    [
        ({"epsilon": 1e-3}, 2),  # ORT's type inference needs mask_index listed
        ({"mask_index_type": 0}, 2),
        ({"mask_index_type": 1}, ["out0", "", "out2"]),
    ],
)
def test_embed_layer_normalization_attributes(rng, attrs, outputs):
    inputs = _embed_inputs(rng)
    check_node(
        "EmbedLayerNormalization",
        inputs,
        attrs,
        domain=MS,
        outputs=outputs,
        input_names=EMBED_NAMES,
        rtol=1e-5,
        atol=1e-5,
    )


def test_embed_layer_normalization_float16(rng):
    inputs = _embed_inputs(rng, np.float16)
    check_node(
        "EmbedLayerNormalization",
        inputs,
        domain=MS,
        outputs=3,
        input_names=EMBED_NAMES,
        rtol=5e-3,
        atol=5e-3,
    )


def test_embed_layer_normalization_out_of_range_ids(rng):
    # ORT fails the run; a compiled program cannot, so the rows of bad ids come out NaN.
    inputs = _embed_inputs(rng, segment=False)
    inputs["input_ids"][0, 1] = 30
    inputs["input_ids"][1, 0] = -1
    model = make_node_model("EmbedLayerNormalization", inputs, domain=MS, input_names=EMBED_NAMES)
    for outputs in transmuter_runs(model, inputs).values():
        bad = np.isnan(np.asarray(outputs[0])).all(axis=-1)
        ids = inputs["input_ids"]
        np.testing.assert_array_equal(bad, (ids == 30) | (ids < 0))


def test_embed_layer_normalization_bad_position_ids(rng):
    inputs = _embed_inputs(rng)
    inputs["position_ids"] = np.zeros((3, 5), np.int32)
    model = make_node_model("EmbedLayerNormalization", inputs, domain=MS, input_names=EMBED_NAMES)
    with pytest.raises(TransmuterError, match="position_ids must be"):
        transmuter_runs(model, inputs, compiled=False)


# ------------------------------------------------------------ quantized embed layer normalization

QEMBED_NAMES = [
    "input_ids",
    "segment_ids",
    "word_embedding_quant",
    "position_embedding_quant",
    "segment_embedding",
    "gamma_quant",
    "beta_quant",
    "mask",
    "word_embedding_scale",
    "position_embedding_scale",
    "segment_embedding_scale",
    "gamma_scale",
    "beta_scale",
    "word_embedding_zero_point",
    "position_embedding_zero_point",
    "segment_embedding_zero_point",
    "gamma_zero_point",
    "beta_zero_point",
]
QEMBED_SYMBOLIC = {"input_ids": [0], "segment_ids": [0], "mask": [0]}


def _qembed_inputs(rng, dtype=np.uint8, *, batch=2, seq=5, hidden=16, segment=True, mask=True):
    info = np.iinfo(dtype)

    def quantized(shape):
        return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)

    inputs = {
        "input_ids": rng.integers(0, 30, (batch, seq)).astype(np.int32),
        "segment_ids": rng.integers(0, 2, (batch, seq)).astype(np.int32) if segment else None,
        "word_embedding_quant": quantized((30, hidden)),
        "position_embedding_quant": quantized((8, hidden)),
        "segment_embedding": quantized((2, hidden)) if segment else None,
        "gamma_quant": quantized((hidden,)),
        "beta_quant": quantized((hidden,)),
        # Values other than 0 and 1: ORT counts the ones only.
        "mask": rng.integers(0, 3, (batch, seq)).astype(np.int32) if mask else None,
    }
    for table in ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta"):
        present = segment or table != "segment_embedding"
        scale = np.float32(rng.uniform(0.01, 0.05))
        zero_point = quantized(())
        inputs[f"{table}_scale"] = scale if present else None
        inputs[f"{table}_zero_point"] = zero_point if present else None
    return inputs


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("segment", [True, False])
@pytest.mark.parametrize("mask", [True, False])
def test_qembed_layer_normalization(rng, dtype, segment, mask):
    inputs = _qembed_inputs(rng, dtype, segment=segment, mask=mask)
    check_node(
        "QEmbedLayerNormalization",
        inputs,
        domain=MS,
        outputs=2,
        input_names=QEMBED_NAMES,
        rtol=1e-5,
        atol=1e-5,
        symbolic=QEMBED_SYMBOLIC,
    )


def test_qembed_layer_normalization_one_element_scales_and_epsilon(rng):
    # ORT's kernel takes each scale and zero point as a scalar or a 1-D tensor of one value.
    # epsilon=1e-2 against variances of a few units moves the outputs by about 1e-3.
    inputs = _qembed_inputs(rng, np.int8, batch=3, seq=8)
    for name in QEMBED_NAMES[8:]:
        inputs[name] = np.reshape(inputs[name], (1,))
    check_node(
        "QEmbedLayerNormalization",
        inputs,
        {"epsilon": 1e-2},
        domain=MS,
        outputs=2,
        input_names=QEMBED_NAMES,
        rtol=1e-5,
        atol=1e-5,
        constants=QEMBED_NAMES[2:7] + QEMBED_NAMES[8:],
    )


def test_qembed_layer_normalization_matches_float_op(rng):
    # The quantized op is the float op on the dequantized tables.
    inputs = _qembed_inputs(rng)

    def dequantized(name):
        table = name.removesuffix("_quant")
        values = inputs[name].astype(np.int32) - inputs[f"{table}_zero_point"].astype(np.int32)
        return values.astype(np.float32) * inputs[f"{table}_scale"]

    float_inputs = {
        "input_ids": inputs["input_ids"],
        "segment_ids": inputs["segment_ids"],
        **{n.removesuffix("_quant"): dequantized(n) for n in QEMBED_NAMES[2:7]},
        "mask": inputs["mask"],
    }
    model = make_node_model(
        "EmbedLayerNormalization", float_inputs, domain=MS, outputs=2, input_names=EMBED_NAMES
    )
    expected = transmuter_runs(model, float_inputs, compiled=False)["eager"]
    _check_against(
        expected,
        "QEmbedLayerNormalization",
        inputs,
        tol=1e-6,
        domain=MS,
        outputs=2,
        input_names=QEMBED_NAMES,
    )


@pytest.mark.parametrize("batch, seq", [(0, 5), (2, 0)])
def test_qembed_layer_normalization_zero_size(rng, batch, seq):
    inputs = _qembed_inputs(rng, batch=batch, seq=seq)
    check_node("QEmbedLayerNormalization", inputs, domain=MS, outputs=2, input_names=QEMBED_NAMES)


def test_qembed_layer_normalization_position_out_of_range(rng):
    # Positions run 0..sequence-1: ORT fails the run past the position table, Transmuter gives
    # NaN rows for those positions.
    inputs = _qembed_inputs(rng, seq=10, segment=False)
    model = make_node_model(
        "QEmbedLayerNormalization", inputs, domain=MS, outputs=2, input_names=QEMBED_NAMES
    )
    for outputs in transmuter_runs(model, inputs).values():
        bad = np.isnan(np.asarray(outputs[0])).all(axis=-1)
        np.testing.assert_array_equal(bad, np.broadcast_to(np.arange(10) >= 8, (2, 10)))


@pytest.mark.parametrize(
    "change, match",
    [
        ({"gamma_scale": np.full((3,), 0.1, np.float32)}, "gamma_scale must be a scalar"),
        ({"word_embedding_zero_point": np.zeros((1, 1), np.uint8)}, "word_embedding_zero_point"),
        ({"beta_zero_point": np.int8(0)}, "beta_zero_point must have"),
        ({"segment_embedding_scale": None}, "all or none"),
        ({"mask": np.ones((2, 3), np.int32)}, "mask must have"),
        ({"gamma_quant": np.zeros((8,), np.uint8)}, "gamma_quant must have shape"),
    ],
)
def test_qembed_layer_normalization_bad_inputs(rng, change, match):
    inputs = {**_qembed_inputs(rng), **change}
    model = make_node_model(
        "QEmbedLayerNormalization", inputs, domain=MS, outputs=2, input_names=QEMBED_NAMES
    )
    with pytest.raises(TransmuterError, match=match):
        transmuter_runs(model, inputs, compiled=False)


# ------------------------------------------------------------------------------- group norm
# ORT has GroupNorm kernels for CUDA and ROCm only: the reference is NumPy.


def _group_norm_reference(x, gamma, beta, groups, epsilon, activation, channels_last):
    x = x.astype(np.float64)
    if channels_last:
        x = np.moveaxis(x, -1, 1)
    n, c = x.shape[:2]
    grouped = x.reshape(n, groups, -1)
    mean = grouped.mean(-1, keepdims=True)
    var = grouped.var(-1, keepdims=True)
    y = ((grouped - mean) / np.sqrt(var + epsilon)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    y = y * gamma.astype(np.float64).reshape(shape) + beta.astype(np.float64).reshape(shape)
    if activation:
        y = y / (1 + np.exp(-y))
    return np.moveaxis(y, 1, -1) if channels_last else y


@pytest.mark.parametrize("channels_last", [1, 0])
@pytest.mark.parametrize("activation", [0, 1])
@pytest.mark.parametrize("groups", [1, 4, 8])
def test_group_norm(rng, channels_last, activation, groups):
    shape = (2, 3, 5, 8) if channels_last else (2, 8, 3, 5)
    inputs = {"X": _data(rng, shape, scale=2), "gamma": _data(rng, (8,)), "beta": _data(rng, (8,))}
    attrs = {"activation": activation, "channels_last": channels_last, "groups": groups}
    attrs["epsilon"] = 1e-3
    expected = _group_norm_reference(*inputs.values(), groups, 1e-3, activation, channels_last)
    _check_against(
        [expected.astype(np.float32)],
        "GroupNorm",
        inputs,
        attrs,
        tol=1e-5,
        domain=MS,
        symbolic={"X": [0]},
    )


@pytest.mark.parametrize("param_dtype", [np.float16, np.float32])
def test_group_norm_float16(rng, param_dtype):
    inputs = {
        "X": _data(rng, (1, 4, 4, 16), np.float16, 3),
        "gamma": _data(rng, (16,), param_dtype),
        "beta": _data(rng, (16,), param_dtype),
    }
    attrs = {"activation": 1, "groups": 4}
    expected = _group_norm_reference(*inputs.values(), 4, 1e-5, 1, 1).astype(np.float16)
    _check_against([expected], "GroupNorm", inputs, attrs, tol=3e-3, domain=MS)


def test_group_norm_groups_must_divide_channels(rng):
    inputs = {"X": _data(rng, (1, 2, 2, 6)), "gamma": _data(rng, (6,)), "beta": _data(rng, (6,))}
    model = make_node_model("GroupNorm", inputs, {"activation": 0, "groups": 4}, domain=MS)
    with pytest.raises(TransmuterError, match="num_groups 4 must divide"):
        transmuter_runs(model, inputs, compiled=False)


# ----------------------------------------------------------- ai.onnx-domain ORT normalizations


@pytest.mark.parametrize("axis, shape", [(-1, (2, 3, 8)), (1, (2, 3, 4)), (-2, (2, 3, 4, 5))])
@pytest.mark.parametrize("opset", [13, 21])
def test_simplified_layer_normalization(rng, axis, shape, opset):
    inputs = {"X": _data(rng, shape, scale=3), "scale": _data(rng, shape[axis:])}
    attrs = {"axis": axis, "epsilon": 1e-3}
    check_node(
        "SimplifiedLayerNormalization",
        inputs,
        attrs,
        opset=opset,
        outputs=2,
        rtol=1e-5,
        atol=1e-5,
        symbolic={"X": [0]},
    )


# (X, scale): float64 statistics stay float64 (ORT too), only inv_std_var is float32.
MIXED = [
    (np.float16, np.float16),
    (np.float64, np.float64),
    (np.float16, np.float32),
    (np.float32, np.float16),
]


@pytest.mark.parametrize("x_dtype, scale_dtype", MIXED)
def test_simplified_layer_normalization_dtypes(rng, x_dtype, scale_dtype):
    inputs = {"X": _data(rng, (2, 3, 16), x_dtype, 3), "scale": _data(rng, (16,), scale_dtype)}
    tol = TOL[x_dtype] if x_dtype == scale_dtype else 3e-3
    check_node("SimplifiedLayerNormalization", inputs, opset=13, outputs=2, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "axis, shape, b", [(-1, (2, 3, 8), True), (1, (2, 3, 4), False), (-2, (2, 3, 4, 5), True)]
)
@pytest.mark.parametrize("opset, stash_type", [(1, 1), (16, 1), (16, 11)])
def test_legacy_layer_normalization(rng, axis, shape, b, opset, stash_type):
    # ORT runs stash_type=11 through ai.onnx's function body, which needs the model's opset to
    # have its ops: not at opset 1.
    inputs = {"X": _data(rng, shape, scale=3), "Scale": _data(rng, shape[axis:])}
    inputs["B"] = _data(rng, shape[axis:]) if b else None
    attrs = {"axis": axis, "epsilon": 1e-3, "stash_type": stash_type}
    check_node(
        "LayerNormalization",
        inputs,
        attrs,
        opset=opset,
        outputs=3,
        rtol=1e-5,
        atol=1e-5,
        symbolic={"X": [0]},
    )


@pytest.mark.parametrize("x_dtype, scale_dtype", MIXED + [(np.float64, np.float32)])
def test_legacy_layer_normalization_dtypes(rng, x_dtype, scale_dtype):
    # Y has Scale's type; X and Scale may differ (ORT's T and V).
    inputs = {
        "X": _data(rng, (2, 3, 16), x_dtype, 3),
        "Scale": _data(rng, (16,), scale_dtype),
        "B": _data(rng, (16,), scale_dtype),
    }
    tol = 1e-10 if x_dtype == scale_dtype == np.float64 else 3e-3
    tol = 1e-5 if np.float16 not in (x_dtype, scale_dtype) and tol != 1e-10 else tol
    check_node("LayerNormalization", inputs, opset=13, outputs=3, rtol=tol, atol=tol)


def test_layer_normalization_lookup_by_opset():
    assert lookup("", "LayerNormalization", 16).fn is layer_normalization_v1
    assert lookup("", "LayerNormalization", 17).fn is layer_normalization
