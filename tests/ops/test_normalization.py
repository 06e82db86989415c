"""Normalization operators against ONNX Runtime (onnx.reference where ONNX Runtime lacks a case)."""

import ml_dtypes
import numpy as np
import pytest
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs

from transmuter.errors import TransmuterError

FLOATS = [np.float16, np.float32, np.float64]


def _data(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _tol(dtype):
    return {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-10}[dtype]


def _check_against(expected, op_type, inputs, attrs, opset, tol, dtype):
    """Transmuter's outputs (of `dtype`) against values computed another way."""
    model = make_node_model(op_type, inputs, attrs, opset=opset)
    for mode, outputs in transmuter_runs(model, inputs).items():
        assert outputs[0].dtype == dtype, f"{mode}: dtype {outputs[0].dtype}, expected {dtype}"
        got = np.asarray(outputs[0]).astype(expected.dtype)
        assert_close(got, expected, rtol=tol, atol=tol, what=f"{op_type} ({mode})")


def _ort_float32(op_type, inputs, attrs, opset):
    """ONNX Runtime's output for the same node on float32 copies of the inputs."""
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    return ort_run(make_node_model(op_type, inputs, attrs, opset=opset), inputs)[0]


def _bn_inputs(rng, shape, dtype=np.float32, param_dtype=None):
    c = shape[1]
    param_dtype = param_dtype or dtype
    return {
        "X": _data(rng, shape, dtype),
        "scale": _data(rng, (c,), param_dtype),
        "B": _data(rng, (c,), param_dtype),
        "mean": _data(rng, (c,), param_dtype),
        "var": rng.uniform(0.5, 2.0, (c,)).astype(param_dtype),
    }


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 2, 2, 3, 4), (0, 3, 4)])
@pytest.mark.parametrize("opset", [7, 9, 14, 15])
def test_batch_normalization(rng, shape, opset):
    attrs = {"epsilon": 1e-3}
    check_node(
        "BatchNormalization", _bn_inputs(rng, shape), attrs, opset=opset, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dtype", FLOATS)
def test_batch_normalization_dtypes(rng, dtype):
    tol = _tol(dtype)
    inputs = _bn_inputs(rng, (2, 3, 4, 4), dtype)
    check_node("BatchNormalization", inputs, opset=15, rtol=tol, atol=tol)


def test_batch_normalization_mixed_types(rng):
    inputs = _bn_inputs(rng, (2, 3, 4, 4), np.float16, np.float32)
    check_node("BatchNormalization", inputs, opset=15, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "opset, attrs", [(1, {"consumed_inputs": [0, 0, 0, 1, 1], "is_test": 1}), (6, {})]
)
def test_batch_normalization_v1_and_v6(rng, opset, attrs):
    # ONNX Runtime starts at version 7, which computes the same inference.
    inputs = _bn_inputs(rng, (2, 3, 4, 4))
    expected = _ort_float32("BatchNormalization", inputs, {}, 7)
    _check_against(expected, "BatchNormalization", inputs, attrs, opset, 1e-5, np.float32)


def test_batch_normalization_per_activation(rng):
    # spatial=0: statistics per (C, D1, ...) element.
    x = _data(rng, (2, 3, 4))
    inputs = {"X": x, **{k: _data(rng, (3, 4)) for k in ("scale", "B", "mean")}}
    inputs["var"] = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    check_node("BatchNormalization", inputs, {"spatial": 0}, opset=7, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 5), (1, 2, 2, 3, 4)])
@pytest.mark.parametrize("opset", [14, 15])
@pytest.mark.parametrize("momentum", [None, 0.7])
def test_batch_normalization_training_mode(rng, shape, opset, momentum):
    """Batch statistics normalize X; running_mean/var blend the inputs with them by momentum."""
    attrs = {"training_mode": 1, "epsilon": 1e-3}
    if momentum is not None:
        attrs["momentum"] = momentum
    outputs = ["Y", "running_mean", "running_var"]
    inputs = _bn_inputs(rng, shape)
    check_node(
        "BatchNormalization", inputs, attrs, opset=opset, outputs=outputs, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dtype, param_dtype", [(np.float64, None), (np.float16, np.float32)])
def test_batch_normalization_training_mode_types(rng, dtype, param_dtype):
    # ONNX Runtime has no float16 training kernel; onnx.reference casts the running statistics
    # to X's type, where the spec gives them input_mean's (T2), so check those by hand.
    inputs = _bn_inputs(rng, (2, 3, 4, 4), dtype, param_dtype)
    attrs = {"training_mode": 1, "momentum": 0.8}
    outputs = ["Y", "running_mean", "running_var"]
    if param_dtype is None:
        check_node("BatchNormalization", inputs, attrs, opset=15, outputs=outputs)
        return
    model = make_node_model("BatchNormalization", inputs, attrs, opset=15, outputs=outputs)
    x = inputs["X"].astype(np.float64)
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    shaped = [v.reshape(1, -1, 1, 1) for v in (mean, var, inputs["scale"], inputs["B"])]
    y = (x - shaped[0]) / np.sqrt(shaped[1] + 1e-5) * shaped[2] + shaped[3]
    want = [
        y.astype(np.float16),
        (inputs["mean"] * 0.8 + mean * 0.2).astype(np.float32),
        (inputs["var"] * 0.8 + var * 0.2).astype(np.float32),
    ]
    for mode, got in transmuter_runs(model, inputs).items():
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, rtol=1e-2, atol=1e-2, what=f"output {i} ({mode})")


def test_batch_normalization_v9_training_is_unsupported(rng):
    inputs = _bn_inputs(rng, (2, 3, 4))
    outputs = ["Y", "running_mean", "running_var"]
    model = make_node_model("BatchNormalization", inputs, {}, opset=9, outputs=outputs)
    with pytest.raises(TransmuterError, match="training"):
        transmuter_runs(model, inputs, compiled=False)


@pytest.mark.parametrize(
    "shape, axis, scale_shape",
    [
        ((2, 5), -1, (5,)),
        ((2, 3, 4), -1, (4,)),
        ((2, 3, 4), 1, (3, 4)),
        ((2, 3, 4), -2, (1, 4)),
        ((2, 3, 4, 5), 2, (4, 5)),
        ((2, 3, 4), 0, (2, 3, 4)),
        ((0, 3, 4), -1, (4,)),
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_layer_normalization(rng, shape, axis, scale_shape, bias):
    inputs = {"X": _data(rng, shape), "Scale": _data(rng, scale_shape)}
    if bias:
        inputs["B"] = _data(rng, scale_shape)
    attrs = {"axis": axis, "epsilon": 1e-3}
    outputs = ["Y", "Mean", "InvStdDev"]
    check_node("LayerNormalization", inputs, attrs, opset=17, outputs=outputs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_normalization_dtypes(rng, dtype):
    inputs = {
        "X": _data(rng, (2, 3, 8), dtype),
        "Scale": _data(rng, (8,), dtype),
        "B": _data(rng, (8,), dtype),
    }
    outputs = ["Y", "Mean", "InvStdDev"]
    # ONNX Runtime computes float64 in float64 whatever stash_type says; the spec (and this)
    # computes stage one in float32, so compare at float32 precision there.
    tol = 1e-5 if dtype == np.float64 else _tol(dtype)
    check_node("LayerNormalization", inputs, opset=17, outputs=outputs, rtol=tol, atol=tol)


def test_layer_normalization_y_only_and_symbolic(rng):
    inputs = {"X": _data(rng, (3, 4, 6)), "Scale": _data(rng, (6,))}
    check_node("LayerNormalization", inputs, opset=17, symbolic={"X": [0]}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape, groups", [((2, 6, 4), 3), ((2, 4, 3, 3), 2), ((1, 4, 2, 2, 2), 4), ((2, 4, 5), 1)]
)
@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(rng, shape, groups, opset):
    params = groups if opset == 18 else shape[1]
    inputs = {"X": _data(rng, shape), "scale": _data(rng, (params,)), "bias": _data(rng, (params,))}
    attrs = {"num_groups": groups, "epsilon": 1e-3}
    # ONNX Runtime expands GroupNormalization-18 with per-channel scale, so use onnx.reference.
    reference = "onnx" if opset == 18 else "ort"
    check_node(
        "GroupNormalization", inputs, attrs, opset=opset, reference=reference, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_dtypes(rng, dtype, opset):
    params = 2 if opset == 18 else 4
    inputs = {
        "X": _data(rng, (2, 4, 3, 3), dtype),
        "scale": _data(rng, (params,), dtype),
        "bias": _data(rng, (params,), dtype),
    }
    tol = 1e-5 if dtype == np.float64 else _tol(dtype)
    reference = "onnx" if opset == 18 else "ort"
    check_node(
        "GroupNormalization",
        inputs,
        {"num_groups": 2},
        opset=opset,
        reference=reference,
        rtol=tol,
        atol=tol,
    )


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 2, 3, 4)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_instance_normalization(rng, shape, dtype):
    c = shape[1]
    inputs = {
        "input": _data(rng, shape, dtype),
        "scale": _data(rng, (c,), dtype),
        "B": _data(rng, (c,), dtype),
    }
    tol = _tol(dtype)
    reference = "onnx" if dtype == np.float64 else "ort"  # ONNX Runtime has no float64 kernel
    check_node(
        "InstanceNormalization",
        inputs,
        {"epsilon": 1e-3},
        opset=6,
        reference=reference,
        rtol=tol,
        atol=tol,
    )


@pytest.mark.parametrize("opset", [1, 22])
def test_instance_normalization_versions(rng, opset):
    inputs = {"input": _data(rng, (2, 3, 4, 4)), "scale": _data(rng, (3,)), "B": _data(rng, (3,))}
    # ONNX Runtime starts at version 6 and ends before 22.
    check_node("InstanceNormalization", inputs, opset=opset, reference="onnx", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape, axes",
    [((2, 3, 4, 5), None), ((2, 3, 4, 5), [1]), ((2, 3, 4), [0, 1, 2]), ((2, 3, 4), [-1])],
)
@pytest.mark.parametrize("opset", [9, 13])
def test_mean_variance_normalization(rng, shape, axes, opset):
    attrs = {} if axes is None else {"axes": axes}
    check_node(
        "MeanVarianceNormalization",
        {"X": _data(rng, shape)},
        attrs,
        opset=opset,
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_mean_variance_normalization_dtypes(rng, dtype):
    # The function body adds a float32 epsilon, so neither ONNX Runtime nor onnx.reference run
    # other types; compare with float32.
    inputs = {"X": _data(rng, (2, 3, 4, 5), dtype)}
    expected = _ort_float32("MeanVarianceNormalization", inputs, {}, 13)
    tol = 1e-2 if dtype == np.float16 else 1e-5
    _check_against(expected, "MeanVarianceNormalization", inputs, {}, 13, tol, dtype)


def _lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """LRN as the spec writes it: ONNX Runtime takes only 4-D inputs and odd sizes, and
    onnx.reference sums over the wrong channel range when C > N."""
    x = x.astype(np.float64)
    channels = x.shape[1]
    square_sum = np.zeros_like(x)
    for c in range(channels):
        lo, hi = max(0, c - (size - 1) // 2), min(channels - 1, c + int(np.ceil((size - 1) / 2)))
        square_sum[:, c] = np.sum(x[:, lo : hi + 1] ** 2, axis=1)
    return x / (bias + alpha / size * square_sum) ** beta


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("shape", [(2, 6, 3, 3), (1, 4, 5), (2, 3), (1, 3, 2, 2, 2)])
def test_lrn(rng, size, shape):
    attrs = {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 2.0}
    x = _data(rng, shape)
    if len(shape) == 4 and size % 2:
        check_node("LRN", {"X": x}, attrs, opset=13, rtol=1e-5, atol=1e-5)
    else:
        expected = _lrn(x, size, 0.01, 0.6, 2.0)
        _check_against(expected, "LRN", {"X": x}, attrs, 13, 1e-5, np.float32)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("opset", [1, 13])
def test_lrn_dtypes(rng, dtype, opset):
    x = _data(rng, (1, 5, 3, 3), dtype)
    if dtype == np.float32 or (dtype == np.float16 and opset == 13):
        check_node("LRN", {"X": x}, {"size": 3}, opset=opset, rtol=_tol(dtype), atol=_tol(dtype))
    else:
        tol = 1e-2 if dtype == np.float16 else 1e-10
        _check_against(_lrn(x, 3), "LRN", {"X": x}, {"size": 3}, opset, tol, dtype)


@pytest.mark.parametrize(
    "shape, axis, scale_shape",
    [((2, 5), -1, (5,)), ((2, 3, 4), 1, (3, 4)), ((2, 3, 4), -1, (1, 1, 4)), ((0, 4), -1, (4,))],
)
def test_rms_normalization(rng, shape, axis, scale_shape):
    inputs = {"X": _data(rng, shape), "scale": _data(rng, scale_shape)}
    attrs = {"axis": axis, "epsilon": 1e-3}
    check_node("RMSNormalization", inputs, attrs, opset=23, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rms_normalization_dtypes(rng, dtype):
    inputs = {"X": _data(rng, (2, 3, 8), dtype), "scale": _data(rng, (8,), dtype)}
    tol = 1e-5 if dtype == np.float64 else _tol(dtype)
    check_node("RMSNormalization", inputs, opset=23, rtol=tol, atol=tol)


def test_bfloat16_layer_normalization_against_float32(rng):
    x, scale = _data(rng, (2, 8)), _data(rng, (8,))
    expected = check_node(
        "LayerNormalization", {"X": x, "Scale": scale}, opset=17, rtol=1e-5, atol=1e-5
    )[0]
    inputs = {"X": x.astype(ml_dtypes.bfloat16), "Scale": scale.astype(ml_dtypes.bfloat16)}
    for out in transmuter_runs(
        make_node_model("LayerNormalization", inputs, opset=17), inputs
    ).values():
        assert out[0].dtype == ml_dtypes.bfloat16
        np.testing.assert_allclose(out[0].astype(np.float32), expected, rtol=5e-2, atol=5e-2)
