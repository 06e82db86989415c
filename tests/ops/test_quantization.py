"""QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger,
QLinearMatMul and QLinearConv against ONNX Runtime, and onnx.reference where ONNX Runtime cannot
feed or return a type (float8, int4, float4, int2) or lacks the opset (28)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import pytest
from jax import lax
from onnx import TensorProto, helper
from opcheck import (
    assert_close,
    check_node,
    make_model,
    make_node_model,
    ort_may_saturate,
    ort_run,
    portable_reference,
    transmuter_runs,
)

from transmuter.errors import TransmuterError
from transmuter.lowering.ops.quantization import _conv_by_taps

# x / scale lands on ties (x.5), inside the range and past both ends of every 8-bit range.
TIES = np.array(
    [[-3.25, 0.5, 1.5, 2.5, 300.0, -300.0], [-0.75, -0.25, 0.25, 0.75, 1.25, 7.0]], np.float32
)
FLOAT8 = [
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e5m2fnuz,
]
# Overflow for every float8 type, infinities, NaN, -0 and ordinary values.
SPECIAL = np.array(
    [0.0, -0.0, 0.3, -1.7, 200.0, 250.0, 447.0, 470.0, 1e5, -1e5, np.inf, -np.inf, np.nan, 3e-3],
    np.float32,
)


def rand_int(rng, dtype, shape):
    info = ml_dtypes.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)


@pytest.mark.parametrize(
    "opset,zero",
    [
        (10, None),
        (10, np.uint8(3)),
        (13, np.int8(-5)),
        (19, np.uint8(3)),
        (21, None),
        (21, np.int8(-5)),
        (23, np.uint8(3)),
        (24, np.int8(-5)),
        (25, None),
    ],
)
def test_quantize_per_tensor(opset, zero):
    check_node("QuantizeLinear", {"x": TIES, "s": np.float32(0.5), "z": zero}, opset=opset)


@pytest.mark.parametrize("opset", [10, 13, 21, 23, 25])
def test_dequantize_per_tensor(opset, rng):
    for dtype in (np.uint8, np.int8):
        x = rand_int(rng, dtype, (3, 5))
        check_node("DequantizeLinear", {"x": x, "s": np.float32(0.37), "z": dtype(7)}, opset=opset)
    check_node(
        "DequantizeLinear", {"x": rand_int(rng, np.int32, (4,)), "s": np.float32(1e-4)}, opset=opset
    )


def test_quantize_near_tie():
    # XLA turns x / broadcast(s) into x * (1 / s), which rounds these quotients onto ties.
    x = np.array([-2.5, 2.5, 7.5, -12.5, 0.5], np.float32)
    check_node(
        "QuantizeLinear",
        {"x": x, "s": np.float32(5) / np.float32(255), "z": np.uint8(128)},
        opset=13,
    )


@pytest.mark.parametrize("opset", [10, 21])
def test_quantize_int32_input(opset):
    # ONNX Runtime has no int32 QuantizeLinear kernel.
    x = np.array([-7, 0, 5, 6, 1000, -1000], np.int32)
    check_node(
        "QuantizeLinear",
        {"x": x, "s": np.float32(2.0), "z": np.int8(1)},
        opset=opset,
        reference="onnx",
    )


@pytest.mark.parametrize("opset,axis", [(13, 0), (13, -1), (19, 1), (21, -3), (23, 2)])
def test_quantize_per_axis(opset, axis, rng):
    x = (rng.standard_normal((3, 4, 5)) * 40).astype(np.float32)
    size = x.shape[axis]
    scale = rng.uniform(0.1, 1.0, size).astype(np.float32)
    zero = rng.integers(-20, 20, size).astype(np.int8)
    check_node("QuantizeLinear", {"x": x, "s": scale, "z": zero}, {"axis": axis}, opset=opset)


@pytest.mark.parametrize("opset,axis", [(13, 0), (19, -1), (23, 1)])
def test_dequantize_per_axis(opset, axis, rng):
    x = rand_int(rng, np.uint8, (4, 6))
    scale = rng.uniform(0.1, 1.0, x.shape[axis]).astype(np.float32)
    zero = rand_int(rng, np.uint8, (x.shape[axis],))
    check_node("DequantizeLinear", {"x": x, "s": scale, "z": zero}, {"axis": axis}, opset=opset)


@pytest.mark.parametrize(
    "opset,axis,block,dtype",
    [
        (21, 1, 2, np.int8),
        (23, 1, 4, np.uint16),
        (21, 0, 3, np.uint16),
        (25, -2, 1, np.int8),
        (23, -1, 5, np.int8),
    ],
)
def test_blocked(opset, axis, block, dtype, rng):
    x = (rng.standard_normal((5, 6)) * 50).astype(np.float32)
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)
    scale = rng.uniform(0.05, 1.0, shape).astype(np.float32)
    zero = rand_int(rng, dtype, shape) // 4
    attrs = {"axis": axis, "block_size": block}
    q = check_node("QuantizeLinear", {"x": x, "s": scale, "z": zero}, attrs, opset=opset)[0]
    check_node("DequantizeLinear", {"x": q, "s": scale, "z": zero}, attrs, opset=opset)


@pytest.mark.parametrize("dtype", [np.int16, np.uint16])
def test_16_bit(dtype, rng):
    x = (rng.standard_normal((4, 5)) * 4e4).astype(np.float32)
    check_node("QuantizeLinear", {"x": x, "s": np.float32(0.7), "z": dtype(100)}, opset=21)
    q = rand_int(rng, dtype, (4, 5))
    check_node("DequantizeLinear", {"x": q, "s": np.float32(0.01), "z": dtype(100)}, opset=21)


@pytest.mark.parametrize("opset,output_dtype", [(21, 2), (23, 3), (21, 4), (24, 5)])
def test_quantize_output_dtype(opset, output_dtype):
    check_node(
        "QuantizeLinear",
        {"x": TIES * 300, "s": np.float32(0.5)},
        {"output_dtype": output_dtype},
        opset=opset,
    )


@pytest.mark.parametrize(
    "opset,dtype", [(19, np.float16), (21, ml_dtypes.bfloat16), (23, np.float16)]
)
def test_half_inputs(opset, dtype, rng):
    x = (rng.standard_normal((3, 4)) * 20).astype(dtype)
    # bfloat16 scales have no ONNX Runtime kernel.
    reference = "ort" if dtype == np.float16 else "onnx"
    check_node(
        "QuantizeLinear",
        {"x": x, "s": dtype(0.25), "z": np.int8(2)},
        opset=opset,
        reference=reference,
    )
    q = rand_int(rng, np.int8, (3, 4))
    check_node(
        "DequantizeLinear",
        {"x": q, "s": dtype(0.25), "z": np.int8(2)},
        opset=opset,
        reference=reference,
    )


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize("block", [0, 2])
def test_int4(dtype, block, rng):
    x = (rng.standard_normal((4, 6)) * 6).astype(np.float32)
    shape = (4, 3) if block else (6,)
    scale = rng.uniform(0.3, 1.0, shape).astype(np.float32)
    zero = rand_int(rng, dtype, shape)
    attrs = {"axis": 1, "block_size": block} if block else {"axis": 1}
    q = check_node(
        "QuantizeLinear", {"x": x, "s": scale, "z": zero}, attrs, opset=21, reference="onnx"
    )[0]
    check_node(
        "DequantizeLinear", {"x": q, "s": scale, "z": zero}, attrs, opset=21, reference="onnx"
    )


@pytest.mark.parametrize("dtype", [ml_dtypes.int2, ml_dtypes.uint2])
def test_int2(dtype, rng):
    x = (rng.standard_normal((3, 4)) * 3).astype(np.float32)
    q = check_node(
        "QuantizeLinear", {"x": x, "s": np.float32(0.7), "z": dtype(1)}, opset=25, reference="onnx"
    )[0]
    check_node(
        "DequantizeLinear",
        {"x": q, "s": np.float32(0.7), "z": dtype(1)},
        opset=25,
        reference="onnx",
    )


@pytest.mark.parametrize("opset,saturate", [(19, 0), (21, 1), (23, 0), (25, 1)])
@pytest.mark.parametrize("dtype", FLOAT8)
def test_quantize_float8(opset, saturate, dtype):
    # onnx.reference leaves out the zero point for float8, so it is zero here.
    inputs = {"x": SPECIAL, "s": np.float32(0.5), "z": np.zeros((), dtype)}
    check_node("QuantizeLinear", inputs, {"saturate": saturate}, opset=opset, reference="onnx")


def test_quantize_float8_matches_onnxruntime():
    # ONNX Runtime returns float8e4m3fn outputs as raw uint8 bytes: compare the bits.
    inputs = {
        "x": SPECIAL[~np.isnan(SPECIAL)],
        "s": np.float32(0.5),
        "z": np.zeros((), ml_dtypes.float8_e4m3fn),
    }
    model = make_node_model("QuantizeLinear", inputs, opset=21, constants=["s", "z"])
    expected = ort_run(model, inputs)[0]
    for mode, (got,) in transmuter_runs(model, inputs).items():
        np.testing.assert_array_equal(
            np.asarray(got).view(np.uint8), expected.view(np.uint8), err_msg=mode
        )


@pytest.mark.parametrize("dtype", FLOAT8)
def test_quantize_float8_zero_point(dtype):
    # The spec's formula adds the zero point for float8 too; onnx.reference drops it.
    inputs = {"x": np.array([1.0, -2.0, 3.0], np.float32), "s": np.float32(1.0), "z": dtype(0.5)}
    model = make_node_model("QuantizeLinear", inputs, opset=21)
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert got.dtype == dtype, mode
        np.testing.assert_array_equal(got.astype(np.float32), [1.5, -1.5, 3.5], err_msg=mode)


@pytest.mark.parametrize(
    "opset,scale_dtype", [(19, np.float32), (21, np.float16), (23, np.float32)]
)
@pytest.mark.parametrize("dtype", FLOAT8)
def test_dequantize_float8(opset, dtype, scale_dtype):
    x = SPECIAL[np.isfinite(SPECIAL)].astype(dtype)
    check_node(
        "DequantizeLinear",
        {"x": x, "s": scale_dtype(0.5), "z": np.zeros((), dtype)},
        opset=opset,
        reference="onnx",
    )


@pytest.mark.parametrize("opset", [23, 25])
def test_float4(opset, rng):
    x = np.concatenate(
        [SPECIAL[np.isfinite(SPECIAL)], rng.standard_normal(8).astype(np.float32) * 3]
    )
    dtype = ml_dtypes.float4_e2m1fn
    for saturate in (0, 1):
        q = check_node(
            "QuantizeLinear",
            {"x": x, "s": np.float32(0.5)},
            {"output_dtype": 23, "saturate": saturate},
            opset=opset,
            reference="onnx",
        )[0]
    assert q.dtype == dtype
    check_node("DequantizeLinear", {"x": q, "s": np.float32(0.5)}, opset=opset, reference="onnx")


@pytest.mark.parametrize("opset", [23, 24, 25])
def test_quantize_precision(opset):
    # precision=float for float16 x and scale: the division and rounding happen in float32.
    x = np.array([1.0009765625, 25.0, -7.5, 100.0], np.float16)
    check_node(
        "QuantizeLinear",
        {"x": x, "s": np.float16(0.1), "z": np.int8(0)},
        {"precision": 1},
        opset=opset,
        reference="onnx",
    )


@pytest.mark.parametrize("opset", [23, 25])
def test_mixed_x_and_scale_types(opset, rng):
    x = (rng.standard_normal((2, 3)) * 10).astype(np.float16)
    check_node("QuantizeLinear", {"x": x, "s": np.float32(0.3), "z": np.uint8(128)}, opset=opset)
    q = rand_int(rng, np.uint8, (2, 3))
    check_node(
        "DequantizeLinear",
        {"x": q, "s": np.float32(0.3), "z": np.uint8(128)},
        {"output_dtype": 10},
        opset=opset,
    )


@pytest.mark.parametrize("opset", [24, 25])
def test_e8m0_scale(opset, rng):
    scale = np.array([0.25, 4.0, 1.0], ml_dtypes.float8_e8m0fnu)
    x = (rng.standard_normal((2, 3)) * 10).astype(np.float32)
    check_node(
        "QuantizeLinear",
        {"x": x, "s": scale, "z": np.zeros(3, np.int8)},
        {"axis": 1},
        opset=opset,
        reference="onnx",
    )
    q = rand_int(rng, np.int8, (2, 3))
    check_node(
        "DequantizeLinear",
        {"x": q, "s": scale},
        {"axis": 1, "output_dtype": 1},
        opset=opset,
        reference="onnx",
    )


@pytest.mark.parametrize("opset", [21, 23, 28])
def test_latest_opset(opset, rng):
    # ONNX Runtime implements neither op at 28.
    x = (rng.standard_normal((2, 5)) * 30).astype(np.float32)
    q = check_node(
        "QuantizeLinear",
        {"x": x, "s": np.float32(0.5), "z": np.int8(1)},
        opset=opset,
        reference="onnx",
    )[0]
    check_node(
        "DequantizeLinear",
        {"x": q, "s": np.float32(0.5), "z": np.int8(1)},
        opset=opset,
        reference="onnx",
    )


def test_host_inputs(rng):
    # Every input constant: the nodes run on the host and come back as numpy (int4 included).
    x = (rng.standard_normal((2, 4)) * 5).astype(np.float32)
    inputs = {"x": x, "s": np.float32(0.5), "z": ml_dtypes.int4(-1)}
    q = check_node("QuantizeLinear", inputs, opset=21, reference="onnx", constants=list(inputs))[0]
    inputs = {"x": q, "s": np.float32(0.5), "z": ml_dtypes.int4(-1)}
    check_node("DequantizeLinear", inputs, opset=21, reference="onnx", constants=list(inputs))


def test_zero_size_and_symbolic(rng):
    x = np.zeros((0, 3), np.float32)
    check_node(
        "QuantizeLinear",
        {"x": x, "s": np.ones(3, np.float32), "z": np.zeros(3, np.uint8)},
        opset=21,
    )
    check_node(
        "DequantizeLinear", {"x": np.zeros((0, 3), np.uint8), "s": np.float32(2.0)}, opset=21
    )
    x = (rng.standard_normal((4, 3)) * 30).astype(np.float32)
    scale = np.array([0.5, 1.0, 2.0], np.float32)
    check_node(
        "QuantizeLinear", {"x": x, "s": scale}, opset=21, symbolic={"x": [0]}, constants=["s"]
    )


@pytest.mark.parametrize(
    "inputs,attrs",
    [
        ({"s": np.ones(4, np.float32)}, {}),  # per-axis length differs from x's axis 1
        ({"s": np.ones((2, 2), np.float32)}, {"block_size": 1}),  # too few blocks
        ({"s": np.ones((2, 3), np.float32)}, {"block_size": 1, "axis": 3}),  # axis out of range
        ({"s": np.float32(1.0), "z": np.int8(0)}, {"output_dtype": 2}),  # uint8 vs int8 zero point
    ],
)
def test_quantize_errors(inputs, attrs):
    inputs = {"x": np.zeros((2, 3), np.float32), **inputs}
    with pytest.raises(TransmuterError):
        transmuter_runs(
            make_node_model("QuantizeLinear", inputs, attrs, opset=21), inputs, compiled=False
        )


def test_dynamic_quantize_linear(rng):
    for x in (
        rng.standard_normal((3, 4)).astype(np.float32) * 5,
        rng.uniform(1, 3, (5,)).astype(np.float32),
        -rng.uniform(1, 3, (2, 3)).astype(np.float32),
        np.zeros((4,), np.float32),
        np.array([0.0, 255.0, 127.5, 0.5, 1.5], np.float32),
        # -2.5 / (5 / 255) is 127.49999 in float32; a reciprocal multiply would give the tie.
        np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32),
    ):
        check_node("DynamicQuantizeLinear", {"x": x}, opset=11, outputs=3)


@pytest.mark.parametrize(
    "x",
    [
        [1.0, np.nan, -2.0, 3.0],
        [np.nan, np.nan, np.nan],
        [*np.linspace(-1, 2, 37), np.nan, *np.linspace(-3, 1, 40), np.nan],
        [-np.inf, 1.0, -2.0],  # min / scale is -inf / inf: ONNX Runtime's zero point is 255
        [np.inf, np.nan, -2.0],
    ],
    ids=["nan", "all-nan", "nans-in-blocks", "-inf", "inf-and-nan"],
)
def test_dynamic_quantize_linear_nan(x):
    # NaN (an exported atan2's 0 / 0) stays out of the range and quantizes to 0, as in ONNX
    # Runtime: one NaN must not make the scale NaN. (ONNX Runtime's SIMD min/max lets a NaN in
    # some lanes through, giving a NaN scale; these positions are not among them.)
    check_node("DynamicQuantizeLinear", {"x": np.array(x, np.float32)}, opset=11, outputs=3)


@pytest.mark.parametrize("zero", [np.uint8(3), np.int8(-3), np.int16(7), np.uint16(9)])
def test_quantize_nan_saturates_low(zero):
    # ONNX Runtime clamps NaN to the type's lowest value; XLA's conversion would give 0.
    x = np.tile(np.array([1.0, np.nan, -2.0, np.inf, -np.inf, 0.5], np.float32), 50)
    check_node("QuantizeLinear", {"x": x, "s": np.float32(0.1), "z": zero}, opset=21)


@pytest.mark.parametrize(
    "a_type,b_type,zeros",
    [
        (np.uint8, np.uint8, "none"),
        (np.uint8, np.uint8, "column"),
        (np.uint8, np.int8, "scalar"),
        (np.int8, np.uint8, "column"),
        (np.int8, np.int8, "scalar"),
        (np.int8, np.int8, "none"),
    ],
)
def test_matmul_integer(a_type, b_type, zeros, rng):
    a, b = rand_int(rng, a_type, (5, 7)), rand_int(rng, b_type, (7, 3))
    za = {"none": None, "scalar": a_type(3), "column": a_type(3)}[zeros]
    zb = {"none": None, "scalar": b_type(2), "column": rand_int(rng, b_type, (3,))}[zeros]
    inputs = {"A": a, "B": b, "za": za, "zb": zb}
    # ONNX Runtime's u8 x s8 products may saturate (opcheck.PAIR_LIMIT): compare those with
    # the same products moved to u8 x u8.
    products = [("A", "B", "zb")] if b_type == np.int8 else [("B", "A", "za")]
    options = dict(opset=10, input_names=["A", "B", "za", "zb"])
    expected = portable_reference("MatMulInteger", inputs, products=products, **options)
    check_node("MatMulInteger", inputs, expected=expected, **options)


def test_matmul_integer_batched_and_per_row(rng):
    a, b = rand_int(rng, np.uint8, (2, 4, 6)), rand_int(rng, np.int8, (6, 5))
    for inputs in [
        {"A": a, "B": b, "za": np.uint8(128), "zb": rand_int(rng, np.int8, (5,))},
        {"A": a[0, 0], "B": b, "za": np.uint8(1), "zb": None},  # vector @ matrix
        {"A": a[:, :0], "B": b, "za": None, "zb": None},  # zero rows
    ]:
        expected = portable_reference(
            "MatMulInteger", inputs, products=[("A", "B", "zb")], opset=10
        )
        check_node("MatMulInteger", inputs, opset=10, expected=expected)
    # ONNX Runtime takes only per-tensor zero points for A: compare per-row ones with numpy.
    zero = rand_int(rng, np.uint8, (4,))
    inputs = {"A": a[0], "B": b, "za": zero}
    want = (a[0].astype(np.int32) - zero[:, None]) @ b.astype(np.int32)
    for mode, (got,) in transmuter_runs(
        make_node_model("MatMulInteger", inputs, opset=10), inputs
    ).items():
        assert_close(got, want, rtol=0, atol=0, what=mode)
    inputs = {"A": a, "B": b, "za": zero.reshape(1, 4, 1)}
    check_node("MatMulInteger", inputs, opset=10, reference="onnx")


CONV_CASES = [
    ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    ((2, 4, 8, 6), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1]}),
    ((1, 2, 9, 9), (3, 2, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 0, 2]}),
    ((1, 2, 8, 7), (3, 2, 2, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 6, 6), (3, 2, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((2, 3, 10), (4, 3, 3), {"pads": [2, 1], "kernel_shape": [3]}),
    ((1, 2, 4, 5, 3), (2, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
]


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs,types",
    [case + ((np.uint8, np.uint8),) for case in CONV_CASES]
    + [
        case + (types,)
        for case, types in zip(
            CONV_CASES[:4], [(np.uint8, np.int8), (np.int8, np.int8)] * 2, strict=True
        )
    ]
    # ONNX Runtime rejects dilations with auto_pad.
    + [
        (
            (1, 2, 9, 9),
            (3, 2, 3, 3),
            {"dilations": [2, 2], "auto_pad": "SAME_UPPER"},
            (np.uint8, np.uint8),
        )
    ],
)
def test_conv_integer(x_shape, w_shape, attrs, types, rng):
    x, w = rand_int(rng, types[0], x_shape), rand_int(rng, types[1], w_shape)
    inputs = {"x": x, "w": w, "zx": types[0](5), "zw": types[1](-3 if types[1] == np.int8 else 3)}
    # ONNX Runtime's ConvInteger takes uint8 x only.
    ort = types == (np.uint8, np.uint8) and not ("dilations" in attrs and "auto_pad" in attrs)
    reference = "ort" if ort else "onnx"
    check_node("ConvInteger", inputs, attrs, opset=10, reference=reference)


def test_conv_integer_zero_points(rng):
    x, w = rand_int(rng, np.uint8, (1, 2, 5, 5)), rand_int(rng, np.uint8, (3, 2, 3, 3))
    check_node("ConvInteger", {"x": x, "w": w}, {"pads": [1, 1, 1, 1]}, opset=10)
    check_node(
        "ConvInteger", {"x": x, "w": w, "zx": np.uint8(200)}, {"pads": [1, 1, 1, 1]}, opset=10
    )
    # Every input constant: the node runs on the host.
    inputs = {"x": x, "w": w, "zx": np.uint8(9), "zw": np.uint8(4)}
    check_node("ConvInteger", inputs, {"strides": [2, 2]}, opset=10, constants=list(inputs))
    per_channel = {"x": x, "w": w, "zx": np.uint8(9), "zw": rand_int(rng, np.uint8, (3,))}
    check_node("ConvInteger", per_channel, {"pads": [1, 1, 1, 1]}, opset=10, reference="onnx")


def window_and_xla_conv(x: np.ndarray, w: np.ndarray, attrs: dict):
    """ConvInteger's window (strides, dilations, pads) for `attrs`, and XLA's int32
    convolution of x by w over it: what the CPU paths are checked against."""
    from transmuter.lowering.ops.quantization import _conv_window

    group = attrs.get("group", 1)
    strides, dilations, pads = _conv_window(
        "ConvInteger",
        jnp.asarray(x),
        jnp.asarray(w),
        None,
        group,
        attrs.get("strides"),
        attrs.get("dilations"),
        attrs.get("pads"),
        attrs.get("auto_pad", "NOTSET"),
    )
    want = lax.conv_general_dilated(
        x,
        w,
        strides,
        pads,
        rhs_dilation=dilations,
        feature_group_count=group,
        preferred_element_type=jnp.int32,
    )
    return strides, dilations, pads, want


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs",
    CONV_CASES + [((1, 2, 9, 9), (3, 2, 3, 3), {"dilations": [2, 2], "auto_pad": "SAME_LOWER"})],
)
def test_conv_by_taps_equals_xla_conv(x_shape, w_shape, attrs, rng):
    # The fallback for backends without integer convolutions, checked here on CPU.
    x = rand_int(rng, np.int8, x_shape).astype(np.int32)
    w = rand_int(rng, np.int8, w_shape).astype(np.int32)
    group = attrs.get("group", 1)
    strides, dilations, pads, want = window_and_xla_conv(x, w, attrs)
    got = _conv_by_taps(jnp.asarray(x), jnp.asarray(w), strides, dilations, pads, group)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("platforms", [["cpu"], ["tpu"], ["cuda"]])
def test_conv_integer_traced_for_one_platform_traces_its_route_only(platforms, rng):
    """The runtime traces for the platform it compiles for (`tracing_for`): ConvInteger then
    traces that platform's route, not all three behind a platform switch, and the route gives
    what the switch would pick."""
    from transmuter.lowering.ops.quantization import conv_integer
    from transmuter.lowering.platforms import tracing_for

    x = rand_int(rng, np.uint8, (1, 3, 12))
    w = rand_int(rng, np.int8, (4, 3, 3))
    zero = np.array(7, np.uint8)

    def conv(x, w, zero):
        return conv_integer(x, w, zero, pads=[1, 1])

    every = jax.make_jaxpr(conv)(x, w, zero)
    with tracing_for(platforms):
        one = jax.make_jaxpr(lambda *a: conv(*a))(x, w, zero)
        got = jax.jit(lambda *a: conv(*a))(x, w, zero)
    assert "platform_index" in str(every) and "platform_index" not in str(one)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(conv)(x, w, zero)))


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs",
    [
        *CONV_CASES,
        ((1, 4, 9, 9), (6, 2, 3, 3), {"group": 2, "strides": [2, 1], "dilations": [1, 2]}),
        ((2, 3, 50), (4, 3, 7), {"pads": [3, 3]}),
        # 700 channels x 7 taps of up to 255 x 255: sums past 2^24 (float32's exact integers).
        ((1, 700, 12), (3, 700, 7), {"pads": [3, 3]}),
        ((1, 1400, 12), (4, 700, 7), {"group": 2}),
        ((1, 3, 2), (2, 3, 5), {}),  # a kernel wider than x: no output positions
    ],
)
@pytest.mark.parametrize(
    "types,zeros",
    [
        ((np.uint8, np.uint8), "scalar"),
        ((np.uint8, np.int8), "per filter"),
        ((np.int8, np.uint8), None),
        ((np.uint8, np.uint8), None),  # x pads with uint8's 0, int8's -128
        ((np.int8, np.int8), "scalar"),
    ],
)
@pytest.mark.parametrize("extreme", [False, True])
def test_conv_by_int8_dot_equals_xla_conv(x_shape, w_shape, attrs, types, zeros, extreme, rng):
    # How CPU runs ConvInteger and QLinearConv: int8 dots over x's patches, exact in int32.
    # `extreme` puts every term at the largest magnitude (x - zx = +-255, w - zw = +-255, one
    # sign per filter), where a float or narrower sum would show first.
    from transmuter.lowering.ops.quantization import _conv_by_int8_dot

    x_type, w_type = types
    x_info, w_info = ml_dtypes.iinfo(x_type), ml_dtypes.iinfo(w_type)
    if extreme:
        odd = np.arange(w_shape[0]) % 2 == 1
        x = np.full(x_shape, x_info.max, x_type)
        zx = np.array(x_info.min, x_type)
        top = np.where(odd, w_info.max, w_info.min).astype(w_type)
        w = np.broadcast_to(top.reshape(-1, *(1,) * (len(w_shape) - 1)), w_shape).copy()
        zw = np.where(odd, w_info.min, w_info.max).astype(w_type)
    else:
        x, w = rand_int(rng, x_type, x_shape), rand_int(rng, w_type, w_shape)
        zx = rand_int(rng, x_type, ())
        zw = rand_int(rng, w_type, (w_shape[0],))
    if zeros is None:
        zx_arg = zw_arg = None
        zx, zw = np.zeros((), x_type), np.zeros(w_shape[0], w_type)
    elif zeros == "scalar":
        zw = np.full(w_shape[0], zw[0], w_type)
        zx_arg, zw_arg = jnp.asarray(zx), jnp.asarray(zw[0])
    else:
        zx_arg = jnp.asarray(zx)
        zw_arg = jnp.asarray(zw).reshape(-1, *(1,) * (len(w_shape) - 1))
    group = attrs.get("group", 1)
    shifted_x = x.astype(np.int32) - zx.astype(np.int32)
    shifted_w = w.astype(np.int32) - zw.astype(np.int32).reshape(-1, *(1,) * (len(w_shape) - 1))
    strides, dilations, pads, want = window_and_xla_conv(shifted_x, shifted_w, attrs)
    got = jax.jit(_conv_by_int8_dot, static_argnums=(4, 5, 6, 7))(
        jnp.asarray(x), jnp.asarray(w), zx_arg, zw_arg, strides, dilations, pads, group
    )
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    "opset,types",
    [
        (10, (np.uint8, np.uint8, np.uint8)),
        (21, (np.int8, np.int8, np.int8)),
        (21, (np.uint8, np.int8, np.uint8)),
    ],
)
def test_qlinear_matmul(opset, types, rng):
    ta, tb, ty = types
    a, b = rand_int(rng, ta, (2, 4, 8)), rand_int(rng, tb, (8, 5))
    inputs = {
        "a": a,
        "sa": np.float32(0.02),
        "za": ta(3),
        "b": b,
        "sb": np.float32(0.03),
        "zb": tb(1),
        "sy": np.float32(0.4),
        "zy": ty(7),
    }
    per_column = dict(
        inputs, sb=rng.uniform(0.01, 0.05, 5).astype(np.float32), zb=rand_int(rng, tb, (5,)) // 8
    )
    for case in (inputs, per_column):
        expected = portable_reference(
            "QLinearMatMul", case, products=[("a", "b", "zb")], opset=opset
        )
        check_node("QLinearMatMul", case, opset=opset, expected=expected)


def test_qlinear_matmul_per_row_and_half_scales(rng):
    a, b = rand_int(rng, np.uint8, (4, 6)), rand_int(rng, np.uint8, (6, 3))
    inputs = {
        "a": a,
        "sa": rng.uniform(0.01, 0.05, (4, 1)).astype(np.float32),
        "za": rand_int(rng, np.uint8, (4, 1)),
        "b": b,
        "sb": np.float32(0.03),
        "zb": np.uint8(100),
        "sy": np.float32(2.0),
        "zy": np.uint8(10),
    }
    check_node("QLinearMatMul", inputs, opset=21, reference="onnx")
    half = dict(
        inputs, sa=np.float16(0.03), za=np.uint8(7), sb=np.float16(0.02), sy=np.float16(1.5)
    )
    check_node("QLinearMatMul", half, opset=21)


def test_qlinear_matmul_float8(rng):
    # Neither reference runs float8 QLinearMatMul: compare with the spec's formula in numpy.
    dtype = ml_dtypes.float8_e4m3fn
    a = rng.standard_normal((3, 4)).astype(dtype)
    b = rng.standard_normal((4, 2)).astype(dtype)
    inputs = {
        "a": a,
        "sa": np.float32(0.5),
        "za": dtype(0),
        "b": b,
        "sb": np.float32(2.0),
        "zb": dtype(0),
        "sy": np.float32(0.25),
        "zy": dtype(0),
    }
    real = (a.astype(np.float32) @ b.astype(np.float32)) * np.float32(0.5 * 2.0 / 0.25)
    want = np.clip(real, -448, 448).astype(dtype)
    for mode, (got,) in transmuter_runs(
        make_node_model("QLinearMatMul", inputs, opset=21), inputs
    ).items():
        assert got.dtype == dtype, mode
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=mode)


U8, I8 = np.uint8, np.int8


@pytest.mark.parametrize(
    "case,types,per_channel",
    [
        (0, (U8, U8, U8), False),
        (1, (U8, I8, U8), True),
        (2, (I8, I8, I8), False),
        (3, (U8, I8, U8), False),
        (4, (I8, I8, I8), True),
        (5, (U8, U8, U8), False),
        (6, (U8, I8, U8), True),
    ],
)
def test_qlinear_conv(case, types, per_channel, rng):
    x_shape, w_shape, attrs = CONV_CASES[case]
    tx, tw, ty = types
    filters = w_shape[0]
    x, w = rand_int(rng, tx, x_shape), rand_int(rng, tw, w_shape)
    w_scale = (
        rng.uniform(0.005, 0.02, filters).astype(np.float32) if per_channel else np.float32(0.01)
    )
    # ONNX Runtime's CPU kernel takes a symmetric (zero) weight zero point only for int8 weights.
    w_zero = np.zeros(filters, tw) if per_channel else tw(0 if tw == np.int8 else 3)
    inputs = {
        "x": x,
        "sx": np.float32(0.05),
        "zx": tx(4),
        "w": w,
        "sw": w_scale,
        "zw": w_zero,
        "sy": np.float32(0.6),
        "zy": ty(5),
        "B": rng.integers(-500, 500, filters).astype(np.int32),
    }
    expected = portable_reference(
        "QLinearConv", inputs, attrs, products=[("x", "w", "zw")], opset=10
    )
    check_node("QLinearConv", inputs, attrs, opset=10, expected=expected)


def test_qlinear_conv_without_bias_and_per_channel_zero(rng):
    x, w = rand_int(rng, np.uint8, (1, 2, 5, 5)), rand_int(rng, np.uint8, (3, 2, 3, 3))
    inputs = {
        "x": x,
        "sx": np.float32(0.05),
        "zx": np.uint8(128),
        "w": w,
        "sw": np.array([0.01, 0.02, 0.03], np.float32),
        "zw": np.array([1, 128, 255], np.uint8),
        "sy": np.float32(0.5),
        "zy": np.uint8(120),
    }
    check_node("QLinearConv", inputs, {"pads": [1, 1, 1, 1]}, opset=10, reference="onnx")


# ---- bit-exact parity with ONNX Runtime's CPU kernels on ties (issue 16) ----------------------
# One element of 86,016 off in an int8 OCR model's DynamicQuantizeLinear grew to 0.2 at the
# output. These tensors put most quotients on exact .5 ties, where any difference in the order of
# the scale arithmetic, a reciprocal for a division, or a rounding in float16 moves a value.

PARITY_SIZE = 1_000_000


def _on_ties(rng, scale, low, high, size, dtype=np.float32):
    """(k + 0 or 0.5) * scale for integers k in [low, high), a fifth of them moved off the tie."""
    k = rng.integers(low, high, size) + 0.5 * rng.integers(0, 2, size)
    noise = np.where(rng.random(size) < 0.2, rng.standard_normal(size) * 0.3, 0.0)
    return ((k + noise) * np.float64(scale)).astype(dtype)


def _assert_bit_exact(model, inputs):
    expected = ort_run(model, inputs)
    for mode, outputs in transmuter_runs(model, inputs).items():
        for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            got = np.asarray(got)
            assert got.dtype == want.dtype and got.shape == want.shape
            mismatches = int(np.sum(got != want))
            assert mismatches == 0, f"output {i} ({mode}): {mismatches} of {want.size} differ"


def _range_where_a_reciprocal_misleads():
    """max and -min whose (max - min) / 255 in float32 differs from (max - min) * (1 / 255),
    the form XLA rewrites a division by a constant into."""
    for high in np.linspace(0.5, 8, 4000, dtype=np.float32):
        span = np.float32(high) + np.float32(2.5)
        if span / np.float32(255) != span * (np.float32(1) / np.float32(255)):
            return np.float32(-2.5), np.float32(high)
    raise AssertionError("no such range")


def test_dynamic_quantize_linear_is_bit_exact_on_ties(rng):
    low, high = _range_where_a_reciprocal_misleads()
    scale = (high - low) / np.float32(255)
    x = _on_ties(rng, scale, int(low / scale) + 1, int(high / scale) - 1, PARITY_SIZE)
    x[:2] = low, high  # pin the range, and so the scale
    inputs = {"x": x}
    _assert_bit_exact(make_node_model("DynamicQuantizeLinear", inputs, outputs=3), inputs)


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("constants", [False, True])
def test_quantize_linear_is_bit_exact_on_ties(opset, constants, rng):
    scale = np.float32(0.0371)
    inputs = {"x": _on_ties(rng, scale, -140, 140, PARITY_SIZE), "s": scale, "z": np.uint8(3)}
    held = ("s", "z") if constants else ()
    _assert_bit_exact(
        make_node_model("QuantizeLinear", inputs, opset=opset, constants=held), inputs
    )


@pytest.mark.parametrize("opset", [19, 21, 23])
def test_half_quantize_linear_divides_as_onnx_runtime(opset, rng):
    # Before 23 ORT divides float16 by float16 in float32 (the spec does not say); from 23 in
    # float16, the scale's type, which 23's text asks for.
    scale = np.float16(0.0137)
    x = _on_ties(rng, np.float32(scale), -140, 140, PARITY_SIZE // 4, np.float16)
    inputs = {"x": x, "s": scale, "z": np.uint8(128)}
    _assert_bit_exact(make_node_model("QuantizeLinear", inputs, opset=opset), inputs)


@pytest.mark.parametrize("scales", [(0.0123, 0.0456, 0.0789), (0.5, 0.25, 0.25)])
def test_qlinear_matmul_is_bit_exact(scales, rng):
    # The second set makes the multiplier 0.5: every odd accumulator is a tie.
    a_scale, b_scale, y_scale = (np.float32(s) for s in scales)
    inputs = {
        "a": rand_int(rng, np.uint8, (1000, 64)),
        "a_scale": a_scale,
        "a_zero": np.uint8(120),
        "b": (rand_int(rng, np.int8, (64, 1000)) // 8).astype(np.int8),
        "b_scale": b_scale,
        "b_zero": np.int8(0),
        "y_scale": y_scale,
        "y_zero": np.uint8(128),
    }
    # Weights in [-16, 15]: ORT's u8 x s8 pair sums cannot saturate on any CPU (opcheck).
    assert not ort_may_saturate(inputs["a"], inputs["b"])
    held = ("a_scale", "a_zero", "b_scale", "b_zero", "y_scale", "y_zero")
    _assert_bit_exact(make_node_model("QLinearMatMul", inputs, constants=held), inputs)


def test_qlinear_conv_per_channel_is_bit_exact(rng):
    inputs = {
        "x": rand_int(rng, np.uint8, (1, 8, 66, 66)),
        "x_scale": np.float32(0.02),
        "x_zero": np.uint8(128),
        "w": (rand_int(rng, np.int8, (64, 8, 3, 3)) // 4).astype(np.int8),
        "w_scale": rng.uniform(0.001, 0.01, 64).astype(np.float32),
        "w_zero": np.zeros(64, np.int8),
        "y_scale": np.float32(0.05),
        "y_zero": np.uint8(100),
    }
    # Weights in [-32, 31]: ORT's u8 x s8 pair sums cannot saturate on any CPU (opcheck).
    assert not ort_may_saturate(inputs["x"], inputs["w"])
    held = ("x_scale", "x_zero", "w_scale", "w_zero", "y_scale", "y_zero")
    _assert_bit_exact(make_node_model("QLinearConv", inputs, opset=10, constants=held), inputs)


def test_dynamic_bias_quantization_is_bit_exact(rng):
    # ORT's quantize_dynamic turns a Conv's float bias into int32 at run time: the activation's
    # dynamic scale times the weight's, the bias divided by that and floored. XLA multiplied by
    # the reciprocal of the broadcast product, one ulp off on ~22% of the quotients; where a
    # quotient is within an ulp of an integer, Floor then moves the bias by one step (Kokoro-82M
    # int8: encoder.text_encoder.cnn.2.0.bias_quant_rounded).
    x = rng.standard_normal((1, 64, 50)).astype(np.float32) * 3
    w_scale = np.float32(0.00731)
    bias = rng.standard_normal(4096).astype(np.float32) * 20
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"]),
        helper.make_node("Mul", ["x_scale", "w_scale"], ["bias_scale"]),
        helper.make_node("Div", ["bias", "bias_scale"], ["quotient"]),
        helper.make_node("Floor", ["quotient"], ["rounded"]),
        helper.make_node("Cast", ["rounded"], ["bias_int"], to=TensorProto.INT32),
    ]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [
            helper.make_tensor_value_info("quotient", TensorProto.FLOAT, bias.shape),
            helper.make_tensor_value_info("bias_int", TensorProto.INT32, bias.shape),
        ],
        [
            onnx.numpy_helper.from_array(bias, "bias"),
            onnx.numpy_helper.from_array(w_scale, "w_scale"),
        ],
        opset=13,
    )
    scale = (x.max() - min(x.min(), 0)) / np.float32(255) * w_scale
    assert (bias / scale != bias * (np.float32(1) / scale)).any()  # where a reciprocal misleads
    _assert_bit_exact(model, {"x": x})


@pytest.mark.parametrize("op_type", ["ConvInteger", "QLinearConv"])
def test_integer_convolutions_refuse_wider_integers(op_type):
    # The spec's types are 8-bit only; a wider X would otherwise be read as uint8.
    from transmuter.lowering.ops.quantization import conv_integer, qlinear_conv

    x, w = np.zeros((1, 1, 4), np.int16), np.zeros((1, 1, 3), np.int8)
    with pytest.raises(ValueError, match=f"{op_type}: X must be int8 or uint8, got int16"):
        if op_type == "ConvInteger":
            conv_integer(x, w)
        else:
            one, zero = np.float32(1), np.int8(0)
            qlinear_conv(x, one, zero, w, one, zero, one, zero)
