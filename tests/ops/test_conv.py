"""Conv and ConvTranspose against ONNX Runtime."""

import numpy as np
import pytest
from opcheck import check_node

TOL = {np.float32: (1e-4, 1e-4), np.float64: (1e-10, 1e-10), np.float16: (1e-2, 1e-2)}


def _data(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 3, 9), (4, 3, 3), {}),
        ((1, 3, 7, 8), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((1, 3, 7, 8), (5, 3, 3, 2), {"pads": [0, 2, 1, 0], "strides": [2, 1]}),
        ((1, 4, 9, 9), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1]}),
        # Depthwise (one input channel per group) takes the shifted-products path.
        ((2, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
        ((1, 8, 12, 10), (8, 1, 7, 7), {"group": 8, "pads": [3, 3, 3, 3]}),  # ConvNeXt's
        ((1, 3, 9, 8), (6, 1, 3, 2), {"group": 3, "strides": [2, 1], "dilations": [1, 2]}),
        ((1, 4, 9, 8), (4, 1, 3, 3), {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ((1, 4, 9, 8), (4, 1, 2, 2), {"group": 4, "auto_pad": "SAME_LOWER"}),
        ((1, 4, 9, 8), (4, 1, 3, 3), {"group": 4, "auto_pad": "VALID"}),
        ((2, 5, 11), (5, 1, 4), {"group": 5, "pads": [2, 1], "strides": [3]}),
        ((1, 2, 4, 5, 6), (2, 1, 2, 3, 3), {"group": 2, "pads": [1, 0, 1, 0, 1, 1]}),
        ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"strides": [1, 2, 2], "pads": [0, 1, 0, 1, 0, 1]}),
        ((1, 3, 8, 7), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ((1, 3, 8, 7), (2, 3, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [1, 2]}),
        ((1, 3, 8, 7), (2, 3, 2, 2), {"auto_pad": "SAME_UPPER", "dilations": [2, 3]}),
        ((1, 3, 8, 7), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
        ((1, 3, 8, 7), (2, 3, 3, 3), {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]}),
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(rng, x_shape, w_shape, attrs, bias):
    inputs = {"X": _data(rng, x_shape), "W": _data(rng, w_shape)}
    if bias:
        inputs["B"] = _data(rng, (w_shape[0],))
    # ONNX Runtime rejects dilations together with SAME padding.
    reference = "onnx" if "dilations" in attrs and "auto_pad" in attrs else "ort"
    check_node(
        "Conv",
        inputs,
        attrs,
        opset=11,
        constants=["W", "B"],
        reference=reference,
        rtol=1e-4,
        atol=1e-4,
    )


def _reference(dtype, opset):
    # ONNX Runtime has no float64 Conv/ConvTranspose kernels, and builds an invalid Cast for
    # float16 models at opset 1.
    return "onnx" if dtype == np.float64 or (opset == 1 and dtype == np.float16) else "ort"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_dtypes_and_versions(rng, dtype, opset):
    inputs = {
        "X": _data(rng, (2, 4, 6, 6), dtype),
        "W": _data(rng, (4, 2, 3, 3), dtype),
        "B": _data(rng, (4,), dtype),
    }
    rtol, atol = TOL[dtype]
    attrs = {"group": 2, "pads": [1, 0, 1, 2]}
    check_node(
        "Conv", inputs, attrs, opset=opset, reference=_reference(dtype, opset), rtol=rtol, atol=atol
    )


def test_conv_bfloat16_against_float32(rng):
    import ml_dtypes

    x, w = _data(rng, (1, 2, 5, 5)), _data(rng, (3, 2, 3, 3))
    expected = check_node("Conv", {"X": x, "W": w}, opset=22, rtol=1e-4, atol=1e-4)[0]
    from opcheck import make_node_model, transmuter_runs

    inputs = {"X": x.astype(ml_dtypes.bfloat16), "W": w.astype(ml_dtypes.bfloat16)}
    model = make_node_model("Conv", inputs, opset=22)
    for out in transmuter_runs(model, inputs).values():
        assert out[0].dtype == ml_dtypes.bfloat16
        np.testing.assert_allclose(out[0].astype(np.float32), expected, rtol=5e-2, atol=5e-2)


def test_conv_symbolic_batch_and_zero_batch(rng):
    inputs = {"X": _data(rng, (3, 2, 5, 5)), "W": _data(rng, (3, 2, 3, 3))}
    check_node(
        "Conv",
        inputs,
        {"pads": [1, 1, 1, 1]},
        constants=["W"],
        symbolic={"X": [0]},
        rtol=1e-4,
        atol=1e-4,
    )
    inputs["X"] = _data(rng, (0, 2, 5, 5))
    check_node("Conv", inputs, {"pads": [1, 1, 1, 1]}, constants=["W"])


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((1, 2, 5), (2, 3, 3), {}),
        ((2, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2]}),
        ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 3], "pads": [1, 0, 1, 2]}),
        ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_padding": [1, 1]}),
        ((1, 4, 4, 5), (4, 2, 3, 2), {"group": 2, "strides": [2, 1], "dilations": [1, 2]}),
        ((1, 4, 4, 4), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [10, 9]}),
        (
            (1, 2, 4, 5),
            (2, 3, 3, 3),
            {"strides": [2, 2], "output_shape": [9, 11], "output_padding": [1, 1]},
        ),
        ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 3], "auto_pad": "SAME_UPPER"}),
        ((1, 2, 4, 5), (2, 3, 4, 3), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
        (
            (1, 2, 4, 5),
            (2, 3, 3, 3),
            {"strides": [2, 2], "auto_pad": "SAME_UPPER", "output_shape": [7, 9]},
        ),
        (
            (1, 2, 4, 5),
            (2, 3, 3, 3),
            {"strides": [2, 2], "auto_pad": "SAME_LOWER", "output_shape": [7, 9]},
        ),
        ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "VALID"}),
        ((1, 2, 3, 3, 4), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 0]}),
        ((1, 2, 4, 5), (2, 3, 2, 2), {"pads": [3, 3, 3, 3], "strides": [3, 3]}),  # pads > kernel
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(rng, x_shape, w_shape, attrs, bias):
    inputs = {"X": _data(rng, x_shape), "W": _data(rng, w_shape)}
    if bias:
        inputs["B"] = _data(rng, (w_shape[1] * attrs.get("group", 1),))
    check_node("ConvTranspose", inputs, attrs, opset=11, constants=["W", "B"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_transpose_dtypes_and_versions(rng, dtype, opset):
    reference = _reference(dtype, opset)
    group = 2 if reference == "ort" else 1  # onnx.reference mishandles groups and output_shape
    inputs = {
        "X": _data(rng, (2, 4, 3, 3), dtype),
        "W": _data(rng, (4, 2 // group, 3, 3), dtype),
        "B": _data(rng, (2,), dtype),
    }
    rtol, atol = TOL[dtype]
    attrs = {"group": group, "strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}
    check_node(
        "ConvTranspose", inputs, attrs, opset=opset, reference=reference, rtol=rtol, atol=atol
    )


def test_conv_transpose_zero_batch(rng):
    inputs = {"X": _data(rng, (0, 2, 3, 3)), "W": _data(rng, (2, 3, 3, 3))}
    check_node("ConvTranspose", inputs, {"strides": [2, 2]}, constants=["W"])


def test_conv_rejects_mismatched_kernel_shape(rng):
    from transmuter.errors import TransmuterError

    inputs = {"X": _data(rng, (1, 2, 5, 5)), "W": _data(rng, (3, 2, 3, 3))}
    with pytest.raises(TransmuterError, match="kernel_shape"):
        from opcheck import make_node_model, transmuter_runs

        transmuter_runs(make_node_model("Conv", inputs, {"kernel_shape": [2, 2]}), inputs)


# ----------------------------------------------------------------------- CausalConvWithState
# ONNX Runtime 1.32 has no CausalConvWithState: compared with onnx.reference.

CAUSAL_INPUTS = ["input", "weight", "bias", "past_state"]


def _causal(rng, batch, channels, length, k, *, bias, past, dtype=np.float32):
    return {
        "input": _data(rng, (batch, channels, length), dtype),
        "weight": _data(rng, (channels, 1, k), dtype),
        "bias": _data(rng, (channels,), dtype) if bias else None,
        "past_state": _data(rng, (batch, channels, k - 1), dtype) if past else None,
    }


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("length", [1, 2, 7])  # shorter and longer than the k - 1 state
@pytest.mark.parametrize("bias, past", [(False, False), (True, False), (False, True), (True, True)])
def test_causal_conv_with_state(rng, k, length, bias, past):
    inputs = _causal(rng, 2, 3, length, k, bias=bias, past=past)
    check_node(
        "CausalConvWithState",
        inputs,
        opset=27,
        reference="onnx",
        outputs=2,
        input_names=CAUSAL_INPUTS,
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("activation", ["none", "silu", "swish"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16"])
def test_causal_conv_with_state_activations_and_dtypes(rng, activation, dtype):
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    tol = {np.float32: 1e-5, np.float16: 2e-3}.get(dtype, 2e-2)
    inputs = _causal(rng, 2, 4, 6, 4, bias=True, past=True, dtype=dtype)
    check_node(
        "CausalConvWithState",
        inputs,
        {"activation": activation},
        opset=27,
        reference="onnx",
        outputs=2,
        rtol=tol,
        atol=tol,
    )


def test_causal_conv_with_state_special_inputs(rng):
    kw = {"opset": 27, "reference": "onnx", "outputs": 2, "input_names": CAUSAL_INPUTS}
    inputs = _causal(rng, 3, 2, 5, 3, bias=True, past=True)
    check_node("CausalConvWithState", inputs, symbolic={"input": [0, 2], "past_state": [0]}, **kw)
    check_node("CausalConvWithState", inputs, constants=["weight", "bias"], **kw)
    for batch, length in [(0, 5), (2, 0)]:
        inputs = _causal(rng, batch, 2, length, 3, bias=True, past=True)
        check_node("CausalConvWithState", inputs, **kw)


def test_causal_conv_with_state_zero_channels(rng):
    from opcheck import make_node_model, transmuter_runs

    # onnx.reference divides by the channel count here.
    inputs = _causal(rng, 2, 0, 5, 3, bias=True, past=False)
    model = make_node_model("CausalConvWithState", inputs, opset=27, outputs=2)
    for y, state in transmuter_runs(model, inputs).values():
        assert (y.shape, state.shape) == ((2, 0, 5), (2, 0, 2))


def test_causal_conv_with_state_streams(rng):
    """Chunks fed one after another with the carried state equal one pass over the whole."""
    from opcheck import make_node_model, transmuter_runs

    whole = _causal(rng, 2, 3, 9, 4, bias=True, past=True)
    model = make_node_model(
        "CausalConvWithState",
        whole,
        {"activation": "silu"},
        opset=27,
        outputs=2,
        symbolic={"input": [2]},
    )
    (y, state), *_ = transmuter_runs(model, whole, compiled=False).values()
    pieces, carried = [], whole["past_state"]
    for part in np.split(whole["input"], [2, 3, 7], axis=2):
        chunk = dict(whole, input=part, past_state=carried)
        (piece, carried), *_ = transmuter_runs(model, chunk, compiled=False).values()
        pieces.append(piece)
    np.testing.assert_allclose(np.concatenate(pieces, axis=2), y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(carried, state)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"weight": np.zeros((3, 2, 4), np.float32)}, r"weight must be \(3, 1, k\)"),
        ({"weight": np.zeros((3, 1, 0), np.float32)}, "k >= 1"),
        ({"bias": np.zeros(4, np.float32)}, r"bias must be \(3,\)"),
        ({"past_state": np.zeros((2, 3, 2), np.float32)}, r"past_state must be \(2, 3, 3\)"),
        ({"input": np.zeros((2, 3), np.float32)}, "batch_size, channels, length"),
        ({"activation": "relu"}, "activation must be one of"),
    ],
)
def test_causal_conv_with_state_rejects_bad_inputs(rng, change, match):
    from opcheck import make_node_model, transmuter_runs

    from transmuter.errors import TransmuterError

    inputs = _causal(rng, 2, 3, 5, 4, bias=True, past=True)
    attrs = {"activation": change.pop("activation")} if "activation" in change else {}
    inputs.update(change)
    model = make_node_model("CausalConvWithState", inputs, attrs, opset=27, outputs=2)
    with pytest.raises(TransmuterError, match=match):
        transmuter_runs(model, inputs, compiled=False)
