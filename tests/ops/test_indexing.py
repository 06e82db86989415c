"""Indexing operators against ONNX Runtime (or onnx.reference where ORT lacks them)."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from opcheck import assert_close, check_node, make_node_model, transmuter_runs

import transmuter
from transmuter.errors import TransmuterError

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4, 5)).astype(np.float32)

# String graph inputs run eagerly only (see tests/ops/test_shape.py).
STRINGS = {"compiled": False}


def run_transmuter(op_type, inputs, attrs=None, *, opset=21, outputs=1, constants=()):
    model = make_node_model(
        op_type, inputs, attrs, opset=opset, outputs=outputs, constants=constants
    )
    return transmuter_runs(model, inputs)


# ------------------------------------------------------------------------------------ Gather


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize(
    "indices", [np.array([0, 2]), np.array([[1, -1], [0, -2]]), np.array(1), np.array([-3, 0, -1])]
)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather(axis, indices, index_dtype):
    check_node("Gather", {"X": X, "i": indices.astype(index_dtype)}, {"axis": axis})


@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_, np.uint8])
def test_gather_versions_and_dtypes(opset, dtype):
    check_node("Gather", {"X": X.astype(dtype), "i": np.array([2, 0])}, {"axis": 1}, opset=opset)


def test_gather_special_inputs():
    check_node("Gather", {"X": X, "i": np.zeros((0, 2), np.int64)}, {"axis": 1})
    check_node("Gather", {"X": X, "i": np.array([1, 0])}, symbolic={"X": [0]})
    check_node("Gather", {"X": X, "i": np.array([-1, 0])}, constants=["i"])
    s = np.array(["a", "b", "c"], object)
    check_node("Gather", {"X": s, "i": np.array([[2, -3]])}, **STRINGS)
    check_node("Gather", {"X": s, "i": np.array([[2, -3]])}, constants=["X"])


def test_gather_host_values_out_of_range_raise():
    # Eager, the indices are host values and checked; compiled, they are traced, and only
    # compile(..., checks=True) checks them (tests/runtime/test_index_checks.py).
    inputs = {"X": np.arange(3), "i": np.array([3])}
    model = make_node_model("Gather", inputs, opset=21, constants=["X", "i"])
    with pytest.raises(TransmuterError, match="outside"):
        transmuter_runs(model, inputs, compiled=False)


# ---------------------------------------------------------------------------- GatherElements


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 4, 5), (3, 2, 1), (3, 7, 5)])
def test_gather_elements(axis, shape):
    shape = tuple(shape[a] if a == axis % 3 else min(shape[a], X.shape[a]) for a in range(3))
    size = X.shape[axis]
    indices = rng.integers(-size, size, shape)
    check_node("GatherElements", {"X": X, "i": indices}, {"axis": axis}, opset=13)


@pytest.mark.parametrize("opset", [11, 13])
def test_gather_elements_int32(opset):
    indices = np.array([[0, -1], [1, 0]], np.int32)
    check_node(
        "GatherElements",
        {"X": X[0, :2, :2].astype(np.int32), "i": indices},
        {"axis": 1},
        opset=opset,
    )


# ----------------------------------------------------------------------------------- GatherND

GATHER_ND = [
    ((2, 2), [[0, 0], [1, 1]], 0),
    ((2, 2), [[1], [0]], 0),
    ((2, 2, 2), [[0, 1], [1, 0]], 0),
    ((2, 2, 2), [[[0, 1]], [[1, 0]]], 0),
    ((2, 2, 2), [[1], [0]], 1),
    ((2, 3, 4), [[[1, -1]], [[0, 2]]], 1),
    ((2, 3, 4), [[[1, -1]], [[0, 2]]], 0),
    ((2, 3, 4, 5), [[[1], [2], [0]], [[0], [1], [-1]]], 2),
    ((3, 4), np.zeros((0, 2), np.int64), 0),
    ((2, 3), np.zeros((2, 0), np.int64), 0),
    ((2, 3), np.zeros((2, 2, 0), np.int64), 1),
]


@pytest.mark.parametrize("shape,indices,batch_dims", GATHER_ND)
def test_gather_nd(shape, indices, batch_dims):
    data = rng.standard_normal(shape).astype(np.float32)
    check_node(
        "GatherND",
        {"X": data, "i": np.asarray(indices, np.int64)},
        {"batch_dims": batch_dims},
        opset=13,
    )


def test_gather_nd_v11_and_dtypes():
    data = np.arange(8, dtype=np.int32).reshape(2, 2, 2)
    check_node("GatherND", {"X": data, "i": np.array([[0, 1], [1, -1]])}, opset=11)
    check_node(
        "GatherND",
        {"X": data.astype(np.float16), "i": np.array([[1], [0]])},
        {"batch_dims": 1},
        opset=12,
    )
    s = np.array([["a", "b"], ["c", "d"]], object)
    check_node("GatherND", {"X": s, "i": np.array([[1, 0]])}, opset=13, **STRINGS)


# --------------------------------------------------------------------------- ScatterElements


def _scatter_inputs(axis, shape=(3, 4, 5), dtype=np.float32, unique=True):
    """Indices along `axis` without duplicates (unless asked), so that 'none' is well defined."""
    ishape = list(shape)
    ishape[axis] = 2
    size = shape[axis]
    if unique:
        order = np.argsort(rng.random((*ishape[:axis], size, *ishape[axis + 1 :])), axis=axis)
        indices = np.take(order, range(2), axis=axis)
    else:
        indices = rng.integers(0, size, ishape)
    indices = np.where(rng.random(ishape) < 0.5, indices - size, indices)
    data = rng.standard_normal(shape).astype(dtype)
    updates = rng.standard_normal(ishape).astype(dtype)
    return {"X": data, "i": indices.astype(np.int64), "u": updates}


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize(
    "op_type,opset", [("ScatterElements", 11), ("ScatterElements", 13), ("Scatter", 9)]
)
def test_scatter_elements_none(axis, op_type, opset):
    inputs = _scatter_inputs(axis)
    if opset == 9:  # negative indices arrive in Scatter-11
        inputs["i"] = inputs["i"] % inputs["X"].shape[axis]
    check_node(op_type, inputs, {"axis": axis}, opset=opset)


def test_scatter_v11():
    # Neither ORT nor onnx.reference runs the deprecated Scatter-11: compare with numpy.
    inputs = _scatter_inputs(1)
    want = inputs["X"].copy()
    np.put_along_axis(want, inputs["i"] % 4, inputs["u"], axis=1)
    for mode, (got,) in run_transmuter("Scatter", inputs, {"axis": 1}, opset=11).items():
        assert_close(got, want, rtol=0, atol=0, what=f"Scatter-11 ({mode})")


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("opset", [16, 18])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scatter_elements_reduction(reduction, opset, dtype):
    if opset == 16 and reduction in ("max", "min"):
        with pytest.raises(TransmuterError, match="not supported at this opset"):
            run_transmuter(
                "ScatterElements", _scatter_inputs(1), {"reduction": reduction}, opset=16
            )
        return
    inputs = _scatter_inputs(1, dtype=dtype, unique=reduction == "none")
    if dtype == np.int32:
        inputs["X"] = rng.integers(-5, 5, inputs["X"].shape).astype(dtype)
        inputs["u"] = rng.integers(-5, 5, inputs["u"].shape).astype(dtype)
    check_node("ScatterElements", inputs, {"axis": -2, "reduction": reduction}, opset=opset)


def test_scatter_elements_smaller_indices_and_symbolic():
    data = np.zeros((3, 3), np.float32)
    indices = np.array([[1, 0, 2], [0, 2, 1]])
    updates = np.arange(6, dtype=np.float32).reshape(2, 3)
    check_node("ScatterElements", {"X": data, "i": indices, "u": updates}, opset=13)
    check_node(
        "ScatterElements",
        {"X": data, "i": indices[:, :1], "u": updates[:, :1]},
        {"axis": 1},
        opset=13,
        symbolic={"X": [0]},
    )


# -------------------------------------------------------------------------------- ScatterND

SCATTER_ND = [
    ((8,), [[4], [3], [1], [7]], (4,)),
    ((4, 4, 4), [[0], [2]], (2, 4, 4)),
    ((4, 4, 4), [[0, 1], [-1, 3]], (2, 4)),
    ((4, 4, 4), [[[0, 1, 2]], [[3, 3, 3]]], (2, 1)),
    ((3, 4), np.zeros((0, 2), np.int64), (0,)),
]


@pytest.mark.parametrize("shape,indices,ushape", SCATTER_ND)
@pytest.mark.parametrize("opset", [11, 13, 16, 18])
def test_scatter_nd(shape, indices, ushape, opset):
    data = rng.standard_normal(shape).astype(np.float32)
    updates = rng.standard_normal(ushape).astype(np.float32)
    check_node(
        "ScatterND", {"X": data, "i": np.asarray(indices, np.int64), "u": updates}, opset=opset
    )


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_scatter_nd_reduction(reduction, dtype):
    data = rng.integers(-4, 4, (4, 3)).astype(dtype)
    indices = np.array([[0], [2], [0], [-1]])  # duplicates combine through the reduction
    updates = rng.integers(-4, 4, (4, 3)).astype(dtype)
    opset = 18 if reduction in ("max", "min") else 16
    check_node(
        "ScatterND", {"X": data, "i": indices, "u": updates}, {"reduction": reduction}, opset=opset
    )


def test_scatter_strings():
    # ORT has no string scatter: compare with numpy.
    s = np.array([["a", "b"], ["c", "d"]], object)
    want = np.array([["x", "b"], ["c", "y"]], object)
    ins = {"X": s, "i": np.array([[0, 0], [1, -1]]), "u": np.array(["x", "y"], object)}
    for mode, (got,) in run_transmuter("ScatterND", ins, opset=13, constants=["X", "u"]).items():
        assert_close(got, want, rtol=0, atol=0, what=f"string ScatterND ({mode})")
    ins = {"X": s, "i": np.array([[0], [-1]]), "u": np.array([["x"], ["y"]], object)}
    for mode, (got,) in run_transmuter(
        "ScatterElements", ins, {"axis": 1}, opset=13, constants=["X", "u"]
    ).items():
        assert_close(got, want, rtol=0, atol=0, what=f"string ScatterElements ({mode})")


def test_scatter_nd_bad_updates_raise():
    with pytest.raises(TransmuterError, match="ScatterND"):
        run_transmuter(
            "ScatterND",
            {
                "X": np.zeros((4, 3), np.float32),
                "i": np.array([[0]]),
                "u": np.zeros((2, 3), np.float32),
            },
            opset=13,
        )


# ------------------------------------------------------------------------------------ OneHot


# ORT implements a few (indices, depth, values) type combinations; onnx.reference checks the rest.
ONE_HOT_TYPES = [
    (np.int64, np.int64, np.float32, "ort"),
    (np.int32, np.float32, np.float32, "ort"),
    (np.float32, np.float32, np.float32, "ort"),
    (np.int64, np.int32, np.float32, "ort"),
    (np.uint8, np.int64, np.float16, "onnx"),
    (np.int16, np.uint16, np.int32, "onnx"),
]


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("index_dtype,depth_dtype,value_dtype,reference", ONE_HOT_TYPES)
def test_one_hot(axis, index_dtype, depth_dtype, value_dtype, reference):
    indices = np.array([[0, 3], [9, 2], [1, 5]]).astype(index_dtype)
    inputs = {"i": indices, "d": np.array(5, depth_dtype), "v": np.array([-1, 2], value_dtype)}
    check_node("OneHot", inputs, {"axis": axis}, opset=11, constants=["d"], reference=reference)


def test_one_hot_negative_indices():
    # OneHot-11 counts negative indices back from depth; OneHot-9 leaves them all off (the spec;
    # onnx.reference wraps them there too, and ORT has no OneHot-9).
    indices = np.array([-1, -4, 0, 2, -5])
    inputs = {"i": indices, "d": np.array(4, np.int64), "v": np.array([0, 7], np.int64)}
    check_node("OneHot", inputs, opset=11, constants=["d"])
    inputs["d"] = np.array([4], np.int64)  # depth may also be a one-element vector
    check_node("OneHot", inputs, opset=11, constants=["d"])
    want = np.where(indices[:, None] == np.arange(4), 7, 0)
    for mode, (got,) in run_transmuter("OneHot", inputs, opset=9, constants=["d"]).items():
        assert_close(got, want, rtol=0, atol=0, what=f"OneHot-9 ({mode})")


def test_one_hot_values_dtypes_and_v28():
    inputs = {"i": np.array([1, 0]), "d": np.array(3, np.int64), "v": np.array([False, True])}
    want = np.array([[False, True, False], [True, False, False]])
    for mode, (got,) in run_transmuter("OneHot", inputs, opset=11, constants=["d"]).items():
        assert_close(got, want, rtol=0, atol=0, what=f"bool OneHot ({mode})")
    inputs["v"] = np.array(["off", "on"], object)
    # String values live on the host: device indices are a graph break before OneHot.
    check_node("OneHot", inputs, opset=11, constants=["d", "v"])
    inputs["v"] = np.array([0.5, 1.5], np.float32)
    check_node("OneHot", inputs, {"axis": 0}, opset=28, constants=["d"], reference="onnx")


# ------------------------------------------------------------------- data-dependent: NonZero


@pytest.mark.parametrize(
    "x",
    [
        np.array([[1, 0], [1, 1]], np.int32),
        np.array([0.0, 0.5, 0.0, -1.0], np.float32),
        np.zeros((2, 3), np.bool_),
        np.ones((2, 0), np.float32),
        (rng.standard_normal((2, 3, 4)) > 0).astype(np.int64),
    ],
)
@pytest.mark.parametrize("opset", [9, 13])
def test_non_zero(x, opset):
    check_node("NonZero", {"X": x}, opset=opset)


def test_non_zero_scalar_follows_spec():
    # ORT returns shape [1, N] for a scalar (numpy's answer); the spec and onnx.reference: [0, N].
    check_node("NonZero", {"X": np.array(3.0, np.float32)}, reference="onnx")


def test_non_zero_strings():
    check_node("NonZero", {"X": np.array(["a", "", "b"], object)}, reference="onnx", **STRINGS)


# ------------------------------------------------------------------ data-dependent: Compress


@pytest.mark.parametrize(
    "axis,condition",
    [
        (None, [0, 1, 1]),
        (0, [1, 0, 1]),
        (1, [0, 1]),
        (2, [1, 1, 0, 0, 1]),
        (-1, [0, 0, 0, 0, 0]),
        (1, [1, 1, 0, 1]),
    ],
)
@pytest.mark.parametrize("opset", [9, 11])
def test_compress(axis, condition, opset):
    if axis is not None and axis < 0 and opset < 11:
        return  # negative axes arrive in Compress-11
    attrs = {} if axis is None else {"axis": axis}
    check_node("Compress", {"X": X, "c": np.array(condition, bool)}, attrs, opset=opset)


def test_compress_condition_is_a_constant_and_v28():
    check_node("Compress", {"X": X, "c": np.array([1, 0, 1], bool)}, {"axis": 0}, constants=["c"])
    check_node(
        "Compress", {"X": X, "c": np.array([0, 1], bool)}, {"axis": 1}, opset=28, reference="onnx"
    )


# -------------------------------------------------------------------- data-dependent: Unique

UNIQUE = [
    (np.array([2, 1, 1, 3, 4, 3], np.int64), None),
    (np.array([[1, 3], [2, 3]], np.float32), None),
    (np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.int64), 0),
    (np.array([[[1.0, 1.0], [0.0, 1.0], [2.0, 1.0], [0.0, 1.0]]] * 2, np.float32), 1),
    (np.array([[5, 5], [1, 2]], np.int64), -1),
]


@pytest.mark.parametrize("x,axis", UNIQUE)
@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique(x, axis, sorted_):
    attrs = {"sorted": sorted_, **({} if axis is None else {"axis": axis})}
    check_node("Unique", {"X": x}, attrs, opset=11, outputs=4)


@pytest.mark.parametrize("x,axis", UNIQUE)
def test_unique_v28(x, axis):
    # onnx.reference's Unique fails for sorted=0, so Unique-28 is checked sorted only.
    attrs = {} if axis is None else {"axis": axis}
    check_node("Unique", {"X": x.astype(np.float16)}, attrs, opset=28, outputs=4, reference="onnx")


def test_unique_first_output_only_and_strings():
    check_node("Unique", {"X": np.array([3, 1, 3], np.int64)}, {"sorted": 0}, opset=11)
    s = np.array(["b", "a", "b"], object)
    check_node("Unique", {"X": s}, opset=11, outputs=4, **STRINGS)


def test_data_dependent_ops_run_compiled_with_breaks():
    # NonZero feeding Transpose: the compiled runtime breaks at NonZero and runs the rest after it.
    nodes = [
        helper.make_node("Relu", ["X"], ["r"]),
        helper.make_node("NonZero", ["r"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.INT64, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    loaded = transmuter.load(model)
    compiled = transmuter.compile(loaded, {"X": X[0, :, :3]})
    for n in (2, 4):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        want = np.transpose(np.array(np.nonzero(np.maximum(x, 0)), np.int64))
        assert_close(compiled({"X": x})["Y"], want, rtol=0, atol=0, what=f"n={n}")


# --------------------------------------------------------------------------- ReverseSequence


@pytest.mark.parametrize("opset", [10, 28])
@pytest.mark.parametrize(
    "batch_axis, time_axis, lens", [(1, 0, [3, 0, 5, 1]), (0, 1, [4, 4, 1, 0, 2])]
)
def test_reverse_sequence(opset, batch_axis, time_axis, lens):
    x = rng.standard_normal((5, 4, 2, 3) if batch_axis == 1 else (5, 4, 3)).astype(np.float32)
    inputs = {"input": x, "sequence_lens": np.array(lens, np.int64)}
    attrs = {"batch_axis": batch_axis, "time_axis": time_axis}
    check_node("ReverseSequence", inputs, attrs, opset=opset)
    check_node("ReverseSequence", inputs, attrs, opset=opset, constants=["sequence_lens"])


@pytest.mark.parametrize(
    "dtype",
    [np.float16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64, np.bool_],
)
def test_reverse_sequence_dtypes(dtype):
    x = (rng.standard_normal((3, 2, 2)) * 5).astype(dtype)
    check_node("ReverseSequence", {"input": x, "sequence_lens": np.array([3, 1])}, opset=10)


def test_reverse_sequence_types_ort_lacks():
    import ml_dtypes

    lens = np.array([2, 3])
    x = rng.standard_normal((3, 2)).astype(ml_dtypes.bfloat16)  # added in ReverseSequence-28
    check_node("ReverseSequence", {"input": x, "sequence_lens": lens}, opset=28, reference="onnx")
    z = (rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2))).astype(np.complex64)
    check_node("ReverseSequence", {"input": z, "sequence_lens": lens}, opset=10, reference="onnx")


def test_reverse_sequence_special_inputs():
    lens = np.array([2, 0, 3, 1])
    check_node("ReverseSequence", {"input": X, "sequence_lens": lens}, symbolic={"input": [2]})
    empty = np.zeros((3, 4, 0), np.float32)
    check_node("ReverseSequence", {"input": empty, "sequence_lens": lens})
    no_batch = np.zeros((3, 0), np.float32)
    check_node("ReverseSequence", {"input": no_batch, "sequence_lens": np.zeros(0, np.int64)})
    s = np.array([["a", "b"], ["c", "d"], ["e", "f"]], object)
    check_node("ReverseSequence", {"input": s, "sequence_lens": np.array([3, 2])}, **STRINGS)
    check_node(
        "ReverseSequence",
        {"input": s, "sequence_lens": np.array([1, 2])},
        {"batch_axis": 1, "time_axis": 0},
        constants=["sequence_lens"],
    )


@pytest.mark.parametrize(
    "lens, attrs, match",
    [
        ([5, 1, 1, 1], {}, r"holds 5, outside \[0, 3\]"),
        ([-1, 1, 1, 1], {}, r"holds -1, outside \[0, 3\]"),
        ([1, 1, 1], {}, r"must have shape \[4\]"),
        ([1, 1, 1, 1], {"batch_axis": 0}, "must be 0 and 1"),
        ([1, 1, 1, 1], {"batch_axis": 2, "time_axis": 1}, "must be 0 and 1"),
    ],
)
def test_reverse_sequence_rejects_bad_inputs(lens, attrs, match):
    inputs = {"input": np.zeros((3, 4), np.float32), "sequence_lens": np.array(lens, np.int64)}
    model = make_node_model("ReverseSequence", inputs, attrs, opset=10, constants=["sequence_lens"])
    with pytest.raises(TransmuterError, match=match):
        transmuter_runs(model, inputs, compiled=False)
