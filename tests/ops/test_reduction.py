"""Reductions, arg-reductions, softmax family, cumulative ops, TopK and LpNormalization against
ONNX Runtime (or onnx.reference where ORT has no kernel)."""

import ml_dtypes
import numpy as np
import pytest
from opcheck import assert_close, check_node, make_node_model, transmuter_runs

from transmuter.errors import TransmuterError

TOL = {
    np.float16: {"rtol": 1e-2, "atol": 1e-2},
    np.float32: {"rtol": 1e-5, "atol": 1e-5},
    np.float64: {"rtol": 1e-10, "atol": 1e-12},
}

# (op, versions with the axes attribute, versions with the axes input)
REDUCE = [
    ("ReduceSum", (1, 11), (13,)),
    ("ReduceMean", (1, 11, 13), (18,)),
    ("ReduceMax", (1, 11, 12, 13), (18, 20)),
    ("ReduceMin", (1, 11, 12, 13), (18, 20)),
    ("ReduceProd", (1, 11, 13), (18,)),
    ("ReduceL1", (1, 11, 13), (18,)),
    ("ReduceL2", (1, 11, 13), (18,)),
    ("ReduceLogSum", (1, 11, 13), (18, 28)),
    ("ReduceLogSumExp", (1, 11, 13), (18, 28)),
    ("ReduceSumSquare", (1, 11, 13), (18,)),
]
LATEST = {name: inputs[-1] for name, _, inputs in REDUCE}


def _expect(op_type, inputs, attrs, expected, *, opset, **options):
    """Run through Transmuter only and compare with `expected` (for semantics no reference has)."""
    model = make_node_model(op_type, inputs, attrs, opset=opset, **options)
    for mode, outputs in transmuter_runs(model, inputs).items():
        for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
            assert_close(got, want, rtol=1e-6, atol=1e-6, what=f"{op_type} output {i} ({mode})")


def _positive(rng, shape, dtype=np.float32):
    # Positive data keeps ReduceLogSum defined and ReduceProd well scaled.
    return (rng.random(shape) + 0.5).astype(dtype)


@pytest.mark.parametrize("op_type, opset", [(name, v) for name, attrs, _ in REDUCE for v in attrs])
@pytest.mark.parametrize(
    "axes, keepdims", [(None, 1), (None, 0), ([1], 0), ([0, 2], 1), ([-1], 0)], ids=str
)
def test_reduce_axes_attribute(rng, op_type, opset, axes, keepdims):
    attrs = {"keepdims": keepdims}
    if axes is not None:
        if opset == 1 and min(axes) < 0:
            axes = [a + 3 for a in axes]  # negative axes arrive in opset 11
        attrs["axes"] = axes
    check_node(op_type, {"X": _positive(rng, (2, 3, 4))}, attrs, opset=opset)


@pytest.mark.parametrize(
    "op_type, opset", [(name, v) for name, _, inputs in REDUCE for v in inputs]
)
@pytest.mark.parametrize(
    "axes, keepdims, noop",
    [
        (None, 1, 0),
        (None, 0, 0),
        ([], 0, 0),
        (None, 1, 1),
        ([], 0, 1),
        ([1], 0, 1),
        ([-1, 0], 1, 0),
        ([2, 0], 0, 0),
    ],
    ids=str,
)
def test_reduce_axes_input(rng, op_type, opset, axes, keepdims, noop):
    inputs = {"X": _positive(rng, (2, 3, 4))}
    if axes is not None:
        inputs["axes"] = np.array(axes, dtype=np.int64)
    attrs = {"keepdims": keepdims, "noop_with_empty_axes": noop}
    check_node(op_type, inputs, attrs, opset=opset, constants=["axes"])


@pytest.mark.parametrize(
    "op_type, dtype",
    [
        (name, dtype)
        for name, _, _ in REDUCE
        for dtype in (np.float16, np.float64, np.int32, np.int64)
        if np.dtype(dtype).kind == "f" or name not in ("ReduceLogSum", "ReduceLogSumExp")
    ],
)
def test_reduce_dtypes(rng, op_type, dtype):
    if np.dtype(dtype).kind == "i":
        x = rng.integers(1, 5, (3, 4, 5)).astype(dtype)
    else:
        x = _positive(rng, (3, 4, 5), dtype)
    inputs = {"X": x, "axes": np.array([1, 2], np.int64)}
    opset = 13 if op_type == "ReduceSum" else 18
    check_node(
        op_type, inputs, {"keepdims": 0}, opset=opset, constants=["axes"], **TOL.get(dtype, {})
    )


def test_reduce_half_accumulates_in_float32():
    # 4096 ones overflow nothing, but float16 steps of 1 stop at 2048.
    x = np.ones((4096,), np.float16)
    _expect("ReduceSum", {"X": x}, {"keepdims": 0}, [np.array(4096, np.float16)], opset=13)
    inputs = {"X": x.astype(ml_dtypes.bfloat16)}
    _expect("ReduceMean", inputs, {"keepdims": 0}, [np.array(1, ml_dtypes.bfloat16)], opset=18)


def test_reduce_integer_mean_truncates():
    x = np.array([[1, 2], [-3, -4], [5, 5]], np.int32)
    check_node("ReduceMean", {"X": x}, {"axes": [1], "keepdims": 0}, opset=13)


@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_bool_and_small_ints(rng, op_type):
    x = rng.standard_normal((3, 4)) > 0
    check_node(op_type, {"X": x}, {"keepdims": 0}, opset=20)
    for dtype in (np.int8, np.uint8):
        check_node(op_type, {"X": rng.integers(0, 100, (3, 4)).astype(dtype)}, opset=20)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_max_min_bool_along_an_axis(keepdims):
    """False < True (ReduceMax-20): rows that are all False or all True must not take the
    identity's value."""
    x = np.array([[False, False, False], [False, True, False], [True, True, True]])
    inputs = {"X": x, "axes": np.array([1], np.int64)}
    for op_type in ("ReduceMax", "ReduceMin"):
        attrs = {"keepdims": keepdims}
        check_node(op_type, inputs, attrs, opset=20, constants=["axes"])


@pytest.mark.parametrize("op_type, value", [("ReduceMax", False), ("ReduceMin", True)])
def test_reduce_max_min_bool_empty_set(op_type, value):
    # The empty max is the smallest value (False), the empty min the largest (True).
    inputs = {"X": np.zeros((2, 0, 4), bool), "axes": np.array([1], np.int64)}
    want = np.full((2, 1, 4), value)
    _expect(op_type, inputs, {}, [want], opset=20, constants=["axes"])


@pytest.mark.parametrize(
    "op_type, value",
    [
        ("ReduceSum", 0.0),
        ("ReduceProd", 1.0),
        ("ReduceMax", -np.inf),
        ("ReduceMin", np.inf),
        ("ReduceL1", 0.0),
        ("ReduceL2", 0.0),
        ("ReduceSumSquare", 0.0),
        ("ReduceLogSum", -np.inf),
        ("ReduceLogSumExp", -np.inf),
        ("ReduceMean", np.nan),
    ],
)
def test_reduce_empty_set(op_type, value):
    x = np.zeros((2, 0, 3), np.float32)
    inputs = {"X": x, "axes": np.array([1], np.int64)}
    want = np.full((2, 1, 3), value, np.float32)
    opset = 13 if op_type == "ReduceSum" else 18
    _expect(op_type, inputs, {}, [want], opset=opset, constants=["axes"])


def test_reduce_zero_size_kept_axis_and_rank0(rng):
    check_node("ReduceSum", {"X": np.zeros((0, 3), np.float32)}, {"axes": [1]}, opset=11)
    check_node("ReduceMax", {"X": np.array(3.5, np.float32)}, {"keepdims": 0}, opset=13)
    check_node("ReduceMean", {"X": np.array(2.0, np.float32)}, opset=18)


def test_reduce_symbolic_batch(rng):
    x = rng.standard_normal((5, 3, 4)).astype(np.float32)
    inputs = {"X": x, "axes": np.array([-1], np.int64)}
    check_node("ReduceMean", inputs, opset=18, constants=["axes"], symbolic={"X": [0]})


def test_reduce_log_sum_exp_is_stable():
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf], [-1000.0, 0.0]], np.float32)
    want = np.array([1000.0 + np.log(2.0), -np.inf, 0.0], np.float32)
    _expect("ReduceLogSumExp", {"X": x}, {"axes": [1], "keepdims": 0}, [want], opset=13)


def test_reduce_rejects_bad_axes(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for axes in ([2], [0, -2]):
        with pytest.raises(TransmuterError, match="axes|axis"):
            _expect("ReduceSum", {"X": x}, {"axes": axes}, [x], opset=11)


# --------------------------------------------------------------------------- ArgMax/ArgMin


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("opset", [1, 11, 12, 13])
@pytest.mark.parametrize("axis, keepdims", [(0, 1), (1, 0), (-1, 1), (2, 0)])
def test_arg_extremes(rng, op_type, opset, axis, keepdims):
    if opset == 1 and axis < 0:
        axis += 3
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    check_node(op_type, {"X": x}, {"axis": axis, "keepdims": keepdims}, opset=opset)


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.uint8])
def test_arg_extremes_ties(op_type, select_last_index, dtype):
    x = np.array([[1, 3, 3, 0, 0], [2, 2, 2, 2, 2], [0, 5, 1, 5, 0]], dtype=dtype)
    attrs = {"axis": 1, "select_last_index": select_last_index}
    check_node(op_type, {"X": x}, attrs, opset=13)


# ------------------------------------------------------------------ Softmax, LogSoftmax, Hardmax


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize("axis", [None, 0, 2, -1])
def test_softmax_coerced_to_2d(rng, op_type, opset, axis):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    if opset == 1 and axis == -1:
        attrs = {"axis": 2}
    check_node(op_type, {"X": x}, attrs, opset=opset)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -2])
def test_softmax_single_axis(rng, op_type, axis):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    check_node(op_type, {"X": x}, {} if axis is None else {"axis": axis}, opset=13)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_softmax_dtypes(rng, op_type, dtype):
    x = (rng.standard_normal((3, 8)) * 3).astype(dtype)
    # ONNX Runtime has no float64 Hardmax.
    reference = "onnx" if (op_type, dtype) == ("Hardmax", np.float64) else "ort"
    check_node(op_type, {"X": x}, opset=13, reference=reference, **TOL[dtype])


def test_softmax_half_computes_in_float32():
    # exp(11) overflows float16; computed in float32 the result is exact.
    x = np.array([[11.0, 11.0, 11.0, 11.0]], np.float16)
    _expect("Softmax", {"X": x}, {}, [np.full((1, 4), 0.25, np.float16)], opset=13)
    bf = np.array([[0.0, 1.0, 2.0, -30.0]], np.float32)
    exp = np.exp(bf - bf.max())
    want = (exp / exp.sum()).astype(ml_dtypes.bfloat16)
    _expect("Softmax", {"X": bf.astype(ml_dtypes.bfloat16)}, {}, [want], opset=13)


def test_hardmax_first_maximum_and_zero_size():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], np.float32)
    check_node("Hardmax", {"X": x}, opset=13)
    check_node("Hardmax", {"X": x}, {"axis": 0}, opset=13)
    check_node("Hardmax", {"X": np.zeros((2, 0), np.float32)}, opset=13)
    check_node("Softmax", {"X": np.zeros((0, 3), np.float32)}, opset=13)


def test_softmax_symbolic_batch(rng):
    x = rng.standard_normal((4, 2, 6)).astype(np.float32)
    check_node("Softmax", {"X": x}, opset=13, symbolic={"X": [0]})
    check_node("LogSoftmax", {"X": x}, {"axis": 1}, opset=11, symbolic={"X": [0]})


# ----------------------------------------------------------------------------- CumSum, CumProd


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum(rng, exclusive, reverse, axis):
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    inputs = {"x": x, "axis": np.array(axis, np.int64)}
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check_node("CumSum", inputs, attrs, opset=14, constants=["axis"])


@pytest.mark.parametrize(
    "dtype, opset",
    [
        (np.float64, 11),
        (np.int32, 11),
        (np.int64, 11),
        (np.uint32, 11),
        (np.float64, 14),
        (np.int64, 14),
        (np.uint32, 14),
        (np.float16, 14),
    ],
)
def test_cumsum_dtypes(rng, dtype, opset):
    x = np.abs(rng.standard_normal((5, 3)) * 10).astype(dtype)
    inputs = {"x": x, "axis": np.array(0, np.int32)}
    # ONNX Runtime has no uint32 CumSum.
    reference = "onnx" if dtype == np.uint32 else "ort"
    check_node(
        "CumSum",
        inputs,
        {"exclusive": 1},
        opset=opset,
        constants=["axis"],
        reference=reference,
        **TOL.get(dtype, {}),
    )


def test_cumsum_zero_size(rng):
    inputs = {"x": np.zeros((0, 3), np.float32), "axis": np.array(0, np.int64)}
    for exclusive in (0, 1):
        check_node("CumSum", inputs, {"exclusive": exclusive}, opset=14, constants=["axis"])


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_cumprod(rng, exclusive, reverse, dtype):
    x = (rng.integers(1, 4, (3, 4)) * rng.choice([-1, 1], (3, 4))).astype(dtype)
    inputs = {"x": x, "axis": np.array(-1, np.int32)}
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check_node("CumProd", inputs, attrs, opset=26, constants=["axis"], **TOL.get(dtype, {}))


# ------------------------------------------------------------------------------------ TopK


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_top_k(rng, largest, axis, k):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    inputs = {"X": x, "K": np.array([k], np.int64)}
    attrs = {"axis": axis, "largest": largest}
    check_node("TopK", inputs, attrs, opset=11, constants=["K"], outputs=2)


@pytest.mark.parametrize("opset", [1, 10, 24])
def test_top_k_versions(rng, opset):
    x = rng.standard_normal((3, 6)).astype(np.float32)
    inputs = {"X": x} if opset == 1 else {"X": x, "K": np.array([4], np.int64)}
    attrs = {"k": 4} if opset == 1 else {}
    check_node("TopK", inputs, attrs, opset=opset, constants=["K"], outputs=2)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_top_k_ties_keep_lower_index(largest, dtype):
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 0, 0, 0, 0]], dtype=dtype)
    inputs = {"X": x, "K": np.array([4], np.int64)}
    check_node(
        "TopK",
        inputs,
        {"largest": largest},
        opset=11,
        constants=["K"],
        outputs=2,
    )


def test_top_k_extreme_integers():
    x = np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max, -1], np.int64)
    inputs = {"X": x, "K": np.array([2], np.int64)}
    check_node("TopK", inputs, {"largest": 0}, opset=11, constants=["K"], outputs=2)


def test_top_k_half_and_symbolic(rng):
    x = rng.standard_normal((4, 7)).astype(np.float16)
    inputs = {"X": x, "K": np.array([3], np.int64)}
    check_node("TopK", inputs, opset=11, constants=["K"], outputs=2)
    inputs["X"] = x.astype(np.float32)
    check_node("TopK", inputs, opset=11, constants=["K"], outputs=2, symbolic={"X": [0]})


def test_top_k_rejects_k_larger_than_axis(rng):
    inputs = {"X": np.zeros((2, 3), np.float32), "K": np.array([4], np.int64)}
    with pytest.raises(TransmuterError, match="k=4"):
        _expect("TopK", inputs, {}, [], opset=11, constants=["K"], outputs=2)


# ------------------------------------------------------------------------- LpNormalization


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_lp_normalization(rng, opset, p, axis):
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    check_node("LpNormalization", {"X": x}, {"p": p, "axis": axis}, opset=opset)


def test_lp_normalization_zero_norm_and_dtypes(rng):
    x = np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)
    _expect("LpNormalization", {"X": x}, {}, [np.array([[0, 0], [0.6, 0.8]], np.float32)], opset=22)
    for dtype in (np.float16, np.float64):
        y = rng.standard_normal((3, 5)).astype(dtype)
        check_node("LpNormalization", {"X": y}, {"p": 1}, opset=22, **TOL[dtype])
    with pytest.raises(TransmuterError, match="p must be"):
        _expect("LpNormalization", {"X": x}, {"p": 3}, [x], opset=22)
