"""com.microsoft quantized operators against ONNX Runtime's CPU kernels.

Exact where ONNX Runtime's arithmetic is reproduced exactly (QLinearAveragePool too: its window
sums are added in ORT's order). Within one quantization step where its kernels compute in another
way: QLinearSigmoid (its logistic approximation) and QLinearSoftmax (a float exponential table
summed in order); there the test also bounds how many outputs may differ.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from opcheck import (
    as_uint8,
    assert_close,
    check_node,
    feeds,
    make_node_model,
    ort_may_saturate,
    ort_run,
    portable_reference,
    transmuter_runs,
)

from transmuter.errors import TransmuterError

MS = "com.microsoft"
F32 = np.float32
INT8 = [np.uint8, np.int8]


def rand_q(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def check_within_one_step(op_type, inputs, attrs=None, *, most=0.02, **options):
    """Outputs equal ONNX Runtime's dtype and shape, within 1 of its values, and equal in all
    but a fraction `most` of them."""
    model = make_node_model(op_type, inputs, attrs, domain=MS, **options)
    (expected,) = ort_run(model, inputs)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        got = np.asarray(got)
        assert got.dtype == expected.dtype and got.shape == expected.shape, mode
        diff = np.abs(got.astype(np.int32) - expected.astype(np.int32))
        assert diff.max(initial=0) <= 1, f"{op_type} ({mode}): off by {diff.max()}"
        assert (diff != 0).mean() <= most if diff.size else True, (
            f"{op_type} ({mode}): {(diff != 0).sum()} of {diff.size} outputs differ by one"
        )
    return expected


# QuantizeLinear / DequantizeLinear (ONNX Runtime's contrib versions)

X = (np.random.default_rng(7).standard_normal((2, 3, 4)) * 40).astype(F32)


@pytest.mark.parametrize(
    "scale,zero,attrs",
    [
        (F32(0.5), np.uint8(3), {}),
        (F32(0.5), None, {}),
        (np.array([0.5, 0.25, 1.0], F32), np.array([1, -2, 3], np.int8), {}),
        (np.array([0.5, 0.25, 1.0, 2.0], F32), np.array([1, 2, 3, 4], np.int16), {"axis": -1}),
        (F32(0.01), np.uint16(300), {}),
        (np.array([0.5, 2.0], F32), np.array([4, 9], np.uint8), {"axis": 0}),
    ],
)
def test_quantize_linear(scale, zero, attrs):
    for dtype in (np.float32, np.float16):
        inputs = {"x": X.astype(dtype), "s": np.asarray(scale).astype(dtype), "z": zero}
        check_node("QuantizeLinear", inputs, attrs, domain=MS)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32])
@pytest.mark.parametrize("per_axis", [False, True])
def test_dequantize_linear(dtype, per_axis, rng):
    x = rng.integers(0, 100, (2, 3, 4)).astype(dtype)
    scale = np.array([0.5, 0.25, 0.1], F32) if per_axis else F32(0.37)
    zero = np.array([1, 2, 3], dtype) if per_axis else dtype(7)
    check_node("DequantizeLinear", {"x": x, "s": scale, "z": zero}, domain=MS)
    check_node("DequantizeLinear", {"x": x, "s": np.float16(0.5)}, domain=MS)


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_quantize_dequantize_int4(dtype):
    # ONNX Runtime cannot return int4 tensors to Python: compare the round trip.
    zero = onnx.numpy_helper.from_array(np.array(3, dtype), "z")
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS),
        ],
        "roundtrip",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [onnx.numpy_helper.from_array(F32(4.0), "s"), zero],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 10
    inputs = {"x": X}
    (expected,) = ort_run(model, inputs)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert_close(got, expected, rtol=0, atol=0, what=mode)


# Elementwise QLinear ops

# Scale ratios that put many results exactly on .5, and ordinary ones.
TIE_PARAMS = [(1.0, 0, 1.0, 1, 2.0, 1), (0.5, 2, 0.25, 7, 1.0, 3), (0.02, 3, 0.03, 9, 0.05, 11)]


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", INT8)
@pytest.mark.parametrize("params", TIE_PARAMS)
def test_qlinear_binary(op_type, dtype, params, rng):
    sa, za, sb, zb, sc, zc = params
    inputs = {
        "A": rand_q(rng, dtype, (3, 4, 5)),
        "A_scale": F32(sa),
        "A_zero_point": dtype(za),
        "B": rand_q(rng, dtype, (4, 1)),
        "B_scale": F32(sb),
        "B_zero_point": dtype(zb),
        "C_scale": F32(sc),
        "C_zero_point": dtype(zc),
    }
    check_node(op_type, inputs, domain=MS, symbolic={"A": [0]})


def check_absent_zero_points(op_type, inputs, attrs=None):
    """Absent zero points act as zeros of the data type. ONNX Runtime's type inference rejects
    these nodes when a zero point is absent, so it runs them with explicit zeros."""
    zeros = {k: (np.zeros((), inputs["X"].dtype) if v is None else v) for k, v in inputs.items()}
    (expected,) = ort_run(make_node_model(op_type, zeros, attrs, domain=MS), zeros)
    model = make_node_model(op_type, inputs, attrs, domain=MS)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert_close(got, expected, rtol=0, atol=0, what=mode)


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", INT8)
def test_qlinear_binary_without_zero_points(op_type, dtype, rng):
    inputs = {
        "X": rand_q(rng, dtype, (2, 6)),
        "A_scale": F32(0.1),
        "A_zero_point": None,
        "B": rand_q(rng, dtype, (2, 6)),
        "B_scale": F32(0.3),
        "B_zero_point": None,
        "C_scale": F32(0.2),
        "C_zero_point": None,
    }
    check_absent_zero_points(op_type, inputs)


ALL_UINT8 = np.arange(256).astype(np.uint8).reshape(16, 16)
ALL_INT8 = np.arange(-128, 128).astype(np.int8).reshape(16, 16)
UNARY_PARAMS = [(0.1, 3, 1 / 256, 0), (1.0, 0, 2.0, 1), (0.02, 10, 0.004, 20), (0.5, -5, 0.25, 3)]


def unary_inputs(dtype, params) -> dict:
    """Every value of the 8-bit type through a unary QLinear op: (x_scale, x_zero, y_scale,
    y_zero) in `params`, a negative x zero wrapped into uint8's range."""
    xs, xz, ys, yz = params
    return {
        "X": ALL_UINT8 if dtype == np.uint8 else ALL_INT8,
        "X_scale": F32(xs),
        "X_zero_point": dtype(xz % 256 if dtype == np.uint8 else xz),
        "Y_scale": F32(ys),
        "Y_zero_point": dtype(yz),
    }


@pytest.mark.parametrize("dtype", INT8)
@pytest.mark.parametrize("params", UNARY_PARAMS)
def test_qlinear_leaky_relu(dtype, params):
    inputs = unary_inputs(dtype, params)
    check_node("QLinearLeakyRelu", inputs, {"alpha": 0.5}, domain=MS)
    check_node("QLinearLeakyRelu", inputs, domain=MS)


@pytest.mark.parametrize("dtype", INT8)
@pytest.mark.parametrize("params", UNARY_PARAMS)
def test_qlinear_sigmoid(dtype, params):
    # ONNX Runtime tabulates its own logistic approximation: equal within one step.
    inputs = unary_inputs(dtype, params)
    check_within_one_step("QLinearSigmoid", inputs)


@pytest.mark.parametrize("op_type", ["QLinearLeakyRelu", "QLinearSigmoid"])
@pytest.mark.parametrize("x", [ALL_UINT8, ALL_INT8], ids=["uint8", "int8"])
def test_qlinear_unary_without_zero_points(op_type, x):
    inputs = {
        "X": x,
        "X_scale": F32(0.05),
        "X_zero_point": None,
        "Y_scale": F32(0.01),
        "Y_zero_point": None,
    }
    check_absent_zero_points(op_type, inputs)


# QLinearSoftmax: ONNX Runtime scales by floor(1 / y_scale) and sums a float table in order.


@pytest.mark.parametrize(
    "dtype,y_zero,y_scale,opset,axis",
    [
        (np.uint8, 0, 1 / 256, 13, -1),
        (np.uint8, 0, 1 / 255, 13, 1),
        (np.uint8, 10, 0.01, 12, 1),
        (np.uint8, 0, 0.35, 12, -1),
        (np.int8, -128, 1 / 256, 13, -1),
        (np.int8, -128, 1 / 255, 12, 1),
        (np.int8, 0, 0.01, 13, 0),
        (np.int8, -100, 0.35, 12, 0),
    ],
)
def test_qlinear_softmax(dtype, y_zero, y_scale, opset, axis, rng):
    inputs = {
        "X": rand_q(rng, dtype, (3, 5, 7)),
        "X_scale": F32(0.05),
        "x_zero_point": dtype(3),
        "y_scale": F32(y_scale),
        "y_zero_point": dtype(y_zero),
    }
    check_within_one_step("QLinearSoftmax", inputs, {"opset": opset, "axis": axis})


def test_qlinear_softmax_floors_the_inverse_scale():
    # One element per row: probability 1, and 1 / f32(1/7) = 6.9999995, which ONNX Runtime
    # floors to 6 (exact math would round to 7).
    inputs = {
        "X": np.full((2, 1), 100, np.uint8),
        "X_scale": F32(0.1),
        "x_zero_point": np.uint8(0),
        "y_scale": F32(1 / 7),
        "y_zero_point": np.uint8(0),
    }
    expected = check_node("QLinearSoftmax", inputs, {"opset": 13}, domain=MS)
    assert expected[0].tolist() == [[6], [6]]


# Pools and reductions


POOLS = [
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, (2, 3, 6, 6), np.uint8, 0),
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, (1, 2, 5, 5), np.int8, 1),
    (
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        (1, 2, 5, 5),
        np.uint8,
        1,
    ),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}, (1, 2, 6, 5), np.int8, 0),
    (
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
        (1, 2, 7, 6),
        np.uint8,
        0,
    ),
    ({"kernel_shape": [3, 3], "strides": [2, 1], "auto_pad": "VALID"}, (2, 7, 6, 3), np.int8, 1),
    ({"kernel_shape": [3], "strides": [1]}, (2, 3, 9), np.int8, 0),
]


@pytest.mark.parametrize("attrs,shape,dtype,channels_last", POOLS)
def test_qlinear_average_pool(attrs, shape, dtype, channels_last, rng):
    if channels_last:
        shape = (shape[0], *shape[2:], shape[1])
    inputs = {
        "X": rand_q(rng, dtype, shape),
        "x_scale": F32(0.1),
        "x_zero_point": dtype(2),
        "y_scale": F32(0.07),
        "y_zero_point": dtype(5),
    }
    # Exact: the window is summed in ONNX Runtime's order (row-major taps) with rounded products.
    check_node("QLinearAveragePool", inputs, {**attrs, "channels_last": channels_last}, domain=MS)


def test_qlinear_average_pool_rounds_after_the_zero_point(rng):
    # Scales 1 and 2 put every other mean on .5: the zero point (odd) is added before rounding.
    inputs = {
        "X": rand_q(rng, np.uint8, (2, 3, 6, 6)),
        "x_scale": F32(1.0),
        "x_zero_point": np.uint8(1),
        "y_scale": F32(2.0),
        "y_zero_point": np.uint8(3),
    }
    check_node("QLinearAveragePool", inputs, {"kernel_shape": [2, 2], "strides": [2, 2]}, domain=MS)


@pytest.mark.parametrize("dtype,channels_last", [(np.uint8, 0), (np.int8, 1)])
@pytest.mark.parametrize("params", [(0.1, 2, 0.07, 5), (1.0, 0, 3.0, 1), (0.013, 7, 0.011, 3)])
def test_qlinear_global_average_pool(dtype, channels_last, params, rng):
    xs, xz, ys, yz = params
    inputs = {
        "X": rand_q(rng, dtype, (2, 7, 5, 9)),
        "x_scale": F32(xs),
        "x_zero_point": dtype(xz),
        "y_scale": F32(ys),
        "y_zero_point": dtype(yz),
    }
    check_node(
        "QLinearGlobalAveragePool",
        inputs,
        {"channels_last": channels_last},
        domain=MS,
        symbolic={"X": [0]},
    )


@pytest.mark.parametrize("dtype", INT8)
@pytest.mark.parametrize("axes,keepdims", [((1,), 1), ((0, -1), 0), ((2,), 0)])
def test_qlinear_reduce_mean(dtype, axes, keepdims, rng):
    # ONNX Runtime has no CPU kernel: the spec's Dequantize -> ReduceMean -> Quantize, in
    # float32. Power-of-two scales keep every sum exact, so the many ties round the same way.
    x = rand_q(rng, dtype, (3, 4, 5))
    zero = dtype(-7 if dtype == np.int8 else 7)
    inputs = {
        "data": x,
        "data_scale": F32(0.125),
        "data_zero_point": dtype(3),
        "reduced_scale": F32(0.25),
        "reduced_zero_point": zero,
    }
    model = make_node_model(
        "QLinearReduceMean", inputs, {"axes": list(axes), "keepdims": keepdims}, domain=MS
    )
    values = (x.astype(F32) - F32(3)) * F32(0.125)
    count = F32(np.prod([x.shape[a] for a in axes]))
    mean = values.sum(axis=axes, keepdims=bool(keepdims), dtype=F32) / count
    info = np.iinfo(dtype)
    expected = np.clip(np.round(mean / F32(0.25)) + zero, info.min, info.max).astype(dtype)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert_close(got, expected, rtol=0, atol=0, what=mode)


# QLinearConcat and QLinearWhere requantize through ONNX Runtime's tables: QuantizeLinear of
# the dequantized value (rounded, then the zero point added).

REQUANT_PARAMS = [(1, 0, 1, 1, 2, 1), (1, 3, 2, 0, 2, 5), (0.013, 7, 0.021, 3, 0.05, 9)]


@pytest.mark.parametrize("dtype", INT8)
@pytest.mark.parametrize("params", REQUANT_PARAMS)
def test_qlinear_concat(dtype, params, rng):
    sa, za, sb, zb, sy, zy = params
    inputs = {
        "Y_scale": F32(sy),
        "Y_zero_point": dtype(zy),
        "A": rand_q(rng, dtype, (2, 3, 4)),
        "sa": F32(sa),
        "za": dtype(za),
        "B": rand_q(rng, dtype, (2, 5, 4)),
        "sb": F32(sb),
        "zb": dtype(zb),
        "C": rand_q(rng, dtype, (2, 1, 4)),
        "sc": F32(sy),
        "zc": dtype(zy),
    }
    check_node("QLinearConcat", inputs, {"axis": -2}, domain=MS, symbolic={"A": [0]})


@pytest.mark.parametrize("dtype", INT8)
@pytest.mark.parametrize("params", REQUANT_PARAMS)
def test_qlinear_where(dtype, params, rng):
    sx, zx, sy, zy, sz, zz = params
    inputs = {
        "condition": rng.integers(0, 2, (5, 1)).astype(bool),
        "X": rand_q(rng, dtype, (3, 5, 4)),
        "x_scale": F32(sx),
        "x_zero_point": dtype(zx),
        "Y": rand_q(rng, dtype, (4,)),
        "y_scale": F32(sy),
        "y_zero_point": dtype(zy),
        "z_scale": F32(sz),
        "z_zero_point": dtype(zz),
    }
    check_node("QLinearWhere", inputs, domain=MS)


# QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat. ONNX Runtime's u8 x s8 products may
# saturate on CPUs without VNNI (opcheck.PAIR_LIMIT): where they can, the reference is ORT on the
# same products with the int8 operand moved to uint8 (opcheck.portable_reference).

# The int8 x uint8 and int8 A x uint8 B pairs have no ONNX Runtime CPU kernel.
GEMM_TYPES = [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)]


@pytest.mark.parametrize("a_type,b_type", GEMM_TYPES)
@pytest.mark.parametrize(
    "trans,per_column,output",
    [
        ((0, 0), False, "float"),
        ((1, 1), True, "quantized"),
        ((0, 1), True, "float"),
        ((1, 0), False, "quantized"),
    ],
)
def test_qgemm(a_type, b_type, trans, per_column, output, rng):
    m, k, n = 4, 6, 5
    ta, tb = trans
    a = rand_q(rng, a_type, (k, m) if ta else (m, k))
    b = rand_q(rng, b_type, (n, k) if tb else (k, n))
    b_scale = rng.uniform(0.01, 0.05, n).astype(F32) if per_column else F32(0.02)
    b_zero = rand_q(rng, b_type, (n,)) if per_column else b_type(2)
    inputs = {
        "A": a,
        "a_scale": F32(0.1),
        "a_zero_point": a_type(1),
        "B": b,
        "b_scale": b_scale,
        "b_zero_point": b_zero,
        "C": rng.integers(-1000, 1000, (n,)).astype(np.int32),
    }
    if output == "quantized":
        inputs["y_scale"] = F32(0.5)
        inputs["y_zero_point"] = a_type(3)
    attrs = {"transA": ta, "transB": tb, "alpha": 2.0}
    check_qgemm(inputs, attrs)


def check_qgemm(inputs, attrs=None):
    products = [("A", "B", "b_zero_point")]
    expected = portable_reference("QGemm", inputs, attrs, products=products, domain=MS)
    check_node("QGemm", inputs, attrs, domain=MS, expected=expected)


@pytest.mark.parametrize("c_shape", [None, (), (4, 5), (1, 5), (4, 1)])
def test_qgemm_bias_shapes(c_shape, rng):
    inputs = {
        "A": rand_q(rng, np.uint8, (4, 6)),
        "a_scale": F32(0.1),
        "a_zero_point": np.uint8(128),
        "B": rand_q(rng, np.int8, (6, 5)),
        "b_scale": F32(0.02),
        "b_zero_point": np.int8(0),
        "C": None if c_shape is None else rng.integers(-99, 99, c_shape).astype(np.int32),
        "y_scale": F32(0.25),
        "y_zero_point": np.uint8(100),
    }
    check_qgemm(inputs)


def test_qgemm_y_scale_without_zero_point_stays_float(rng):
    # ONNX Runtime returns the float result divided by y_scale when y_zero_point is absent.
    inputs = {
        "A": rand_q(rng, np.int8, (3, 4)),
        "a_scale": F32(0.1),
        "a_zero_point": np.int8(1),
        "B": rand_q(rng, np.int8, (4, 5)),
        "b_scale": F32(0.02),
        "b_zero_point": np.int8(0),
        "C": None,
        "y_scale": F32(0.5),
    }
    check_node("QGemm", inputs, domain=MS)


@pytest.mark.parametrize("b_type", INT8)
@pytest.mark.parametrize("per_column,with_bias", [(False, False), (True, True)])
def test_dynamic_quantize_matmul(b_type, per_column, with_bias, rng):
    n = 5
    inputs = {
        "A": rng.standard_normal((2, 3, 8)).astype(F32),
        "B": rand_q(rng, b_type, (8, n)),
        "b_scale": rng.uniform(0.01, 0.05, n).astype(F32) if per_column else F32(0.02),
        "b_zero_point": rand_q(rng, b_type, (n,)) if per_column else b_type(3),
        "bias": rng.standard_normal(n).astype(F32) if with_bias else None,
    }
    options = dict(domain=MS, constants=["B", "b_scale", "b_zero_point", "bias"])
    check_dynamic_quantize_matmul(inputs, symbolic={"A": [0]}, **options)


def check_dynamic_quantize_matmul(inputs, **options):
    # A is quantized to uint8 inside the op: the product is u8 x B.
    expected = portable_reference(
        "DynamicQuantizeMatMul", inputs, products=[(None, "B", "b_zero_point")], **options
    )
    check_node("DynamicQuantizeMatMul", inputs, expected=expected, rtol=1e-5, atol=1e-5, **options)


@pytest.mark.parametrize("a", [np.zeros((3, 8), F32), -np.ones((3, 8), F32), np.ones((0, 8), F32)])
def test_dynamic_quantize_matmul_degenerate_ranges(a, rng):
    inputs = {"A": a, "B": rand_q(rng, np.int8, (8, 5)), "b_scale": F32(0.02), "b_zero_point": None}
    check_dynamic_quantize_matmul(inputs, domain=MS)


@pytest.mark.parametrize("a_type,b_type", GEMM_TYPES)
@pytest.mark.parametrize("zeros", ["absent", "scalar", "per_column"], ids=lambda z: f"zero_{z}")
def test_matmul_integer_to_float(a_type, b_type, zeros, rng):
    n = 5
    inputs = {
        "A": rand_q(rng, a_type, (2, 3, 8)),
        "B": rand_q(rng, b_type, (8, n)),
        "a_scale": F32(0.07),
        "b_scale": rng.uniform(0.01, 0.05, n).astype(F32),
        "a_zero_point": None if zeros == "absent" else a_type(3),
        "b_zero_point": {
            "absent": None,
            "scalar": b_type(5),
            "per_column": rand_q(rng, b_type, (n,)),
        }[zeros],
        "bias": rng.standard_normal(n).astype(F32),
    }
    check_matmul_integer_to_float(inputs, rtol=1e-5, atol=1e-5)


def check_matmul_integer_to_float(inputs, **tolerances):
    products = [("A", "B", "b_zero_point")]
    if inputs["A"].dtype == np.int8:  # the int8 x uint8 pair: A is the int8 side
        products = [("B", "A", "a_zero_point")]
    expected = portable_reference("MatMulIntegerToFloat", inputs, products=products, domain=MS)
    check_node("MatMulIntegerToFloat", inputs, domain=MS, expected=expected, **tolerances)


def test_matmul_integer_to_float_per_column_a_scale(rng):
    n = 5
    inputs = {
        "A": rand_q(rng, np.uint8, (3, 8)),
        "B": rand_q(rng, np.int8, (8, n)),
        "a_scale": rng.uniform(0.05, 0.1, n).astype(F32),
        "b_scale": F32(0.03),
        "a_zero_point": np.uint8(3),
        "b_zero_point": None,
        "bias": rng.standard_normal(n).astype(F32),
    }
    check_matmul_integer_to_float(inputs, rtol=1e-5, atol=1e-5)
    # With both scales per column, ONNX Runtime 1.32 computes (acc * a_scale + bias) * b_scale,
    # scaling the bias; with either one a scalar it adds the bias unscaled. Transmuter always
    # computes acc * a_scale * b_scale + bias.
    inputs["b_scale"] = rng.uniform(0.01, 0.05, n).astype(F32)
    model = make_node_model("MatMulIntegerToFloat", inputs, domain=MS)
    acc = (inputs["A"].astype(np.int64) - 3) @ inputs["B"].astype(np.int64)
    expected = (acc * inputs["a_scale"] * inputs["b_scale"] + inputs["bias"]).astype(F32)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert_close(got, expected, rtol=1e-5, atol=1e-5, what=mode)


def test_matmul_integer_to_float_float16(rng):
    inputs = {
        "A": rand_q(rng, np.uint8, (4, 8)),
        "B": rand_q(rng, np.int8, (2, 8, 5)),
        "a_scale": np.float16(0.01),
        "b_scale": np.float16(0.02),
        "a_zero_point": np.uint8(3),
        "b_zero_point": None,
        "bias": rng.standard_normal(5).astype(np.float16),
    }
    check_matmul_integer_to_float(inputs, rtol=1e-3, atol=2e-3)


# DynamicQuantizeLSTM: ONNX Runtime quantizes the hidden state per chunk of the batch, one chunk
# per thread; with one thread it is Transmuter's whole-batch quantization.


def check_lstm(inputs, attrs, *, tol=2e-5):
    constants = ["W", "R", "W_scale", "W_zero_point", "R_scale", "R_zero_point"]
    options = dict(domain=MS, outputs=3, constants=constants)
    model = make_node_model("DynamicQuantizeLSTM", inputs, attrs, **options)
    # X and the hidden state are quantized to uint8 inside the op: u8 x W and u8 x R, which ORT
    # may saturate (opcheck.PAIR_LIMIT); the reference then takes W and R moved to uint8.
    reference = dict(inputs)
    for weight in ("W", "R"):
        if ort_may_saturate(np.full(1, 255, np.uint8), np.asarray(inputs[weight])):
            reference[weight], reference[f"{weight}_zero_point"] = as_uint8(
                inputs[weight], inputs[f"{weight}_zero_point"]
            )
    reference_model = make_node_model("DynamicQuantizeLSTM", reference, attrs, **options)
    ort_options = ort.SessionOptions()
    ort_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        reference_model.SerializeToString(), ort_options, providers=["CPUExecutionProvider"]
    )
    expected = session.run(None, feeds(reference_model, reference))
    for mode, outputs in transmuter_runs(model, inputs).items():
        for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            assert_close(got, want, rtol=tol, atol=tol, what=f"output {i} ({mode})")


def lstm_inputs(rng, w_type, per_column, num_dir=1, steps=5, batch=3, size=6, hidden=4):
    low = -127 if w_type == np.int8 else 0
    high = 128 if w_type == np.int8 else 256
    shape = (num_dir, 4 * hidden) if per_column else (num_dir,)
    # ONNX Runtime takes int8 weights with zero points 0 only, and per-column zero points only
    # when they are all equal.
    zero_high = 1 if w_type == np.int8 else 256
    zero = np.full(shape, rng.integers(0, zero_high), w_type)
    return {
        "X": rng.standard_normal((steps, batch, size)).astype(F32),
        "W": rng.integers(low, high, (num_dir, size, 4 * hidden)).astype(w_type),
        "R": rng.integers(low, high, (num_dir, hidden, 4 * hidden)).astype(w_type),
        "B": (rng.standard_normal((num_dir, 8 * hidden)) * 0.1).astype(F32),
        "sequence_lens": None,
        "initial_h": None,
        "initial_c": None,
        "P": None,
        "W_scale": rng.uniform(0.003, 0.01, shape).astype(F32),
        "W_zero_point": zero,
        "R_scale": rng.uniform(0.003, 0.01, shape).astype(F32),
        "R_zero_point": zero,
    }


@pytest.mark.parametrize(
    "w_type,per_column,direction",
    [
        (np.uint8, False, "forward"),
        (np.uint8, True, "reverse"),
        (np.int8, True, "forward"),
        (np.int8, False, "bidirectional"),
    ],
)
def test_dynamic_quantize_lstm(w_type, per_column, direction, rng):
    num_dir = 2 if direction == "bidirectional" else 1
    inputs = lstm_inputs(rng, w_type, per_column, num_dir)
    check_lstm(inputs, {"hidden_size": 4, "direction": direction})


def test_dynamic_quantize_lstm_states_peepholes_clip(rng):
    inputs = lstm_inputs(rng, np.uint8, False, 2)
    inputs["initial_h"] = rng.standard_normal((2, 3, 4)).astype(F32) * 0.5
    inputs["initial_c"] = rng.standard_normal((2, 3, 4)).astype(F32) * 0.5
    inputs["P"] = rng.standard_normal((2, 12)).astype(F32) * 0.3
    attrs = {"hidden_size": 4, "direction": "bidirectional", "clip": 0.8, "input_forget": 1}
    check_lstm(inputs, attrs)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_dynamic_quantize_lstm_sequence_lens(direction, rng):
    # The longest sequence (5) is shorter than X (6 steps): X's range leaves out the last step.
    num_dir = 2 if direction == "bidirectional" else 1
    inputs = lstm_inputs(rng, np.uint8, True, num_dir, steps=6, batch=4)
    inputs["sequence_lens"] = np.array([5, 2, 4, 3], np.int32)
    inputs["X"][5] *= 10
    check_lstm(inputs, {"hidden_size": 4, "direction": direction})


@pytest.mark.parametrize(
    "activations",
    [
        ["HardSigmoid", "Tanh", "Softsign"],
        # directions that differ run one by one, not as one batched step
        ["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "Tanh", "Tanh"],
    ],
)
def test_dynamic_quantize_lstm_activations(activations, rng):
    num_dir = len(activations) // 3
    inputs = lstm_inputs(rng, np.int8, False, num_dir)
    attrs = {
        "hidden_size": 4,
        "direction": "bidirectional" if num_dir == 2 else "forward",
        "activations": activations,
        "activation_alpha": [0.3],
        "activation_beta": [0.4],
    }
    check_lstm(inputs, attrs)


@pytest.mark.parametrize(
    "op_type,inputs",
    [
        (
            "QLinearAdd",
            {
                "A": np.zeros((2,), np.uint8),
                "A_scale": np.ones((2,), F32),
                "A_zero_point": None,
                "B": np.zeros((2,), np.uint8),
                "B_scale": F32(1),
                "B_zero_point": None,
                "C_scale": F32(1),
            },
        ),
        (
            "QLinearConcat",
            {"Y_scale": F32(1), "Y_zero_point": np.uint8(0), "A": np.zeros(2, np.uint8)},
        ),
    ],
)
def test_rejects(op_type, inputs):
    model = make_node_model(
        op_type, inputs, {"axis": 0} if op_type == "QLinearConcat" else {}, domain=MS
    )
    with pytest.raises(TransmuterError):
        transmuter_runs(model, inputs, compiled=False)


@pytest.mark.parametrize(
    "attrs",
    [{"kernel_shape": [2, 2], "strides": [1, 1]}, {"kernel_shape": [3, 3], "pads": [1] * 4}],
)
def test_qlinear_average_pool_is_bit_exact_on_a_large_input(attrs, rng):
    # x_scale = 2 * y_scale puts many means on ties; compiled, XLA:CPU would fuse each
    # dequantizing multiply into the window sum as an FMA (1.6% of outputs one step off).
    inputs = {
        "X": rand_q(rng, np.uint8, (4, 16, 128, 128)),
        "x_scale": F32(0.02),
        "x_zero_point": np.uint8(128),
        "y_scale": F32(0.01),
        "y_zero_point": np.uint8(128),
    }
    check_node("QLinearAveragePool", inputs, attrs, domain=MS)
