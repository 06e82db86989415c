"""com.microsoft fused ops (Gelu family, bias ops, FusedMatMul, FusedConv, NhwcConv, Inverse,
Trilu) against ONNX Runtime's CPU kernels, or against NumPy where ORT CPU has no kernel or type."""

import math

import ml_dtypes
import numpy as np
import pytest
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs
from scipy.special import erf

from transmuter.errors import TransmuterError

MS = "com.microsoft"
TOL = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-10}


def _data(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _check_against(expected, op_type, inputs, attrs=None, *, tol, **options):
    """Transmuter's outputs (eager and compiled) against values computed another way."""
    model = make_node_model(op_type, inputs, attrs, domain=MS, **options)
    for mode, outputs in transmuter_runs(model, inputs).items():
        assert len(outputs) == len(expected)
        for i, (got, want) in enumerate(zip(outputs, expected)):
            assert_close(got, want, rtol=tol, atol=tol, what=f"{op_type} output {i} ({mode})")


def _gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _fast_gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# ------------------------------------------------------------------------------ gelu family


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gelu(rng, dtype):
    x = _data(rng, (2, 3, 16), dtype, 3)
    check_node("Gelu", {"X": x}, domain=MS, rtol=TOL[dtype], atol=TOL[dtype], symbolic={"X": [0]})


@pytest.mark.parametrize("dtype", [np.float64, ml_dtypes.bfloat16])
def test_gelu_types_ort_lacks(rng, dtype):
    # ORT CPU has no float64 Erf (its Gelu expands to one) and no bfloat16 kernel.
    x = _data(rng, (3, 8), dtype, 3)
    tol = 1e-10 if dtype == np.float64 else 1e-2
    expected = _gelu(x.astype(np.float64)).astype(dtype)
    _check_against([expected], "Gelu", {"X": x}, tol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bias_gelu(rng, dtype):
    inputs = {"A": _data(rng, (2, 3, 16), dtype, 2), "B": _data(rng, (16,), dtype)}
    check_node("BiasGelu", inputs, domain=MS, rtol=TOL[dtype], atol=TOL[dtype])


def test_bias_gelu_float64(rng):
    # ORT CPU registers BiasGelu for float only.
    a, b = _data(rng, (4, 8), np.float64), _data(rng, (8,), np.float64)
    _check_against([_gelu(a + b)], "BiasGelu", {"A": a, "B": b}, tol=1e-10)


@pytest.mark.parametrize("bias_shape", [(3,), (2, 8)])
def test_bias_gelu_bad_bias(rng, bias_shape):
    # ORT's kernel also rejects a bias that is not an (hidden,) vector.
    inputs = {"A": _data(rng, (2, 8)), "B": _data(rng, bias_shape)}
    model = make_node_model("BiasGelu", inputs, domain=MS)
    with pytest.raises(TransmuterError, match="vector over X's last axis"):
        transmuter_runs(model, inputs, compiled=False)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_gelu(rng, dtype, with_bias):
    inputs = {"X": _data(rng, (2, 5, 8), dtype, 3)}
    if with_bias:
        inputs["bias"] = _data(rng, (8,), dtype)
    tol = TOL[dtype] * (2 if dtype == np.float16 else 1)
    check_node("FastGelu", inputs, domain=MS, rtol=tol, atol=tol, symbolic={"X": [0, 1]})


def test_fast_gelu_bfloat16(rng):
    x = _data(rng, (4, 8), ml_dtypes.bfloat16, 2)
    expected = _fast_gelu(x.astype(np.float64)).astype(ml_dtypes.bfloat16)
    _check_against([expected], "FastGelu", {"X": x}, tol=1e-2)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("attrs", [{}, {"alpha": 1.0}, {"alpha": -0.5}])
def test_quick_gelu(rng, dtype, attrs):
    x = _data(rng, (3, 4, 8), dtype, 3)
    tol = TOL[dtype] * (2 if dtype == np.float16 else 1)
    check_node("QuickGelu", {"X": x}, attrs, domain=MS, rtol=tol, atol=tol)


def test_gelu_zero_size(rng):
    check_node("FastGelu", {"X": _data(rng, (0, 8)), "bias": _data(rng, (8,))}, domain=MS)


# --------------------------------------------------------------------------------- bias ops
# ORT has CUDA kernels only for BiasAdd and BiasSplitGelu: the reference is NumPy.


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bias_add(rng, dtype):
    x, skip = _data(rng, (2, 6, 8), dtype), _data(rng, (2, 6, 8), dtype)
    bias = _data(rng, (8,), dtype)
    wide = x.astype(np.float32) + bias.astype(np.float32) + skip.astype(np.float32)
    _check_against(
        [wide.astype(dtype)],
        "BiasAdd",
        {"X": x, "bias": bias, "skip": skip},
        tol=TOL[dtype],
        symbolic={"X": [0], "skip": [0]},
    )


def test_bias_add_bad_skip(rng):
    inputs = {"X": _data(rng, (2, 6, 8)), "bias": _data(rng, (8,)), "skip": _data(rng, (6, 8))}
    model = make_node_model("BiasAdd", inputs, domain=MS)
    with pytest.raises(TransmuterError, match="BiasAdd"):
        transmuter_runs(model, inputs, compiled=False)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bias_split_gelu(rng, dtype):
    x, bias = _data(rng, (2, 4, 12), dtype, 2), _data(rng, (12,), dtype)
    h = x.astype(np.float64) + bias.astype(np.float64)
    expected = (h[..., :6] * _gelu(h[..., 6:])).astype(dtype)
    _check_against([expected], "BiasSplitGelu", {"X": x, "bias": bias}, tol=TOL[dtype])


def test_bias_split_gelu_odd_hidden(rng):
    inputs = {"X": _data(rng, (1, 2, 5)), "bias": _data(rng, (5,))}
    model = make_node_model("BiasSplitGelu", inputs, domain=MS)
    with pytest.raises(TransmuterError, match="D even"):
        transmuter_runs(model, inputs, compiled=False)


# ---------------------------------------------------------------------------------- matmul


@pytest.mark.parametrize(
    "a_shape, b_shape, attrs",
    [
        ((2, 3, 4), (4, 5), {}),
        ((2, 3, 4), (4, 5), {"alpha": 0.5}),
        ((4, 3), (5, 4), {"transA": 1, "transB": 1}),
        ((2, 4, 3), (4, 5), {"transA": 1, "alpha": -2.0}),
        ((3, 4), (2, 5, 4), {"transB": 1}),
        ((1, 3, 4), (2, 4, 5), {}),
        ((2, 3, 4), (4, 2, 5), {"transBatchB": 1}),
        ((2, 3, 4), (5, 2, 4), {"transBatchB": 1, "transB": 1}),
        ((3, 2, 4), (2, 4, 5), {"transBatchA": 1}),
        ((4, 2, 3), (2, 4, 5), {"transBatchA": 1, "transA": 1}),
        ((3, 2, 6, 4), (4, 2, 6, 5), {"transBatchA": 1, "transBatchB": 1, "alpha": 0.25}),
        ((4,), (4, 5), {"transA": 1}),
        ((4,), (5, 4), {"transB": 1}),
        ((2, 3, 4), (4,), {}),
        ((0, 3, 4), (4, 5), {}),
        ((3, 0), (0, 5), {}),
    ],
)
def test_fused_matmul(rng, a_shape, b_shape, attrs):
    inputs = {"A": _data(rng, a_shape), "B": _data(rng, b_shape)}
    check_node("FusedMatMul", inputs, attrs, domain=MS, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_fused_matmul_dtypes(rng, dtype):
    inputs = {"A": _data(rng, (2, 3, 8), dtype), "B": _data(rng, (5, 8), dtype)}
    tol = 1e-2 if dtype == np.float16 else 1e-10
    attrs = {"transB": 1, "alpha": 0.5}
    check_node("FusedMatMul", inputs, attrs, domain=MS, rtol=tol, atol=tol, symbolic={"A": [0]})


def test_fused_matmul_bfloat16(rng):
    a, b = _data(rng, (3, 8), ml_dtypes.bfloat16), _data(rng, (8, 4), ml_dtypes.bfloat16)
    expected = (2.0 * a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    _check_against([expected], "FusedMatMul", {"A": a, "B": b}, {"alpha": 2.0}, tol=2e-2)


def test_fused_matmul_trans_batch_needs_equal_ranks(rng):
    inputs = {"A": _data(rng, (3, 2, 4)), "B": _data(rng, (4, 5))}
    model = make_node_model("FusedMatMul", inputs, {"transBatchA": 1}, domain=MS)
    with pytest.raises(TransmuterError, match="same rank"):
        transmuter_runs(model, inputs, compiled=False)


# ------------------------------------------------------------------------------------ conv


ACTIVATIONS = [
    {},
    {"activation": "Relu"},
    {"activation": "Tanh"},
    {"activation": "Sigmoid"},
    {"activation": "LeakyRelu", "activation_params": [0.2]},
    {"activation": "Clip", "activation_params": [-0.5, 0.7]},
    {"activation": "HardSigmoid", "activation_params": [0.3, 0.4]},
]


@pytest.mark.parametrize("attrs", ACTIVATIONS, ids=lambda a: a.get("activation", "none"))
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(rng, attrs, with_z):
    inputs = {"X": _data(rng, (2, 4, 6, 6)), "W": _data(rng, (6, 4, 3, 3)), "B": _data(rng, (6,))}
    if with_z:
        inputs["Z"] = _data(rng, (2, 6, 4, 4))
    check_node("FusedConv", inputs, attrs, domain=MS, rtol=1e-5, atol=1e-5, symbolic={"X": [0]})


@pytest.mark.parametrize(
    "conv_attrs",
    [
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        {"dilations": [2, 2]},
        {"group": 2, "kernel_shape": [3, 3]},
    ],
)
def test_fused_conv_attributes(rng, conv_attrs):
    group = conv_attrs.get("group", 1)
    inputs = {
        "X": _data(rng, (1, 4, 7, 7)),
        "W": _data(rng, (6, 4 // group, 3, 3)),
        "B": None,
        "Z": None,
    }
    attrs = {"activation": "Relu", **conv_attrs}
    check_node("FusedConv", inputs, attrs, domain=MS, rtol=1e-5, atol=1e-5)


def test_fused_conv_z_without_bias_1d(rng):
    inputs = {"X": _data(rng, (2, 3, 9)), "W": _data(rng, (4, 3, 3)), "B": None}
    inputs["Z"] = _data(rng, (2, 4, 7))
    attrs = {"activation": "Clip", "activation_params": [0.0, 6.0]}
    check_node("FusedConv", inputs, attrs, domain=MS, rtol=1e-5, atol=1e-5)


def test_fused_conv_float16(rng):
    inputs = {
        "X": _data(rng, (1, 4, 6, 6), np.float16),
        "W": _data(rng, (6, 4, 3, 3), np.float16, 0.3),
        "B": _data(rng, (6,), np.float16),
        "Z": _data(rng, (1, 6, 4, 4), np.float16),
    }
    check_node("FusedConv", inputs, {"activation": "Sigmoid"}, domain=MS, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"activation": "Elu"}, "not one of"),
        ({"activation": "LeakyRelu"}, "takes 1 activation_params"),
        ({"activation": "Clip", "activation_params": [0.0]}, "takes 2 activation_params"),
    ],
)
def test_fused_conv_bad_activation(rng, attrs, match):
    inputs = {"X": _data(rng, (1, 2, 4, 4)), "W": _data(rng, (3, 2, 3, 3))}
    model = make_node_model("FusedConv", inputs, attrs, domain=MS)
    with pytest.raises(TransmuterError, match=match):
        transmuter_runs(model, inputs, compiled=False)


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 7, 7, 4), (6, 3, 3, 4), {}),
        ((1, 7, 7, 4), (6, 3, 3, 4), {"pads": [1, 0, 1, 2], "strides": [2, 1]}),
        ((1, 8, 8, 4), (8, 3, 3, 2), {"group": 2, "auto_pad": "SAME_LOWER"}),
        ((1, 8, 8, 4), (4, 3, 3, 1), {"group": 4, "dilations": [2, 2]}),
        ((2, 9, 3), (5, 3, 3), {"strides": [2]}),
        ((1, 6, 6, 3), (6, 3, 3, 1), {"group": 3, "pads": [1, 1, 1, 1]}),  # depthwise, x2
        # 1x1 kernels run as matrix products: strided, under auto_pad, and padded (a conv).
        ((1, 7, 7, 4), (6, 1, 1, 4), {"strides": [2, 2]}),
        ((2, 5, 5, 4), (6, 1, 1, 4), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        ((1, 5, 5, 4), (6, 1, 1, 4), {"pads": [1, 0, 0, 1]}),
        ((2, 9, 3), (5, 1, 3), {}),
    ],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_nhwc_conv(rng, x_shape, w_shape, attrs, with_bias):
    # ORT runs NhwcConv on CUDA only: the reference is its CPU Conv on the NCHW/OIHW transposes
    # (W is Conv's weight transposed by (0, 2, 3, 1), as ORT's NhwcConv fusion makes it).
    x, w = _data(rng, x_shape), _data(rng, w_shape)
    b = _data(rng, (w_shape[0],)) if with_bias else None
    to_first = (0, x.ndim - 1, *range(1, x.ndim - 1))
    nchw = {"X": x.transpose(to_first), "W": w.transpose(to_first), "B": b}
    expected = ort_run(make_node_model("Conv", nchw, attrs, opset=13), nchw)[0]
    expected = expected.transpose(0, *range(2, x.ndim), 1)
    _check_against(
        [expected], "NhwcConv", {"X": x, "W": w, "B": b}, attrs, tol=1e-5, symbolic={"X": [0]}
    )


def test_nhwc_conv_float16(rng):
    x, w = _data(rng, (1, 6, 6, 4), np.float16), _data(rng, (3, 3, 3, 4), np.float16, 0.3)
    nchw = {"X": x.transpose(0, 3, 1, 2), "W": w.transpose(0, 3, 1, 2)}
    expected = ort_run(make_node_model("Conv", nchw, opset=13), nchw)[0].transpose(0, 2, 3, 1)
    _check_against([expected], "NhwcConv", {"X": x, "W": w}, tol=5e-3)


# --------------------------------------------------------------------------------- linalg


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 0, 2, 2)])
def test_inverse(rng, dtype, shape):
    # Well-conditioned matrices: a random one plus a multiple of the identity.
    x = (_data(rng, shape) + 4 * np.eye(shape[-1], dtype=np.float32)).astype(dtype)
    tol = {np.float16: 5e-3, np.float32: 1e-5, np.float64: 1e-10}[dtype]
    check_node("Inverse", {"X": x}, domain=MS, rtol=tol, atol=tol)


def test_inverse_symbolic_batch(rng):
    x = _data(rng, (3, 4, 4)) + 4 * np.eye(4, dtype=np.float32)
    check_node("Inverse", {"X": x}, domain=MS, rtol=1e-5, atol=1e-5, symbolic={"X": [0]})


def test_inverse_needs_square(rng):
    inputs = {"X": _data(rng, (3, 4))}
    model = make_node_model("Inverse", inputs, domain=MS)
    with pytest.raises(TransmuterError, match="M, M"):
        transmuter_runs(model, inputs, compiled=False)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -5])
def test_trilu(rng, upper, k):
    inputs = {"X": _data(rng, (2, 4, 5))}
    if k is not None:
        inputs["k"] = np.array(k, np.int64)
    check_node(
        "Trilu",
        inputs,
        {"upper": upper},
        domain=MS,
        constants=["k"],
        input_names=["X", "k"],
        symbolic={"X": [0]},
    )


@pytest.mark.parametrize("dtype", [np.int64, np.float16, np.float64])
def test_trilu_dtypes(rng, dtype):
    x = rng.integers(0, 3, (3, 3)).astype(dtype)
    check_node("Trilu", {"X": x}, {"upper": 0}, domain=MS)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_, ml_dtypes.bfloat16])
def test_trilu_types_ort_lacks(rng, dtype):
    # ORT CPU's com.microsoft Trilu runs float, double, float16 and int64 only.
    x = rng.integers(0, 3, (2, 3, 4)).astype(dtype)
    inputs = {"X": x, "k": np.array(1, np.int64)}
    _check_against([np.triu(x, 1)], "Trilu", inputs, tol=0, constants=["k"])


def test_trilu_zero_size(rng):
    check_node("Trilu", {"X": _data(rng, (0, 3, 3))}, domain=MS)
