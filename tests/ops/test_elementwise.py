"""Elementwise operators against ONNX Runtime (or onnx.reference where ORT has no kernel)."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs

from transmuter import dtypes
from transmuter.errors import TransmuterError

TOL = {
    np.float16: {"rtol": 1e-2, "atol": 1e-2},
    np.float32: {"rtol": 1e-5, "atol": 1e-6},
    np.float64: {"rtol": 1e-10, "atol": 1e-12},
}
# onnx.reference evaluates some float64 functions (Erf, Gelu, HardSwish) in float32, and ONNX
# Runtime float64 Shrink.
TOL_ONNX_DOUBLE = {"rtol": 1e-6, "atol": 1e-7}
T = onnx.TensorProto


def _expect(op_type, inputs, attrs, expected, *, opset, **options):
    """Run through Transmuter only and compare with `expected` (for semantics no reference has)."""
    model = make_node_model(op_type, inputs, attrs, opset=opset, **options)
    for mode, outputs in transmuter_runs(model, inputs).items():
        for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            assert_close(got, want, rtol=1e-6, atol=1e-6, what=f"{op_type} output {i} ({mode})")


def _unary_input(rng, op_type, dtype, shape=(3, 4)):
    x = rng.standard_normal(shape) * 2
    if op_type in ("Log", "Sqrt"):
        x = np.abs(x) + 0.1
    elif op_type in ("Asin", "Acos", "Atanh"):
        x = np.tanh(x) * 0.9
    elif op_type == "Acosh":
        x = np.abs(x) + 1.0
    elif op_type == "Round":
        x = np.concatenate([x.reshape(-1)[:8], [0.5, 1.5, 2.5, -0.5, -2.5]])
    return x.astype(dtype)


UNARY = [
    ("Abs", (1, 6, 13)),
    ("Neg", (1, 6, 13)),
    ("Exp", (1, 6, 13)),
    ("Log", (1, 6, 13)),
    ("Sqrt", (1, 6, 13)),
    ("Reciprocal", (1, 6, 13)),
    ("Floor", (1, 6, 13)),
    ("Ceil", (1, 6, 13)),
    ("Relu", (1, 6, 13, 14)),
    ("Sigmoid", (1, 6, 13)),
    ("Tanh", (1, 6, 13)),
    ("Round", (11, 22)),
    ("Sign", (9, 13)),
    ("Sin", (7, 22)),
    ("Cos", (7, 22)),
    ("Tan", (7, 22)),
    ("Asin", (7, 22)),
    ("Acos", (7, 22)),
    ("Atan", (7, 22)),
    ("Sinh", (9, 22)),
    ("Cosh", (9, 22)),
    ("Asinh", (9, 22)),
    ("Acosh", (9, 22)),
    ("Atanh", (9, 22)),
    ("Erf", (9, 13)),
    ("IsNaN", (9, 13, 20)),
    ("Softplus", (1, 22)),
    ("Softsign", (1, 22)),
    ("HardSwish", (14, 22)),
    ("Mish", (18, 22)),
]
# ONNX Runtime has no float64 kernels for these.
NO_ORT_DOUBLE = set(
    "Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Erf Softplus Softsign HardSwish Mish Elu Selu "
    "HardSigmoid ThresholdedRelu Gelu".split()
)


def _reference(op_type, opset, dtype=np.float32):
    # ONNX Runtime has no kernels for the version-1 operators with `consumed_inputs`, and no
    # float16 Softplus/Softsign before opset 22.
    if opset == 1 and op_type not in ("Softplus", "Softsign"):
        return "onnx"
    if dtype == np.float64 and op_type in NO_ORT_DOUBLE:
        return "onnx"
    if dtype == np.float16 and op_type in ("Softplus", "Softsign") and opset < 22:
        return "onnx"
    return "ort"


@pytest.mark.parametrize(
    "op_type, opset", [(name, v) for name, versions in UNARY for v in versions]
)
def test_unary_versions(rng, op_type, opset):
    x = _unary_input(rng, op_type, np.float32)
    check_node(op_type, {"X": x}, opset=opset, reference=_reference(op_type, opset))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("op_type", [name for name, _ in UNARY])
def test_unary_dtypes(rng, op_type, dtype):
    opset = max(v for name, versions in UNARY if name == op_type for v in versions)
    x = _unary_input(rng, op_type, dtype)
    reference = _reference(op_type, opset, dtype)
    tol = TOL_ONNX_DOUBLE if reference == "onnx" and dtype == np.float64 else TOL[dtype]
    check_node(op_type, {"X": x}, opset=opset, reference=reference, **tol)


@pytest.mark.parametrize(
    "op_type, dtype",
    [
        ("Abs", np.int32),
        ("Abs", np.int8),
        ("Abs", np.uint8),
        ("Neg", np.int64),
        ("Neg", np.int8),
        ("Sign", np.int32),
        ("Sign", np.uint16),
        ("Relu", np.int8),
        ("Relu", np.int64),
    ],
)
def test_unary_integers(rng, op_type, dtype):
    x = rng.integers(-50 if np.dtype(dtype).kind == "i" else 0, 50, (3, 5)).astype(dtype)
    # ONNX Runtime has no int64 Relu.
    reference = "onnx" if (op_type, dtype) == ("Relu", np.int64) else "ort"
    check_node(op_type, {"X": x}, opset=14 if op_type == "Relu" else 13, reference=reference)


def test_erf_of_integers_truncates(rng):
    x = np.array([-3, -1, 0, 1, 2], dtype=np.int32)
    check_node("Erf", {"X": x}, opset=13, reference="onnx")


def test_unary_bfloat16_against_float32(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    for op_type in ("Exp", "Tanh", "Sigmoid", "Abs"):
        expected = check_node(op_type, {"X": x}, opset=13)[0]
        inputs = {"X": x.astype(ml_dtypes.bfloat16)}
        model = make_node_model(op_type, inputs, opset=13)
        for out in transmuter_runs(model, inputs).values():
            assert out[0].dtype == ml_dtypes.bfloat16
            np.testing.assert_allclose(out[0].astype(np.float32), expected, rtol=2e-2, atol=2e-2)


def test_unary_zero_size_and_symbolic_batch(rng):
    check_node("Exp", {"X": np.zeros((0, 3), np.float32)}, opset=13)
    check_node(
        "Relu", {"X": rng.standard_normal((5, 3)).astype(np.float32)}, opset=14, symbolic={"X": [0]}
    )


def test_not_and_bitwise_not(rng):
    check_node("Not", {"X": rng.standard_normal((3, 4)) > 0}, opset=1)
    for dtype in (np.int8, np.uint16, np.int32, np.uint64):
        check_node("BitwiseNot", {"X": rng.integers(0, 100, (3, 4)).astype(dtype)}, opset=18)


@pytest.mark.parametrize("opset", [9, 20])
def test_isnan(opset):
    x = np.array([1.0, np.nan, -np.inf, np.inf, 0.0], dtype=np.float32)
    check_node("IsNaN", {"X": x}, opset=opset)


@pytest.mark.parametrize("opset", [10, 20])
@pytest.mark.parametrize("negative, positive", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_isinf(opset, negative, positive):
    x = np.array([[1.0, np.nan, -np.inf], [np.inf, 0.0, -2.0]], dtype=np.float32)
    attrs = {"detect_negative": negative, "detect_positive": positive}
    check_node("IsInf", {"X": x}, attrs, opset=opset)


def test_isinf_isnan_float8():
    x = np.array([1.0, np.nan, -np.inf, np.inf], dtype=np.float32)
    for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        inputs = {"X": x.astype(dtype)}
        check_node("IsInf", inputs, opset=20, constants=["X"])
        check_node("IsNaN", inputs, opset=20, constants=["X"])


# ---------------------------------------------------------------------------------- binary

SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((3, 4), ()), ((0, 4), (4,))]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_arithmetic_broadcasting(rng, op_type, shapes):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = (rng.standard_normal(shapes[1]) + 3).astype(np.float32)
    check_node(op_type, {"A": a, "B": b}, opset=14)


@pytest.mark.parametrize(
    "dtype", [np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32]
)
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_arithmetic_dtypes(rng, op_type, dtype):
    if np.dtype(dtype).kind in "iu":
        low = 0 if np.dtype(dtype).kind == "u" else -20
        a = rng.integers(low, 20, (4, 5)).astype(dtype)
        b = rng.integers(1, 7, (4, 5)).astype(dtype)
        if np.dtype(dtype).kind == "i":
            b = b * rng.choice([-1, 1], (4, 5)).astype(dtype)  # Div truncates toward zero
    else:
        a = rng.standard_normal((4, 5)).astype(dtype)
        b = (rng.standard_normal((4, 5)) + 3).astype(dtype)
    check_node(op_type, {"A": a, "B": b}, opset=14, **TOL.get(dtype, {}))


@pytest.mark.parametrize("opset", [7, 13])
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_arithmetic_versions(rng, op_type, opset):
    a, b = rng.standard_normal((2, 3)).astype(np.float32), np.float32(2.5)
    check_node(op_type, {"A": a, "B": np.asarray(b)}, opset=opset)


@pytest.mark.parametrize("opset", [1, 6])
@pytest.mark.parametrize(
    "b_shape, attrs",
    [
        ((2, 3, 4, 5), {}),
        ((), {"broadcast": 1}),
        ((1, 1), {"broadcast": 1}),
        ((5,), {"broadcast": 1}),
        ((4, 5), {"broadcast": 1}),
        ((3, 4), {"broadcast": 1, "axis": 1}),
        ((2,), {"broadcast": 1, "axis": 0}),
    ],
)
def test_legacy_broadcast(rng, opset, b_shape, attrs):
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    start = attrs.get("axis", 4 - b.ndim)
    aligned = b.reshape(b.shape + (1,) * (4 - start - b.ndim))
    b = b + np.float32(3)  # away from zero, for Div
    aligned = aligned + np.float32(3)
    for op_type, fn in (
        ("Add", np.add),
        ("Sub", np.subtract),
        ("Mul", np.multiply),
        ("Div", np.divide),
    ):
        _expect(op_type, {"A": a, "B": b}, attrs, [fn(a, aligned)], opset=opset)
    _expect(
        "Pow",
        {"X": np.abs(a), "Y": b},
        attrs,
        [np.power(np.abs(a), aligned)],
        opset=1,
        input_names=["X", "Y"],
    )
    for op_type, fn in (("Less", np.less), ("Greater", np.greater), ("Equal", np.equal)):
        _expect(op_type, {"A": a, "B": b}, attrs, [fn(a, aligned)], opset=1)


def test_legacy_broadcast_requires_the_attribute(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((3,)).astype(np.float32)
    with pytest.raises(TransmuterError, match="broadcast"):
        _expect("Add", {"A": a, "B": b}, {}, [a + b], opset=6)


def test_integer_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0, 9], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, 4], dtype=np.int32)
    outputs = check_node("Div", {"A": a, "B": b}, opset=14)
    np.testing.assert_array_equal(outputs[0], [3, -3, -3, 3, 0, 2])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("b_shape", [(), (1, 8, 1), (1, 1, 300)])
def test_div_by_a_broadcast_divisor_is_bit_exact(dtype, b_shape, rng):
    # XLA multiplies by the reciprocal of a divisor it broadcasts: one ulp off on ~20% of the
    # float32 quotients, where ONNX Runtime divides (Kokoro-82M int8's quantized biases).
    a = (rng.standard_normal((2, 8, 300)) * 10).astype(dtype)
    b = (rng.uniform(0.5, 2.0, b_shape) * 7.3e-3).astype(dtype)
    model = make_node_model("Div", {"A": a, "B": b}, opset=14)
    want = ort_run(model, {"A": a, "B": b})[0]
    assert (want != (a * (1 / b)).astype(dtype)).any()  # where a reciprocal misleads
    for mode, (got,) in transmuter_runs(model, {"A": a, "B": b}, eager=True).items():
        mismatches = int(np.sum(np.asarray(got) != want))
        assert mismatches == 0, f"{mode}: {mismatches} of {want.size} differ"


@pytest.mark.parametrize(
    "x_dtype, y_dtype",
    [
        (np.float32, np.float32),
        (np.float64, np.float64),
        (np.float32, np.int64),
        (np.float32, np.int32),
        (np.int32, np.int32),
        (np.int64, np.int64),
        (np.int64, np.float32),
        (np.int32, np.float32),
        (np.float64, np.float32),
        (np.float32, np.float64),
        (np.float16, np.float16),
        (np.float16, np.float32),
    ],
)
def test_pow_mixed_types(rng, x_dtype, y_dtype):
    x = (
        (rng.random((3, 4)) * 3 + 0.5).astype(x_dtype)
        if np.dtype(x_dtype).kind == "f"
        else rng.integers(-4, 5, (3, 4)).astype(x_dtype)
    )
    y = rng.integers(0, 4, (4,)).astype(y_dtype)
    if np.dtype(y_dtype).kind == "f" and np.dtype(x_dtype).kind == "f":
        y = (rng.random((4,)) * 3 - 1).astype(y_dtype)
    check_node(
        "Pow",
        {"X": x, "Y": y},
        opset=15,
        input_names=["X", "Y"],
        **TOL.get(x_dtype, {"rtol": 1e-5, "atol": 1e-6}),
    )


def test_pow_negative_integer_exponents():
    x = np.array([2, -2, 3, 1, -1, -1, 5], np.int64)
    y = np.array([-1, 3, -2, -5, -3, -4, 0], np.int64)
    check_node("Pow", {"X": x, "Y": y}, opset=15, input_names=["X", "Y"])
    check_node("Pow", {"X": x.astype(np.int32), "Y": y.astype(np.int32)}, opset=15)


@pytest.mark.parametrize("opset", [7, 12, 13])
def test_pow_versions(rng, opset):
    x = (rng.random((2, 3)) + 0.5).astype(np.float32)
    y = rng.standard_normal((3,)).astype(np.float32)
    check_node("Pow", {"X": x, "Y": y}, opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint16])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_integers(rng, dtype, fmod):
    signed = np.dtype(dtype).kind == "i"
    a = rng.integers(-30 if signed else 0, 30, (4, 6)).astype(dtype)
    b = (rng.integers(1, 7, (6,)) * (rng.choice([-1, 1], (6,)) if signed else 1)).astype(dtype)
    for opset in (10, 13):
        check_node("Mod", {"A": a, "B": b}, {"fmod": fmod}, opset=opset)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_mod_fmod_floats(rng, dtype):
    a = (rng.standard_normal((3, 4)) * 10).astype(dtype)
    b = (rng.standard_normal((4,)) * 3).astype(dtype)
    check_node("Mod", {"A": a, "B": b}, {"fmod": 1}, opset=13, **TOL[dtype])


def test_mod_v28_float_floor_semantics():
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 3.0, -3.0, np.inf, 2.0], dtype=np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, -1.0, 1.0, np.inf, np.inf, 2.0, 0.0], dtype=np.float32)
    # A - floor(A / B) * B with the special cases Mod-28 lists (sign of zero included).
    want = np.array([1.5, 0.5, -0.5, -1.5, -0.0, 0.0, 3.0, np.inf, np.nan, np.nan], np.float32)
    _expect("Mod", {"A": a, "B": b}, {"fmod": 0}, [want], opset=28)
    model = make_node_model("Mod", {"A": a, "B": b}, {"fmod": 0}, opset=28)
    for outputs in transmuter_runs(model, {"A": a, "B": b}).values():
        np.testing.assert_array_equal(np.signbit(np.asarray(outputs[0])[4:6]), [True, False])


def test_mod_rejects_bad_fmod():
    a = np.ones((2,), np.int32)
    with pytest.raises(TransmuterError, match="fmod"):
        _expect("Mod", {"A": a, "B": a}, {"fmod": 2}, [a], opset=13)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_unsigned(rng, dtype, direction):
    x = rng.integers(0, 200, (3, 4)).astype(dtype)
    y = rng.integers(0, 6, (4,)).astype(dtype)
    check_node("BitShift", {"X": x, "Y": y}, {"direction": direction}, opset=11)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_v28_signed_and_out_of_range(direction):
    x = np.array([-128, -5, -1, 5, 64, 127, -8, 3], dtype=np.int8)
    y = np.array([1, 2, 9, 8, 1, -1, 7, 3], dtype=np.int8)
    if direction == "LEFT":
        want = [0, -20, 0, 0, -128, 0, 0, 24]
    else:
        want = [-64, -2, -1, 0, 32, 0, -1, 0]
    _expect(
        "BitShift", {"X": x, "Y": y}, {"direction": direction}, [np.array(want, np.int8)], opset=28
    )
    u = np.array([1, 255, 128], dtype=np.uint8)
    shift = np.array([8, 9, 7], dtype=np.uint8)
    want_u = [0, 0, 0] if direction == "LEFT" else [0, 0, 1]
    _expect(
        "BitShift",
        {"X": u, "Y": shift},
        {"direction": direction},
        [np.array(want_u, np.uint8)],
        opset=28,
    )


@pytest.mark.parametrize("op_type", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.uint8])
def test_comparisons(rng, op_type, dtype):
    a = rng.integers(0, 4, (3, 4)).astype(dtype)
    b = rng.integers(0, 4, (4,)).astype(dtype)
    check_node(op_type, {"A": a, "B": b}, opset=16 if "Or" in op_type else 13)


@pytest.mark.parametrize(
    "op_type, opset",
    [
        ("Equal", 7),
        ("Equal", 11),
        ("Equal", 19),
        ("Less", 7),
        ("Less", 9),
        ("Greater", 7),
        ("Greater", 9),
        ("LessOrEqual", 12),
        ("GreaterOrEqual", 12),
    ],
)
def test_comparison_versions(rng, op_type, opset):
    # Less/Greater take integers from opset 9; Equal takes floats from opset 11.
    dtype = np.int32 if (opset >= 9) != (op_type == "Equal" and opset < 11) else np.float32
    a = rng.integers(0, 3, (2, 3)).astype(dtype)
    b = rng.integers(0, 3, (2, 1)).astype(dtype)
    check_node(op_type, {"A": a, "B": b}, opset=opset)


def test_equal_bool_and_strings():
    a = np.array([True, False, True])
    check_node("Equal", {"A": a, "B": np.array([True, True, False])}, opset=19)
    s = np.array(["a", "bc", ""], dtype=object)
    t = np.array(["a", "b", ""], dtype=object)
    _expect("Equal", {"A": s, "B": t}, {}, [np.array([True, False, True])], opset=19)


@pytest.mark.parametrize("op_type", ["And", "Or", "Xor"])
def test_logical(rng, op_type):
    a = rng.standard_normal((2, 3, 4)) > 0
    b = rng.standard_normal((3, 1)) > 0
    check_node(op_type, {"A": a, "B": b}, opset=7)
    _expect(
        op_type,
        {"A": a, "B": b[:, 0]},
        {"broadcast": 1, "axis": 1},
        [getattr(np, f"logical_{op_type.lower()}")(a, b)],
        opset=1,
    )


@pytest.mark.parametrize("op_type", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint64])
def test_bitwise(rng, op_type, dtype):
    a = rng.integers(0, 120, (3, 4)).astype(dtype)
    b = rng.integers(0, 120, (4,)).astype(dtype)
    check_node(op_type, {"A": a, "B": b}, opset=18)


# -------------------------------------------------------------------------------- variadic


@pytest.mark.parametrize("op_type", ["Min", "Max", "Sum", "Mean"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_variadic(rng, op_type, count):
    shapes = [(2, 3, 4), (3, 1), (4,)][:count]
    inputs = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    check_node(op_type, inputs, opset=13)


@pytest.mark.parametrize(
    "op_type, opset",
    [(op_type, opset) for op_type in ("Min", "Max", "Sum", "Mean") for opset in (1, 6, 8)]
    + [("Min", 12), ("Max", 12)],
)
def test_variadic_versions(rng, op_type, opset):
    inputs = {f"x{i}": rng.standard_normal((3, 4)).astype(np.float32) for i in range(3)}
    # ONNX Runtime has no kernels for the version-1 operators with `consumed_inputs`.
    check_node(op_type, inputs, opset=opset, reference="onnx" if opset == 1 else "ort")


@pytest.mark.parametrize(
    "op_type, dtype",
    [
        (op_type, dtype)
        for op_type in ("Min", "Max", "Sum", "Mean")
        for dtype in (np.float16, np.float64, np.int32, np.int64, np.uint8)
        if op_type in ("Min", "Max") or np.dtype(dtype).kind == "f"
    ],
)
def test_variadic_dtypes(rng, op_type, dtype):
    inputs = {f"x{i}": (rng.standard_normal((3, 4)) * 10).astype(dtype) for i in range(3)}
    # ONNX Runtime has no float64 Mean.
    reference = "onnx" if (op_type, dtype) == ("Mean", np.float64) else "ort"
    check_node(op_type, inputs, opset=13, reference=reference, **TOL.get(dtype, {}))


def test_where(rng):
    cond = rng.standard_normal((3, 1)) > 0
    for dtype in (np.float32, np.int64, np.float16, np.bool_):
        x = rng.standard_normal((3, 4)).astype(dtype)
        y = rng.standard_normal((4,)).astype(dtype)
        reference = "onnx" if dtype == np.bool_ else "ort"  # ONNX Runtime has no bool Where
        check_node("Where", {"C": cond, "X": x, "Y": y}, opset=16, reference=reference)
    check_node("Where", {"C": cond, "X": x.astype(np.float32), "Y": y.astype(np.float32)}, opset=9)
    s = np.array(["a", "b", "c"], dtype=object)
    t = np.array(["x", "y", "z"], dtype=object)
    c = np.array([True, False, True])
    _expect(
        "Where",
        {"C": c, "X": s, "Y": t},
        {},
        [np.array(["a", "y", "c"], dtype=object)],
        opset=16,
    )


# ------------------------------------------------------------------------------------ Clip


def test_clip_attributes(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32) * 3
    check_node("Clip", {"X": x}, {"min": -1.0, "max": 1.5}, opset=6)
    check_node("Clip", {"X": x}, {"max": 1.5}, opset=6)
    check_node("Clip", {"X": x}, opset=6)
    _expect("Clip", {"X": x}, {"min": -0.5}, [np.maximum(x, -0.5)], opset=1)
    _expect("Clip", {"X": x}, {}, [x], opset=1)


@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("bounds", ["both", "min", "max", "none", "inverted"])
def test_clip_inputs(rng, opset, bounds):
    x = rng.standard_normal((3, 4)).astype(np.float32) * 3
    lo, hi = np.float32(-1.0), np.float32(1.5)
    if bounds == "inverted":
        lo, hi = hi, lo
    inputs = {
        "X": x,
        "min": lo if bounds != "max" else None,
        "max": hi if bounds != "min" else None,
    }
    if bounds == "none":
        inputs = {"X": x, "min": None, "max": None}
    check_node("Clip", inputs, opset=opset, input_names=["X", "min", "max"])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float16, np.float64])
def test_clip_dtypes(rng, dtype):
    x = (rng.standard_normal((3, 4)) * 10).astype(dtype)
    inputs = {"X": x, "min": np.asarray(2, dtype), "max": np.asarray(7, dtype)}
    check_node("Clip", inputs, opset=13, constants=["min", "max"])


# ------------------------------------------------------------------------------------ Cast

NUMERIC = [
    np.float32,
    np.float64,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
]


@pytest.mark.parametrize("to", NUMERIC, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(
    "source", [np.float32, np.int64, np.bool_, np.uint8, np.float16], ids=lambda d: np.dtype(d).name
)
def test_cast_numeric(rng, source, to):
    x = (rng.standard_normal((3, 5)) * 60).astype(source)
    if np.dtype(source).kind == "f" and np.dtype(to).kind in "iu":
        # Out-of-range float -> integer casts are undefined.
        x = np.clip(np.abs(x) if np.dtype(to).kind == "u" else x, -128, 127)
    check_node("Cast", {"X": x}, {"to": dtypes.to_onnx(to)}, opset=13)


def test_cast_integer_wraps_and_float_to_bool():
    x = np.array([200, -56, 300, -1, 0], dtype=np.int16)
    check_node("Cast", {"X": x}, {"to": T.INT8}, opset=13)
    check_node("Cast", {"X": x}, {"to": T.UINT8}, opset=13)
    f = np.array([0.0, -0.0, np.nan, 0.1, -3.0], dtype=np.float32)
    check_node("Cast", {"X": f}, {"to": T.BOOL}, opset=13)


@pytest.mark.parametrize("opset", [6, 9, 21, 25, 28])
def test_cast_versions(rng, opset):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    check_node("Cast", {"X": x}, {"to": T.DOUBLE}, opset=opset)
    check_node("Cast", {"X": x * 10}, {"to": T.INT16}, opset=opset)


def test_cast_v1_names_the_type(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32) * 10
    _expect("Cast", {"X": x}, {"to": "INT32"}, [x.astype(np.int32)], opset=1)
    _expect("Cast", {"X": x}, {"to": "double"}, [x.astype(np.float64)], opset=1)


def test_cast_bfloat16(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    # ONNX Runtime's Python API cannot return bfloat16 tensors.
    check_node("Cast", {"X": x}, {"to": T.BFLOAT16}, opset=13, reference="onnx")
    check_node(
        "Cast", {"X": x.astype(ml_dtypes.bfloat16)}, {"to": T.FLOAT}, opset=13, constants=["X"]
    )


FLOAT8 = [
    (T.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn),
    (T.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz),
    (T.FLOAT8E5M2, ml_dtypes.float8_e5m2),
    (T.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz),
]


@pytest.mark.parametrize("to, dtype", FLOAT8, ids=lambda v: str(v))
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("opset", [19, 21, 23])
def test_cast_float8(rng, to, dtype, saturate, opset):
    x = np.concatenate([rng.standard_normal(12) * 100, [1e6, -1e6, 0.0, -0.0, 0.3]])
    x = x.astype(np.float32)
    # ONNX Runtime's Python API cannot return float8 tensors (or take them as inputs).
    check_node("Cast", {"X": x}, {"to": to, "saturate": saturate}, opset=opset, reference="onnx")
    check_node("Cast", {"X": x.astype(dtype)}, {"to": T.FLOAT}, opset=opset, constants=["X"])


@pytest.mark.parametrize("to, dtype", FLOAT8, ids=lambda v: str(v))
@pytest.mark.parametrize("opset", [19, 23])
def test_cast_float8_infinity(to, dtype, opset):
    x = np.array([np.inf, -np.inf, np.nan, 1e9], dtype=np.float32)
    limit = float(ml_dtypes.finfo(dtype).max)
    fnuz = to in (T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2FNUZ)
    # Cast-19/21 turn Inf into NaN for the FNUZ types even when saturating; Cast-23 saturates.
    inf = np.nan if fnuz and opset < 23 else limit
    want = np.array([inf, -inf, np.nan, limit], np.float32).astype(dtype)
    _expect("Cast", {"X": x}, {"to": to, "saturate": 1}, [want], opset=opset)
    _expect("Cast", {"X": x}, {"to": to, "saturate": 0}, [x.astype(dtype)], opset=opset)


def test_cast_float8_from_float64_and_integers():
    # float8 results: onnx.reference (ONNX Runtime's Python API cannot return them).
    x = np.array([1000.0, -3.3, 0.5], dtype=np.float64)
    check_node("Cast", {"X": x}, {"to": T.FLOAT8E4M3FN}, opset=19, reference="onnx")
    i = np.array([1000, -3, 7], dtype=np.int32)
    check_node("Cast", {"X": i}, {"to": T.FLOAT8E4M3FN}, opset=19, reference="onnx")


@pytest.mark.parametrize(
    "to, dtype",
    [(T.INT4, ml_dtypes.int4), (T.UINT4, ml_dtypes.uint4), (T.FLOAT4E2M1, ml_dtypes.float4_e2m1fn)],
)
def test_cast_4bit(to, dtype):
    x = np.array([-8, -3, 0, 1, 5, 7], dtype=np.int32)
    if to == T.UINT4:
        x = np.abs(x)
    # ONNX Runtime's Python API cannot return 4-bit tensors.
    check_node(
        "Cast", {"X": x}, {"to": to}, opset=21 if to != T.FLOAT4E2M1 else 23, reference="onnx"
    )
    # ONNX Runtime has no float4 Cast.
    reference = "onnx" if to == T.FLOAT4E2M1 else "ort"
    check_node(
        "Cast",
        {"X": x.astype(dtype)},
        {"to": T.FLOAT},
        opset=23,
        constants=["X"],
        reference=reference,
    )


def test_cast_int4_wraps():
    x = np.array([7, 8, -9, 17], dtype=np.int32)
    _expect("Cast", {"X": x}, {"to": T.INT4}, [np.array([7, -8, 7, 1], ml_dtypes.int4)], opset=21)


SUB_BYTE_INTS = [
    (T.INT4, ml_dtypes.int4, (21, 23, 24, 25, 28)),
    (T.UINT4, ml_dtypes.uint4, (21, 23, 24, 25, 28)),
    (T.INT2, ml_dtypes.int2, (25, 28)),
    (T.UINT2, ml_dtypes.uint2, (25, 28)),
]


@pytest.mark.parametrize(
    "to, dtype, opset",
    [
        pytest.param(to, dtype, v, id=f"{T.DataType.Name(to)}-{v}")
        for to, dtype, versions in SUB_BYTE_INTS
        for v in versions
    ],
)
@pytest.mark.parametrize("source", [np.float32, np.float16, np.float64], ids=["f32", "f16", "f64"])
def test_cast_float_to_sub_byte_int_wraps(to, dtype, opset, source):
    """Out-of-range floats truncate toward zero and keep the low bits, in every Cast version
    (the spec leaves float -> integer overflow undefined; onnx's conformance data wraps):
    INT4 -9 -> 7 and 8 -> -8, UINT4 -1 -> 15, INT2 2 -> -2."""
    x = np.concatenate([np.arange(-9, 17), [2.7, -2.7, 100.5, -100.5]]).astype(source)
    # ONNX Runtime's Python API cannot return 4- or 2-bit tensors; onnx.reference wraps.
    reference = check_node("Cast", {"X": x}, {"to": to}, opset=opset, reference="onnx")[0]
    info = ml_dtypes.iinfo(dtype)
    wrapped = np.trunc(x).astype(np.int64) % (1 << info.bits)
    wrapped = np.where(wrapped > info.max, wrapped - (1 << info.bits), wrapped)
    np.testing.assert_array_equal(reference.astype(np.int64), wrapped)


@pytest.mark.parametrize(
    "to, dtype, versions",
    [pytest.param(*case, id=T.DataType.Name(case[0])) for case in SUB_BYTE_INTS],
)
def test_cast_like_float_to_sub_byte_int_wraps(to, dtype, versions):
    x = np.arange(-9, 17).astype(np.float32)
    like = np.zeros((1,), dtype)
    for opset in [v for v in (21, 23, 24, 25) if v >= versions[0]]:
        check_node("CastLike", {"X": x, "like": like}, opset=opset, reference="onnx")


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_e8m0(round_mode, saturate):
    x = np.array([1.0, 1.4, 1.5, 1.6, 3.0, 0.3, 1024.5, 2.0**-100, 6e37], dtype=np.float32)
    attrs = {"to": T.FLOAT8E8M0, "round_mode": round_mode, "saturate": saturate}
    # ONNX Runtime's Python API cannot return float8e8m0 tensors.
    check_node("Cast", {"X": x}, attrs, opset=24, reference="onnx")


def test_cast_from_e8m0():
    x = np.array([1.0, 0.25, 2.0**100, np.nan], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    check_node("Cast", {"X": x}, {"to": T.FLOAT}, opset=24, constants=["X"])


def test_cast_e8m0_special_values():
    # The Cast-24 table; onnx.reference keeps Inf as NaN and zero as 2**-127 in both modes.
    x = np.array([0.0, np.nan, np.inf, 3e38, 1e-39], dtype=np.float32)
    e8m0 = ml_dtypes.float8_e8m0fnu
    lo, hi, nan = 2.0**-127, 2.0**127, np.nan
    saturated = np.array([lo, nan, hi, hi, lo], np.float32).astype(e8m0)
    _expect("Cast", {"X": x}, {"to": T.FLOAT8E8M0}, [saturated], opset=24)
    attrs = {"to": T.FLOAT8E8M0, "saturate": 0, "round_mode": "nearest"}
    _expect("Cast", {"X": x}, attrs, [np.full(5, nan, np.float32).astype(e8m0)], opset=24)
    with pytest.raises(TransmuterError, match="round_mode"):
        _expect("Cast", {"X": x}, {"to": T.FLOAT8E8M0, "round_mode": "odd"}, [x], opset=24)


def test_cast_strings():
    s = np.array(["3.14", "1e-5", "INF", "-inf", "NaN", "+INF", "100", "1E8", "-0"], dtype=object)
    for to in (T.FLOAT, T.DOUBLE, T.FLOAT16):
        check_node("Cast", {"X": s}, {"to": to}, opset=13)
    ints = np.array(["3", "100", "-7", "0"], dtype=object)
    for to in (T.INT64, T.INT8, T.UINT8, T.BOOL):
        check_node("Cast", {"X": ints}, {"to": to}, opset=13)
    _expect(
        "Cast",
        {"X": np.array(["100.5", "-2.7"], dtype=object)},
        {"to": T.INT32},
        [np.array([100, -2], np.int32)],
        opset=13,
    )
    _expect(
        "Cast",
        {"X": np.array(["1000", "-1e6"], dtype=object)},
        {"to": T.FLOAT8E4M3FN},
        [np.array([448, -448], ml_dtypes.float8_e4m3fn)],
        opset=23,
    )


def test_cast_to_strings():
    f = np.array([0.1, 314.15926, 1e-5, 1e20, -2.5, np.inf, -np.inf, np.nan, 3.0, -0.0], np.float32)
    for x in (
        f,
        f.astype(np.float64),
        np.array([0, -12, 2**40], np.int64),
        np.array([True, False]),
    ):
        check_node("Cast", {"X": x}, {"to": T.STRING}, opset=13)


def test_cast_to_string_of_a_traced_value_breaks_the_graph():
    x = np.array([1.5, -2.0], np.float32)
    model = make_node_model("Cast", {"X": x}, {"to": T.STRING}, opset=13)
    for outputs in transmuter_runs(model, {"X": x}).values():
        np.testing.assert_array_equal(outputs[0], np.array(["1.5", "-2"], dtype=object))


@pytest.mark.parametrize("opset", [15, 19, 21, 23, 24, 25])
def test_cast_like(rng, opset):
    x = np.abs(rng.standard_normal((3, 4)) * 10).astype(np.float32)
    for like in (np.int32, np.float16, np.float64, np.bool_, np.uint8):
        check_node("CastLike", {"X": x, "like": np.zeros((1,), like)}, opset=opset)
    if opset >= 19:
        big = np.array([1e4, -1e4, 3.0], np.float32)
        like = np.zeros((1,), ml_dtypes.float8_e4m3fn)
        for saturate in (0, 1):
            # ONNX Runtime's Python API cannot take or return float8 tensors.
            check_node(
                "CastLike",
                {"X": big, "like": like},
                {"saturate": saturate},
                opset=opset,
                reference="onnx",
            )


def test_cast_zero_size_and_symbolic(rng):
    check_node("Cast", {"X": np.zeros((0, 3), np.float32)}, {"to": T.INT64}, opset=21)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    check_node("Cast", {"X": x}, {"to": T.FLOAT16}, opset=21, symbolic={"X": [0]})


# ----------------------------------------------------------------------------- activations


@pytest.mark.parametrize(
    "op_type, opsets, attrs",
    [
        ("LeakyRelu", (1, 6, 16), [{}, {"alpha": 0.3}]),
        ("Elu", (1, 6, 22), [{}, {"alpha": 0.5}]),
        # onnx.reference applies Selu-6's defaults to Selu-1: see test_selu_v1_defaults.
        ("Selu", (6, 22), [{}, {"alpha": 1.5, "gamma": 2.0}]),
        ("Celu", (12, 28), [{}, {"alpha": 2.0}]),
        ("HardSigmoid", (1, 6, 22), [{}, {"alpha": 0.3, "beta": 0.4}]),
        ("ThresholdedRelu", (10, 22), [{}, {"alpha": 0.5}]),
        ("Gelu", (20,), [{}, {"approximate": "tanh"}]),
        ("Swish", (24,), [{}, {"alpha": 0.7}]),
        ("Shrink", (9,), [{}, {"bias": 0.2, "lambd": 1.0}]),
    ],
)
def test_activation_attributes(rng, op_type, opsets, attrs):
    x = rng.standard_normal((3, 5)).astype(np.float32) * 2
    for opset in opsets:
        for attr in attrs:
            # ONNX Runtime has no kernels for the version-1 operators with `consumed_inputs`.
            reference = "onnx" if opset == 1 else "ort"
            check_node(op_type, {"X": x}, attr, opset=opset, reference=reference)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize(
    "op_type, opset",
    [
        ("LeakyRelu", 16),
        ("Elu", 22),
        ("Selu", 22),
        ("Celu", 28),
        ("HardSigmoid", 22),
        ("ThresholdedRelu", 22),
        ("Gelu", 20),
        ("Shrink", 9),
        ("Swish", 24),
        ("Mish", 22),
    ],
)
def test_activation_dtypes(rng, op_type, opset, dtype):
    x = (rng.standard_normal((3, 5)) * 2).astype(dtype)
    reference = "onnx" if dtype == np.float64 and op_type in NO_ORT_DOUBLE else "ort"
    # Both references compute some float64 activations in float32 (ORT: Shrink).
    tol = TOL_ONNX_DOUBLE if dtype == np.float64 else TOL[dtype]
    check_node(op_type, {"X": x}, opset=opset, reference=reference, **tol)


def test_selu_v1_defaults(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    alpha, gamma = 1.673200011253357, 1.0506999492645264
    want = gamma * np.where(x <= 0, alpha * np.expm1(x), x)
    _expect("Selu", {"X": x}, {}, [want.astype(np.float32)], opset=1)


def test_shrink_integers():
    x = np.arange(-5, 6, dtype=np.int32)
    check_node("Shrink", {"X": x}, {"bias": 1.5, "lambd": 2.0}, opset=9)
    check_node("Shrink", {"X": x.astype(np.uint8) + 5}, {"bias": 1.0, "lambd": 6.0}, opset=9)


def test_gelu_rejects_unknown_approximation(rng):
    x = rng.standard_normal((2,)).astype(np.float32)
    with pytest.raises(TransmuterError, match="approximate"):
        _expect("Gelu", {"X": x}, {"approximate": "erf"}, [x], opset=20)


@pytest.mark.parametrize(
    "x_shape, slope_shape, opset",
    [
        ((2, 3, 4, 5), (3, 1, 1), 16),
        ((2, 3, 4, 5), (5,), 9),
        ((2, 3), (), 7),
        ((2, 3, 4, 5), (1,), 6),
        ((2, 3, 4), (2, 3, 4), 6),
        ((2, 3, 4), (3,), 6),
        ((2, 3, 4, 5), (3,), 6),
        ((2, 3, 4, 5, 6), (3,), 1),
        ((0, 3), (3,), 16),
    ],
)
def test_prelu(rng, x_shape, slope_shape, opset):
    x = rng.standard_normal(x_shape).astype(np.float32)
    slope = rng.random(slope_shape).astype(np.float32)
    check_node(
        "PRelu",
        {"X": x, "slope": slope},
        opset=opset,
        constants=["slope"],
        reference="onnx" if opset < 7 else "ort",  # ONNX Runtime has no PRelu-1/6
    )


def test_prelu_integers_and_v1(rng):
    x = rng.integers(-10, 10, (3, 4)).astype(np.int32)
    check_node("PRelu", {"X": x, "slope": np.full((4,), 3, np.int32)}, opset=16)
    f = rng.standard_normal((3, 4)).astype(np.float32)
    check_node(
        "PRelu", {"X": f, "slope": np.full((1,), 0.5, np.float32)}, opset=1, reference="onnx"
    )


@pytest.mark.parametrize("opset", [1, 6])
def test_prelu_v6_slope_per_channel(rng, opset):
    """Before opset 7 a [C] slope applies along X's axis 1 (the pytorch-converted PReLU
    models), even where NumPy would broadcast it along the last axis."""
    x = rng.standard_normal((2, 3, 3)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    want = np.where(x < 0, x * slope[:, None], x)
    _expect("PRelu", {"X": x, "slope": slope}, {}, [want], opset=opset)


def test_prelu_v7_slope_broadcasts_numpy_style(rng):
    # From opset 7 the slope broadcasts unidirectionally: [C] meets X's last axis, not axis 1.
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    with pytest.raises(TransmuterError, match="unidirectionally"):
        _expect("PRelu", {"X": x, "slope": np.ones((3,), np.float32)}, {}, [x], opset=7)


def test_prelu_slope_must_broadcast_onto_x(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    slope = rng.random((4, 3)).astype(np.float32)
    with pytest.raises(TransmuterError, match="unidirectionally"):
        _expect("PRelu", {"X": x, "slope": slope}, {}, [x], opset=16)
    with pytest.raises(TransmuterError, match="one element"):
        _expect("PRelu", {"X": x, "slope": slope[:1]}, {}, [x], opset=6)


def test_div_of_constants():
    """Shape arithmetic: every input is a constant, so Div runs on host values."""
    a = np.array([2, 3], np.int64)
    b = np.array([4, -2], np.int64)
    model = make_node_model("Div", {"A": a, "B": b}, opset=14, constants=["A", "B"])
    for outputs in transmuter_runs(model, {}).values():
        np.testing.assert_array_equal(outputs[0], [0, -1])


# Host values (shape arithmetic) are computed with numpy where its semantics are the spec's: the
# same ops with every input a constant (on the host) and with every input a graph input (on the
# device) must agree with ONNX Runtime alike. Values cover signs, zero and int64 extremes.
_INTS = np.array([-7, -1, 0, 1, 5, 2**62, -(2**62)], np.int64)
_DIVISORS = np.array([2, -3, 5, 1, -1, 3, 7], np.int64)
_FLOATS = np.array([-2.5, -0.5, 0.0, 0.5, 1.5, 3.25, -7.75], np.float32)
_HOST_CASES = [
    ("Add", {"A": _INTS, "B": _DIVISORS}, {}),
    ("Sub", {"A": _INTS, "B": _DIVISORS}, {}),
    ("Mul", {"A": _INTS, "B": _DIVISORS}, {}),
    ("Div", {"A": _INTS, "B": _DIVISORS}, {}),
    ("Div", {"A": _FLOATS, "B": _FLOATS[::-1] + 0.25}, {}),
    ("Equal", {"A": _INTS, "B": _INTS[::-1]}, {}),
    ("Less", {"A": _INTS, "B": _DIVISORS}, {}),
    ("Greater", {"A": _FLOATS, "B": _FLOATS[::-1]}, {}),
    ("LessOrEqual", {"A": _INTS, "B": _INTS[::-1]}, {}),
    ("GreaterOrEqual", {"A": _INTS, "B": _DIVISORS}, {}),
    ("And", {"A": _INTS > 0, "B": _DIVISORS > 0}, {}),
    ("Or", {"A": _INTS > 0, "B": _DIVISORS > 0}, {}),
    ("Xor", {"A": _INTS > 0, "B": _DIVISORS > 0}, {}),
    ("Not", {"X": _INTS > 0}, {}),
    ("Neg", {"X": _INTS}, {}),
    ("Abs", {"X": _FLOATS}, {}),
    ("Sign", {"X": _INTS}, {}),
    ("Floor", {"X": _FLOATS}, {}),
    ("Ceil", {"X": _FLOATS}, {}),
    ("Min", {"A": _INTS, "B": _DIVISORS}, {}),
    ("Max", {"A": _FLOATS, "B": _FLOATS[::-1]}, {}),
    ("Where", {"C": _INTS > 0, "X": _INTS, "Y": _DIVISORS}, {}),
    ("Cast", {"X": _INTS}, {"to": T.INT32}),
    ("Cast", {"X": _INTS}, {"to": T.FLOAT}),
    ("Cast", {"X": _INTS > 0}, {"to": T.INT64}),
    ("Cast", {"X": _FLOATS}, {"to": T.FLOAT16}),
    ("Cast", {"X": _FLOATS.astype(np.float64) / 3}, {"to": T.FLOAT}),
]


@pytest.mark.parametrize("constants", [True, False], ids=["host", "device"])
@pytest.mark.parametrize(
    "op_type,inputs,attrs", _HOST_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(_HOST_CASES)]
)
def test_host_and_device_values_agree(op_type, inputs, attrs, constants):
    check_node(op_type, inputs, attrs, opset=19, constants=list(inputs) if constants else ())
