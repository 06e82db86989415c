"""Shape and data-movement operators against ONNX Runtime (or onnx.reference where ORT lacks them)."""

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs

import transmuter
from transmuter.errors import TransmuterError
from transmuter.lowering import lookup

# String graph inputs run eagerly only: the compiled fast path passes them to the program, whose
# arguments leave host values out (a runtime issue, reported), so those checks use STRINGS.
STRINGS = {"compiled": False}

rng = np.random.default_rng(0)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
I64 = np.int64


def arr(*values, dtype=np.int64):
    return np.array(values, dtype=dtype)


def run_transmuter(op_type, inputs, attrs=None, *, opset=21, outputs=1, constants=()):
    """Transmuter's outputs only (eager, then compiled), for cases every reference rejects."""
    model = make_node_model(
        op_type, inputs, attrs, opset=opset, outputs=outputs, constants=constants
    )
    return transmuter_runs(model, inputs)


def check_expected(
    op_type, inputs, attrs, expected, *, opset, outputs=1, constants=(), compiled=True
):
    """For versions no reference implements: compare Transmuter with hand-computed outputs."""
    model = make_node_model(
        op_type, inputs, attrs, opset=opset, outputs=outputs, constants=constants
    )
    for mode, got in transmuter_runs(model, inputs, compiled=compiled).items():
        assert len(got) == len(expected), mode
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert_close(g, e, rtol=0, atol=0, what=f"{op_type} output {i} ({mode})")


# ---------------------------------------------------------------------------- Shape and Size


@pytest.mark.parametrize("opset", [1, 13])
def test_shape_v1(opset):
    check_node("Shape", {"X": X}, opset=opset)


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"start": 1},
        {"start": -1},
        {"end": -1},
        {"start": 1, "end": 2},
        {"start": -10, "end": 10},
        {"start": 2, "end": 1},
    ],
)
def test_shape_v15_start_end(attrs):
    check_node("Shape", {"X": X}, attrs, opset=21)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.bool_, object])
def test_shape_and_size_dtypes(dtype):
    x = np.zeros((3, 0, 2), dtype) if dtype is not object else np.array([["a", "b"]], dtype=object)
    kw = STRINGS if dtype is object else {}
    check_node("Shape", {"X": x}, opset=15, **kw)
    check_node("Size", {"X": x}, opset=13, **kw)


@pytest.mark.parametrize("opset", [1, 13, 21])
def test_size(opset):
    check_node("Size", {"X": X}, opset=opset, symbolic={"X": [0]})


def test_shape_is_host_known_for_device_inputs():
    assert isinstance(lookup("", "Shape", 21).fn(jnp.zeros((2, 5))), np.ndarray)
    assert isinstance(lookup("", "Size", 21).fn(jnp.zeros((2, 5))), np.ndarray)


# ---------------------------------------------------------------------------------- Reshape


@pytest.mark.parametrize("shape", [(0, -1), (4, 0, 2, -1), (-1,), (24,), (2, 12), (1, 2, 1, 3, 4)])
@pytest.mark.parametrize("opset", [5, 13, 21])
def test_reshape(shape, opset):
    check_node("Reshape", {"X": X, "s": arr(*shape)}, opset=opset, constants=["s"])


def test_reshape_v1_attribute():
    check_node("Reshape", {"X": X}, {"shape": [0, -1]}, opset=1)


def test_reshape_to_scalar_and_allowzero():
    check_node("Reshape", {"X": np.float32([7.0]), "s": np.zeros(0, I64)}, constants=["s"])
    z = np.zeros((0, 3), np.float32)
    check_node("Reshape", {"X": z, "s": arr(3, 0)}, {"allowzero": 1}, opset=14, constants=["s"])
    check_node("Reshape", {"X": z, "s": arr(0, 3)}, {"allowzero": 0}, opset=14, constants=["s"])


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_, object])
def test_reshape_dtypes(dtype):
    x = np.arange(6).astype(dtype) if dtype is not object else np.array(list("abcdef"), object)
    kw = STRINGS if dtype is object else {}
    check_node("Reshape", {"X": x, "s": arr(3, -1)}, constants=["s"], **kw)


def test_reshape_symbolic_batch():
    check_node("Reshape", {"X": X, "s": arr(0, 12)}, constants=["s"], symbolic={"X": [0]})


def test_reshape_bad_shape_raises():
    with pytest.raises(TransmuterError, match="Reshape"):
        run_transmuter("Reshape", {"X": X, "s": arr(5, -1)}, constants=["s"])


# ----------------------------------------------------------------- Flatten, Squeeze, Unsqueeze


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
@pytest.mark.parametrize("opset", [11, 13, 21])
def test_flatten(axis, opset):
    check_node("Flatten", {"X": X}, {"axis": axis}, opset=opset)


@pytest.mark.parametrize("opset", [1, 9])
def test_flatten_old(opset):
    check_node("Flatten", {"X": X}, {"axis": 2}, opset=opset)


X1 = rng.standard_normal((1, 3, 1, 2)).astype(np.float32)


@pytest.mark.parametrize("axes", [None, [0], [-2, 0]])
def test_squeeze(axes):
    check_node("Squeeze", {"X": X1}, {} if axes is None else {"axes": axes}, opset=11)
    # ORT rejects an empty-named axes input, so an absent one is left off the node.
    names = ["X"] if axes is None else ["X", "a"]
    check_node(
        "Squeeze",
        {"X": X1, "a": None if axes is None else arr(*axes)},
        opset=13,
        constants=["a"],
        input_names=names,
    )


def test_squeeze_non_unit_axis_raises():
    with pytest.raises(TransmuterError, match="not of size 1"):
        run_transmuter("Squeeze", {"X": X1, "a": arr(1)}, opset=13, constants=["a"])


@pytest.mark.parametrize("axes", [[0], [0, 4], [-1], [1, -1], [3, 1]])
def test_unsqueeze(axes):
    check_node("Unsqueeze", {"X": X}, {"axes": axes}, opset=11)
    check_node("Unsqueeze", {"X": X, "a": arr(*axes)}, opset=13, constants=["a"])


def test_unsqueeze_v1_and_scalar():
    check_node("Unsqueeze", {"X": X}, {"axes": [0, 4]}, opset=1)
    check_node("Unsqueeze", {"X": np.float32(3.0), "a": arr(0, 1)}, constants=["a"])


# ------------------------------------------------------------------------------- Transpose


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, object])
def test_transpose(perm, dtype):
    x = X.astype(dtype) if dtype is not object else X.astype(str).astype(object)
    kw = STRINGS if dtype is object else {"symbolic": {"X": [0]}}
    check_node("Transpose", {"X": x}, {} if perm is None else {"perm": perm}, **kw)


def test_transpose_old_opset():
    check_node("Transpose", {"X": X}, {"perm": [1, 0, 2]}, opset=1)


# ------------------------------------------------------------------------------------ Concat


@pytest.mark.parametrize(
    "axis,opset", [(0, 4), (2, 4), (1, 11), (-1, 11), (0, 13), (1, 13), (2, 13), (-3, 13)]
)
def test_concat(axis, opset):
    b = rng.standard_normal(X.shape).astype(np.float32)
    check_node("Concat", {"A": X, "B": b, "C": X}, {"axis": axis}, opset=opset)


def test_concat_zero_size_and_strings():
    check_node("Concat", {"A": X, "B": np.zeros((2, 0, 4), np.float32)}, {"axis": 1})
    s = np.array([["a", "b"]], object)
    check_node("Concat", {"A": s, "B": s}, {"axis": 0}, **STRINGS)
    check_node("Concat", {"A": arr(1, 2), "B": arr(3)}, {"axis": 0})


def test_concat_v1_default_axis():
    check_expected("Concat", {"A": X, "B": X}, {}, [np.concatenate([X, X], 1)], opset=1)


def test_concat_mismatched_shapes_raise():
    with pytest.raises(TransmuterError, match="Concat input 1"):
        run_transmuter("Concat", {"A": X, "B": X[:, :2, :2]}, {"axis": 1})


# ------------------------------------------------------------------------------------- Split


@pytest.mark.parametrize("axis,split", [(0, None), (1, [1, 2]), (-1, [1, 0, 3]), (2, None)])
def test_split(axis, split):
    n = 2 if (split is None and axis in (0, 2)) else len(split)
    check_node(
        "Split",
        {"X": X},
        {"axis": axis, **({} if split is None else {"split": split})},
        opset=11,
        outputs=n,
    )
    check_node(
        "Split",
        {"X": X, "s": None if split is None else arr(*split)},
        {"axis": axis},
        opset=13,
        outputs=n,
        constants=["s"],
    )


@pytest.mark.parametrize("size,parts", [(7, 3), (8, 3), (6, 3), (9, 4), (1, 1)])
def test_split_v18_num_outputs(size, parts):
    x = np.arange(size * 2, dtype=np.float32).reshape(2, size)
    check_node("Split", {"X": x}, {"axis": 1, "num_outputs": parts}, opset=18, outputs=parts)


def test_split_v18_split_input():
    check_node(
        "Split", {"X": X, "s": arr(3, 1)}, {"axis": -1}, opset=18, outputs=2, constants=["s"]
    )


def test_split_v1_and_v2():
    check_expected(
        "Split",
        {"X": X},
        {"axis": 2, "split": [1, 3]},
        [X[..., :1], X[..., 1:]],
        opset=1,
        outputs=2,
    )
    check_expected(
        "Split",
        {"X": X, "s": arr(3, 1)},
        {"axis": 2},
        [X[..., :3], X[..., 3:]],
        opset=1,
        outputs=2,
        constants=["s"],
    )
    check_node("Split", {"X": X}, {"axis": 2}, opset=2, outputs=4)


def test_split_uneven_raises():
    with pytest.raises(TransmuterError, match="equal outputs"):
        run_transmuter("Split", {"X": X}, {"axis": 1}, opset=13, outputs=2)


# ------------------------------------------------------------------------------------- Slice

INT_MAX = np.iinfo(np.int64).max
INT_MIN = np.iinfo(np.int64).min
SLICES = [
    ((0,), (1,), None, None),
    ((1, 0), (2, 3), (0, 1), None),
    ((0, 1), (-1, 1000), None, None),
    ((-1,), (INT_MIN,), (2,), (-1,)),
    ((INT_MAX,), (-INT_MAX,), (1,), (-2,)),
    ((1,), (INT_MAX,), (-1,), (2,)),
    ((0, 3), (10, -10), (0, 2), (1, -1)),
    ((5,), (10,), (2,), (1,)),
    ((-100,), (100,), (1,), (3,)),
    ((2,), (0,), (2,), (-1,)),
    ((0,), (0,), (1,), (1,)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_slice(starts, ends, axes, steps, index_dtype):
    def ix(values):
        return (
            None if values is None else np.clip(values, *_limits(index_dtype)).astype(index_dtype)
        )

    inputs = {"X": X, "s": ix(starts), "e": ix(ends), "a": ix(axes), "st": ix(steps)}
    if steps is not None and axes is None:
        inputs["a"] = np.arange(len(starts), dtype=index_dtype)
    check_node("Slice", inputs, opset=13, constants=["s", "e", "a", "st"])


def _limits(dtype):
    info = np.iinfo(dtype)
    return info.min, info.max


@pytest.mark.parametrize("opset", [10, 11])
def test_slice_old_input_versions(opset):
    check_node(
        "Slice",
        {"X": X, "s": arr(1, -1), "e": arr(3, -4), "a": arr(1, 2), "st": arr(1, -1)},
        opset=opset,
        constants=["s", "e", "a", "st"],
    )


def test_slice_v1_attributes():
    check_node("Slice", {"X": X}, {"starts": [1, 0], "ends": [1000, -1], "axes": [1, 2]}, opset=1)
    check_node("Slice", {"X": X}, {"starts": [0, 1], "ends": [1, 3]}, opset=9)


def test_slice_strings_and_symbolic():
    s = np.array(list("abcdef"), object)
    check_node(
        "Slice",
        {"X": s, "s": arr(-1), "e": arr(INT_MIN), "a": arr(0), "st": arr(-2)},
        constants=["s", "e", "a", "st"],
        **STRINGS,
    )
    check_node(
        "Slice",
        {"X": X, "s": arr(1), "e": arr(3), "a": arr(2)},
        constants=["s", "e", "a"],
        symbolic={"X": [0]},
    )


# ----------------------------------------------------------------------------- Expand, Tile


@pytest.mark.parametrize(
    "shape,target",
    [
        ((3, 1), (2, 1, 6)),
        ((3, 1), (3, 4)),
        ((2, 3, 4), (1, 1)),
        ((1,), (0, 2)),
        ((2, 1, 4), (1, 3, 1)),
        ((), (2, 2)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_expand(shape, target, dtype):
    x = (
        (rng.standard_normal(shape) > 0).astype(dtype)
        if dtype is np.bool_
        else rng.standard_normal(shape).astype(dtype)
    )
    check_node("Expand", {"X": x, "s": arr(*target)}, opset=13, constants=["s"])


def test_expand_v8_and_strings():
    check_node("Expand", {"X": X[:, :1], "s": arr(3, 1)}, opset=8, constants=["s"])
    check_node(
        "Expand",
        {"X": np.array([["a"], ["b"]], object), "s": arr(2, 3)},
        constants=["s"],
        **STRINGS,
    )


def test_expand_incompatible_raises():
    with pytest.raises(TransmuterError, match="broadcast"):
        run_transmuter("Expand", {"X": X, "s": arr(5, 4)}, constants=["s"])


@pytest.mark.parametrize("repeats", [(1, 1, 1), (2, 1, 3), (1, 0, 2)])
@pytest.mark.parametrize("opset", [6, 13])
def test_tile(repeats, opset):
    check_node("Tile", {"X": X, "r": arr(*repeats)}, opset=opset, constants=["r"])


def test_tile_v1_axis():
    check_expected(
        "Tile",
        {"X": X, "t": arr(3), "a": arr(1)},
        {},
        [np.tile(X, (1, 3, 1))],
        opset=1,
        constants=["t", "a"],
    )


def test_tile_dtypes():
    check_node("Tile", {"X": np.array(["x", "y"], object), "r": arr(2)}, constants=["r"], **STRINGS)
    check_node(
        "Tile", {"X": X.astype(np.float16), "r": arr(1, 2, 1)}, constants=["r"], symbolic={"X": [0]}
    )


# --------------------------------------------------------------------------------------- Pad

PADS = [(0, 1, 2, 0, 0, 1), (1, 0, 0, 1, 0, 0), (0, -1, 1, 0, 1, -1), (1, 1, 1, 1, 1, 1)]


@pytest.mark.parametrize("pads", PADS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("opset", [11, 13, 18, 21])
def test_pad(pads, mode, opset):
    inputs = {"X": X, "p": arr(*pads), "c": np.float32(1.5) if mode == "constant" else None}
    check_node("Pad", inputs, {"mode": mode}, opset=opset, constants=["p"])


@pytest.mark.parametrize("pads", [(2, 1, 1, 1, 0, 2), (0, -1, 3, 0, 0, -2)])
def test_pad_wrap(pads):
    check_node("Pad", {"X": X, "p": arr(*pads)}, {"mode": "wrap"}, opset=19, constants=["p"])


@pytest.mark.parametrize("axes", [(1,), (-1, 0), (2, 1)])
@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_axes(axes, mode):
    pads = arr(*([1] * len(axes) + [0] * len(axes)))
    inputs = {"X": X, "p": pads, "c": None, "a": arr(*axes)}
    check_node("Pad", inputs, {"mode": mode}, opset=18, constants=["p", "a"])


def test_pad_constant_value_is_a_graph_input():
    check_node(
        "Pad",
        {"X": X, "p": arr(1, 0, 0, 0, 1, 1), "c": np.float32(-2.0)},
        opset=13,
        constants=["p"],
    )


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.bool_])
def test_pad_dtypes(dtype):
    check_node("Pad", {"X": X.astype(dtype), "p": arr(1, 0, 0, 0, 1, 2)}, opset=13, constants=["p"])


def test_pad_strings_default_to_empty():
    # ORT has no string Pad, and onnx.reference pads strings with 0 instead of "" as the spec says.
    s = np.array([["a", "b"]], object)
    want = np.array([["", "a", "b", ""], ["", "", "", ""]], object)
    check_expected(
        "Pad", {"X": s, "p": arr(0, 1, 1, 1)}, {}, [want], opset=13, constants=["p"], **STRINGS
    )


def test_pad_v2_attribute():
    check_node("Pad", {"X": X}, {"pads": [0, 1, -1, 1, 0, 2], "value": 3.0}, opset=2)
    check_node("Pad", {"X": X}, {"pads": [0, 1, 0, 1, 0, 1], "mode": "reflect"}, opset=2)
    check_node(
        "Pad", {"X": X}, {"paddings": [0, 1, 0, 0, 0, 2], "value": 1.0}, opset=1, reference="onnx"
    )


def test_pad_cropping_past_the_axis_raises():
    with pytest.raises(TransmuterError, match="remove more than"):
        run_transmuter("Pad", {"X": X, "p": arr(0, -2, 0, 0, -2, 0)}, opset=13, constants=["p"])


def test_pad_wrap_before_19_raises():
    with pytest.raises(TransmuterError, match="wrap"):
        run_transmuter(
            "Pad", {"X": X, "p": arr(0, 0, 1, 0, 0, 1)}, {"mode": "wrap"}, opset=18, constants=["p"]
        )


# ------------------------------------------------------------------ ConstantOfShape, Constant


@pytest.mark.parametrize("shape", [(2, 3), (), (0, 4)])
@pytest.mark.parametrize(
    "value", [None, np.array([5], np.int64), np.array([1.5], np.float16), np.array([True])]
)
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    check_node(
        "ConstantOfShape", {"s": np.array(shape, np.int64)}, attrs, opset=20, constants=["s"]
    )


def test_constant_of_shape_graph_input_and_opset9():
    check_node("ConstantOfShape", {"s": arr(2, 2)}, opset=9)


CONSTANTS = [
    {"value": onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))},
    {"value_float": 2.5},
    {"value_floats": [1.0, 2.0]},
    {"value_int": 7},
    {"value_ints": [1, -2, 3]},
    {"value_string": "hello"},
    {"value_strings": ["a", "bc"]},
]


@pytest.mark.parametrize("attrs", CONSTANTS, ids=lambda a: next(iter(a)))
def test_constant(attrs):
    check_node("Constant", {}, attrs, opset=13)


def test_constant_sparse_value():
    # ORT hands a sparse Constant back as a sparse tensor; the spec's value is the dense one.
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0]),
        helper.make_tensor("i", TensorProto.INT64, [2], [1, 4]),
        [2, 3],
    )
    want = np.array([[0, 1, 0], [0, 2, 0]], np.float32)
    for opset in (11, 13):
        check_expected("Constant", {}, {"sparse_value": sparse}, [want], opset=opset)


@pytest.mark.parametrize("opset", [1, 9, 11])
def test_constant_old(opset):
    check_node("Constant", {}, CONSTANTS[0], opset=opset)


def test_constant_is_host_value():
    assert isinstance(lookup("", "Constant", 21).fn(value_ints=(1, 2)), np.ndarray)


def test_identity():
    check_node("Identity", {"X": X}, symbolic={"X": [0]})
    check_node("Identity", {"X": np.array(["a"], object)}, opset=13, **STRINGS)
    check_node("Identity", {"X": X}, opset=1)


# ------------------------------------------------------------------------------------- Range


RANGES = [(3, 9, 3), (10, 4, -2), (0, 5, 1), (5, 0, 1), (-3, 4, 2)]
FLOAT_RANGES = [(1.5, 4.0, 0.5), (2.0, -1.0, -0.3), (0.0, 1.0, 0.1)]


@pytest.mark.parametrize(
    "start,limit,delta,dtype",
    [(*r, t) for r in RANGES for t in (np.int16, np.int32, np.int64, np.float32)]
    + [(*r, t) for r in FLOAT_RANGES for t in (np.float32, np.float64)],
)
def test_range(start, limit, delta, dtype):
    inputs = {"a": np.array(start, dtype), "b": np.array(limit, dtype), "c": np.array(delta, dtype)}
    check_node("Range", inputs, opset=11, constants=["a", "b", "c"])


def test_range_graph_inputs_run_eagerly():
    inputs = {"a": np.int64(2), "b": np.int64(11), "c": np.int64(3)}
    check_node("Range", inputs, opset=11, compiled=False)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_range_v27_stash_type(dtype):
    inputs = {"a": np.array(0, dtype), "b": np.array(3, dtype), "c": np.array(0.25, dtype)}
    check_node("Range", inputs, opset=27, constants=["a", "b", "c"], reference="onnx")
    check_node(
        "Range", inputs, {"stash_type": 11}, opset=27, constants=["a", "b", "c"], reference="onnx"
    )


# ----------------------------------------------------------------------------- EyeLike, Trilu


@pytest.mark.parametrize("shape", [(3, 3), (2, 5), (4, 2), (0, 3)])
@pytest.mark.parametrize("k", [0, 1, -1, 7])
def test_eye_like(shape, k):
    check_node("EyeLike", {"X": np.zeros(shape, np.float32)}, {"k": k}, opset=9)


@pytest.mark.parametrize(
    "dtype", [TensorProto.INT32, TensorProto.DOUBLE, TensorProto.BOOL, TensorProto.BFLOAT16]
)
def test_eye_like_dtype(dtype):
    # ORT implements EyeLike-9 for a few numeric types only.
    ort = dtype in (TensorProto.INT32, TensorProto.DOUBLE)
    opset, reference = (9, "ort") if ort else (22, "onnx")
    check_node(
        "EyeLike",
        {"X": np.zeros((3, 4), np.int64)},
        {"dtype": dtype, "k": 1},
        opset=opset,
        reference=reference,
    )


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 5, -5])
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 3), (3, 0)])
def test_trilu(upper, k, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    check_node(
        "Trilu",
        {"X": x, "k": None if k is None else np.array(k, np.int64)},
        {"upper": upper},
        opset=14,
        constants=["k"],
    )


def test_trilu_int_and_bool():
    check_node("Trilu", {"X": np.arange(12, dtype=np.int64).reshape(3, 4)}, {"upper": 0}, opset=14)
    check_node("Trilu", {"X": np.ones((3, 3), bool)}, opset=14)


# ------------------------------------------------------------------- DepthToSpace, SpaceToDepth

D = rng.standard_normal((2, 8, 2, 3)).astype(np.float32)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("opset", [11, 13])
def test_depth_to_space(mode, opset):
    check_node("DepthToSpace", {"X": D}, {"blocksize": 2, "mode": mode}, opset=opset)


def test_depth_to_space_old_and_new():
    check_node("DepthToSpace", {"X": D}, {"blocksize": 2}, opset=1)
    check_node(
        "DepthToSpace", {"X": D}, {"blocksize": 2, "mode": "CRD"}, opset=28, reference="onnx"
    )


@pytest.mark.parametrize("opset", [1, 13])
def test_space_to_depth(opset):
    x = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    check_node("SpaceToDepth", {"X": x}, {"blocksize": 2}, opset=opset)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_v28(mode):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    check_node("SpaceToDepth", {"X": x}, {"blocksize": 2, "mode": mode}, opset=28, reference="onnx")


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space_round_trip(mode):
    x = rng.standard_normal((1, 3, 4, 6)).astype(np.float32)
    s2d = np.asarray(
        run_transmuter("SpaceToDepth", {"X": x}, {"blocksize": 2, "mode": mode}, opset=28)[
            "compiled"
        ][0]
    )
    back = run_transmuter("DepthToSpace", {"X": s2d}, {"blocksize": 2, "mode": mode}, opset=28)[
        "compiled"
    ][0]
    assert_close(back, x, rtol=0, atol=0, what=f"{mode} round trip")


# ----------------------------------------------------------------------------------- Dropout


@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
@pytest.mark.parametrize("outputs", [1, 2])
def test_dropout_inference(opset, outputs):
    if opset == 7 and outputs == 2:
        # Dropout-7's mask has the data type; onnx.reference gives bool and ORT zeros.
        check_expected("Dropout", {"X": X}, {}, [X, np.ones_like(X)], opset=7, outputs=2)
        return
    # ORT fills Dropout-10's inference mask with false; the spec (and onnx.reference) say true.
    ort = opset in (12, 13) or outputs == 1 and opset != 22
    check_node(
        "Dropout", {"X": X}, opset=opset, outputs=outputs, reference="ort" if ort else "onnx"
    )


def test_dropout_training_mode():
    inputs = {"X": X, "r": np.float32(0.0), "t": np.array(False)}
    check_node("Dropout", inputs, opset=13, outputs=2, constants=["r", "t"])
    inputs["t"] = np.array(True)
    check_node("Dropout", inputs, opset=13, outputs=2, constants=["r", "t"])
    # Ratio 0.5 draws a mask from the run's key (ORT and onnx.reference draw their own).
    inputs["r"] = np.float32(0.5)
    model = transmuter.load(
        make_node_model("Dropout", inputs, opset=13, outputs=2, constants=["r", "t"])
    )
    out, mask = transmuter.run(model, {"X": X}, key=jax.random.key(0)).values()
    assert mask.dtype == np.bool_ and 0 < mask.mean() < 1
    assert_close(out, np.where(mask, X * 2, 0), rtol=0, atol=0, what="kept elements doubled")
    with pytest.raises(TransmuterError, match="pass one"):
        transmuter.run(model, {"X": X})


def test_dropout_old_test_mode():
    for opset in (1, 6):
        check_expected(
            "Dropout", {"X": X}, {"is_test": 1}, [X, np.ones_like(X)], opset=opset, outputs=2
        )
    with pytest.raises(TransmuterError, match="training-mode dropout"):
        check_expected("Dropout", {"X": X}, {}, [X], opset=6)


# ---------------------------------------------------------------- host-known shape arithmetic


def _shape_chain_model():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: flatten all but the batch dim."""
    nodes = [
        helper.make_node("Shape", ["X"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["X", "target"], ["flat"]),
        helper.make_node("Size", ["X"], ["size"]),
        helper.make_node("Range", ["zero", "size", "step"], ["positions"]),
        helper.make_node(
            "ConstantOfShape",
            ["batch1"],
            ["ones"],
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
        ),
        helper.make_node("Slice", ["shape", "one1", "big1"], ["tail"]),
        helper.make_node("Expand", ["ones", "target1"], ["wide"]),
        helper.make_node("Concat", ["shape", "tail"], ["joined"], axis=0),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
        onnx.numpy_helper.from_array(np.array(1, np.int64), "step"),
        onnx.numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "one1"),
        onnx.numpy_helper.from_array(np.array([INT_MAX], np.int64), "big1"),
        onnx.numpy_helper.from_array(np.array([3, 1], np.int64), "target1"),
    ]
    graph = helper.make_graph(
        nodes,
        "shape_chain",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3, 4])],
        [
            helper.make_value_info(n, onnx.TypeProto())
            for n in ("flat", "positions", "wide", "joined")
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_shape_chain_stays_host_known_under_compile():
    model = _shape_chain_model()
    loaded = transmuter.load(model)
    first = {"X": rng.standard_normal((2, 3, 4)).astype(np.float32)}
    compiled = transmuter.compile(loaded, first)  # raises if any shape value were traced
    for batch in (2, 5):
        feed = {"X": rng.standard_normal((batch, 3, 4)).astype(np.float32)}
        got = compiled(feed)
        for name, want in zip(loaded.outputs, ort_run(model, feed), strict=True):
            assert_close(got[name], want, rtol=0, atol=0, what=f"{name} (batch {batch})")
    assert all(stop == "end" for _, stop, _ in compiled.segments), compiled.segments
