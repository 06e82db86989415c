"""Pooling operators against ONNX Runtime (onnx.reference where ONNX Runtime lacks a case)."""

import numpy as np
import pytest
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs

from transmuter.errors import TransmuterError

GEOMETRIES = [
    ((2, 3, 9), {"kernel_shape": [3]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 3]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "pads": [0, 2, 1, 0], "strides": [2, 2]}),
    ((1, 2, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    (
        (1, 2, 8, 7),
        {"kernel_shape": [2, 3], "strides": [3, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    ((1, 2, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 8, 7), {"kernel_shape": [2, 4], "strides": [3, 1], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    (
        (1, 1, 4, 5, 6),
        {"kernel_shape": [2, 2, 3], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]},
    ),
]
DILATED = [
    ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    (
        (1, 2, 9, 8),
        {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 2, 0]},
    ),
    (
        (1, 2, 10, 9),
        {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    ),
]


def _data(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _check_as(op_type, inputs, attrs, opset, ort_attrs, ort_opset, tol=1e-5):
    """Transmuter on one node against ONNX Runtime on an equivalent node it supports."""
    expected = ort_run(make_node_model(op_type, inputs, ort_attrs, opset=ort_opset), inputs)
    model = make_node_model(op_type, inputs, attrs, opset=opset)
    for mode, outputs in transmuter_runs(model, inputs).items():
        assert_close(outputs[0], expected[0], rtol=tol, atol=tol, what=f"{op_type} ({mode})")


@pytest.mark.parametrize("shape, attrs", GEOMETRIES + DILATED)
def test_max_pool(rng, shape, attrs):
    check_node("MaxPool", {"X": _data(rng, shape)}, attrs, opset=12, outputs=["Y", "Indices"])


@pytest.mark.parametrize("shape, attrs", GEOMETRIES[:6])
def test_max_pool_column_major_indices(rng, shape, attrs):
    attrs = dict(attrs, storage_order=1)
    check_node(
        "MaxPool", {"X": _data(rng, (2,) + shape[1:])}, attrs, opset=12, outputs=["Y", "Indices"]
    )


def test_max_pool_ties_pick_the_first(rng):
    x = np.round(rng.standard_normal((1, 2, 6, 6))).astype(np.float32)
    check_node(
        "MaxPool",
        {"X": x},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
        outputs=["Y", "Indices"],
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int8, np.uint8])
def test_max_pool_dtypes(rng, dtype):
    x = (rng.standard_normal((1, 2, 6, 7)) * 50).astype(dtype)
    attrs = {"kernel_shape": [3, 2], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    check_node("MaxPool", {"X": x}, attrs, opset=22 if dtype != np.float16 else 12)


@pytest.mark.parametrize("opset", [1, 8, 10, 11])
def test_max_pool_versions(rng, opset):
    outputs = ["Y", "Indices"] if opset >= 8 else ["Y"]
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0]}
    check_node("MaxPool", {"X": _data(rng, (1, 2, 7, 7))}, attrs, opset=opset, outputs=outputs)


def test_max_pool_symbolic_and_zero_batch(rng):
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    check_node(
        "MaxPool",
        {"X": _data(rng, (3, 2, 6, 6))},
        attrs,
        symbolic={"X": [0]},
        outputs=["Y", "Indices"],
    )
    check_node("MaxPool", {"X": _data(rng, (0, 2, 6, 6))}, attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8, np.uint8])
def test_max_pool_dilated_dtypes_without_indices(rng, dtype):
    # Dilated windows take the max over kernel taps instead of a reduce_window (for gradients).
    x = (rng.standard_normal((1, 2, 9, 8)) * 50).astype(dtype)
    attrs = {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 2, 0]}
    check_node("MaxPool", {"X": x}, attrs, opset=22 if dtype != np.float16 else 12)


def test_max_pool_dilated_symbolic_and_zero_batch(rng):
    attrs = {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1}
    check_node(
        "MaxPool",
        {"X": _data(rng, (3, 2, 7, 7))},
        attrs,
        symbolic={"X": [0]},
        outputs=["Y", "Indices"],
    )
    check_node("MaxPool", {"X": _data(rng, (0, 2, 7, 7))}, attrs)


@pytest.mark.parametrize("shape, attrs", GEOMETRIES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(rng, shape, attrs, count_include_pad):
    attrs = dict(attrs, count_include_pad=count_include_pad)
    check_node("AveragePool", {"X": _data(rng, shape)}, attrs, opset=11, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, attrs", DILATED)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_dilated(rng, shape, attrs, count_include_pad):
    attrs = dict(attrs, count_include_pad=count_include_pad)
    check_node("AveragePool", {"X": _data(rng, shape)}, attrs, opset=19, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [7, 10, 11, 19, 22])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_average_pool_versions_and_dtypes(rng, opset, dtype):
    attrs = {
        "kernel_shape": [3, 3],
        "strides": [2, 2],
        "pads": [1, 0, 1, 0],
        "count_include_pad": 1,
    }
    tol = 1e-2 if dtype == np.float16 else 1e-6
    reference = "onnx" if dtype == np.float64 else "ort"  # ONNX Runtime has no float64 kernel
    x = _data(rng, (1, 2, 7, 7), dtype)
    check_node("AveragePool", {"X": x}, attrs, opset=opset, reference=reference, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_average_pool_v1_excludes_pads(rng, dtype):
    # ONNX Runtime starts at AveragePool-7 and onnx.reference counts the pads at version 1,
    # against the spec ("divided by the number of elements exclude pad").
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0]}
    x = {"X": _data(rng, (1, 2, 7, 7), dtype)}
    _check_as(
        "AveragePool",
        x,
        attrs,
        1,
        dict(attrs, count_include_pad=0),
        7,
        tol=1e-2 if dtype == np.float16 else 1e-6,
    )


@pytest.mark.parametrize("shape, attrs", GEOMETRIES[:5] + GEOMETRIES[7:])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(rng, shape, attrs, p):
    check_node("LpPool", {"X": _data(rng, shape)}, dict(attrs, p=p), opset=11, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, attrs", DILATED[:2])
def test_lp_pool_18_dilated(rng, shape, attrs):
    # ONNX Runtime has no LpPool-18 kernel.
    check_node(
        "LpPool",
        {"X": _data(rng, shape)},
        dict(attrs, p=2),
        opset=18,
        reference="onnx",
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((1, 2, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        (
            (1, 2, 8, 7),
            {"kernel_shape": [3, 3], "strides": [2, 3], "pads": [1, 0, 1, 0], "ceil_mode": 1},
        ),
    ],
)
def test_lp_pool_18_ceil_mode(rng, shape, attrs):
    # The windows ceil_mode adds sum over zeros, as explicit end padding does. (onnx.reference
    # rescales those windows as if they were full.)
    attrs = dict(attrs, p=2)
    geometry = {k: v for k, v in attrs.items() if k != "ceil_mode"}
    pads = geometry.pop("pads", [0] * 4)
    ends = [
        (n + pads[i] + pads[i + 2] - k) % s
        for i, (n, k, s) in enumerate(
            zip(shape[2:], attrs["kernel_shape"], attrs["strides"], strict=True)
        )
    ]
    padded = pads[:2] + [
        pads[i + 2] + (s - e if e else 0)
        for i, (e, s) in enumerate(zip(ends, attrs["strides"], strict=True))
    ]
    _check_as("LpPool", {"X": _data(rng, shape)}, attrs, 18, dict(geometry, pads=padded), 11)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_lp_pool_dtypes(rng, dtype):
    tol = 1e-2 if dtype == np.float16 else 1e-6
    attrs = {"kernel_shape": [2, 2], "p": 3}
    reference = "onnx" if dtype == np.float64 else "ort"
    check_node(
        "LpPool",
        {"X": _data(rng, (1, 2, 5, 5), dtype)},
        attrs,
        opset=11,
        reference=reference,
        rtol=tol,
        atol=tol,
    )


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 3, 4, 5), (1, 2, 3, 4, 2), (0, 3, 4, 4)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_global_pools(rng, op_type, shape, dtype):
    if dtype == np.float64 and (op_type == "GlobalLpPool" or shape[0] == 0 or len(shape) != 4):
        pytest.skip("neither ONNX Runtime nor onnx.reference computes this case right")
    tol = 1e-2 if dtype == np.float16 else 1e-6
    reference = "onnx" if dtype == np.float64 else "ort"  # ONNX Runtime has no float64 kernels
    check_node(
        op_type, {"X": _data(rng, shape, dtype)}, opset=21, reference=reference, rtol=tol, atol=tol
    )


@pytest.mark.parametrize("p", [1, 3])
def test_global_lp_pool_p(rng, p):
    check_node("GlobalLpPool", {"X": _data(rng, (2, 3, 4, 4))}, {"p": p}, rtol=1e-5, atol=1e-5)


def test_lp_pool_v1_float_p(rng):
    # ONNX Runtime starts at version 2 (integer p).
    x = {"X": _data(rng, (1, 2, 4, 4))}
    _check_as(
        "LpPool", x, {"kernel_shape": [2, 2], "p": 3.0}, 1, {"kernel_shape": [2, 2], "p": 3}, 2
    )
    _check_as("GlobalLpPool", x, {"p": 3.0}, 1, {"p": 3}, 2)


def _pooled(rng, shape, attrs):
    """MaxPool's outputs as MaxUnpool inputs."""
    from opcheck import make_node_model, ort_run

    x = {"X": _data(rng, shape)}
    return ort_run(make_node_model("MaxPool", x, attrs, outputs=["Y", "I"]), x)


@pytest.mark.parametrize(
    "shape, attrs, output_shape",
    [
        ((1, 2, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, None),
        ((2, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2]}, None),
        ((2, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2]}, [2, 2, 7, 7]),
        ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, None),
        ((1, 1, 9), {"kernel_shape": [2], "strides": [2]}, [1, 1, 9]),
    ],
)
@pytest.mark.parametrize("opset", [9, 11, 22])
def test_max_unpool(rng, shape, attrs, output_shape, opset):
    y, i = _pooled(rng, shape, attrs)
    inputs = {"X": y, "I": i}
    if output_shape is not None:
        inputs["output_shape"] = np.array(output_shape, np.int64)
    check_node("MaxUnpool", inputs, attrs, opset=opset, constants=["output_shape"])


@pytest.mark.parametrize("opset", [9, 11, 22])
def test_max_unpool_output_shape_extends_the_grid(rng, opset):
    """The spec's example: the indices address the 4x4 grid that kernel_shape and strides give;
    output_shape appends zeros. ONNX Runtime reads them in output_shape's own layout instead."""
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    i = np.array([[[[5, 7], [13, 15]]]], np.int64)
    inputs = {"X": x, "I": i, "output_shape": np.array([1, 1, 5, 5], np.int64)}
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    want = np.zeros((1, 1, 5, 5), np.float32)
    want[0, 0, 1:4:2, 1:4:2] = [[5, 6], [7, 8]]
    expected = check_node(
        "MaxUnpool", inputs, attrs, opset=opset, constants=["output_shape"], reference="onnx"
    )
    np.testing.assert_array_equal(expected[0], want)
    # With pads the grid is (4 - 1) * 2 + 3 - 2 = 7 per axis, extended to 9 at the ends.
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    y, i = _pooled(rng, (1, 2, 7, 7), attrs)
    inputs = {"X": y, "I": i, "output_shape": np.array([1, 2, 9, 9], np.int64)}
    check_node(
        "MaxUnpool", inputs, attrs, opset=opset, constants=["output_shape"], reference="onnx"
    )


def test_max_unpool_output_shape_smaller_than_the_grid():
    inputs = {
        "X": np.ones((1, 1, 2, 2), np.float32),
        "I": np.array([[[[0, 2], [8, 10]]]], np.int64),
        "output_shape": np.array([1, 1, 3, 3], np.int64),
    }
    model = make_node_model(
        "MaxUnpool", inputs, {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=22,
        constants=["output_shape"],
    )  # fmt: skip
    with pytest.raises(TransmuterError, match="smaller than the unpooled shape"):
        transmuter_runs(model, inputs)
