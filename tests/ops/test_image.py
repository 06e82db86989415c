"""Resize, Upsample, GridSample and AffineGrid against ONNX Runtime (onnx.reference where
ONNX Runtime lacks a case)."""

import numpy as np
import pytest
from opcheck import assert_close, check_node, make_node_model, ort_run, transmuter_runs

RESIZE_INPUTS = ["X", "roi", "scales", "sizes"]
COORDINATES = [
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "half_pixel_symmetric",
]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# (input shape, scales or sizes): enlarging, shrinking, mixed, fractional, to one
GEOMETRIES = [
    ((1, 2, 4, 5), {"scales": [1, 1, 2, 3]}),
    ((1, 2, 8, 9), {"scales": [1, 1, 0.5, 0.34]}),
    ((1, 1, 5, 7), {"scales": [1, 1, 1.7, 0.6]}),
    ((2, 1, 6, 5), {"sizes": [2, 1, 9, 3]}),
    ((1, 1, 7, 6), {"sizes": [1, 1, 1, 11]}),
    ((3, 10), {"scales": [1, 0.7]}),
    ((1, 1, 3, 4, 5), {"sizes": [1, 1, 5, 3, 8]}),
]


def _data(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _resize_inputs(x, given, roi=None):
    inputs = {"X": x, "roi": None if roi is None else np.asarray(roi, np.float32)}
    inputs["scales"] = np.asarray(given["scales"], np.float32) if "scales" in given else None
    inputs["sizes"] = np.asarray(given["sizes"], np.int64) if "sizes" in given else None
    return inputs


def check_resize(x, given, attrs, opset=19, roi=None, reference="ort", tol=1e-5):
    inputs = _resize_inputs(x, given, roi)
    check_node(
        "Resize", inputs, attrs, opset=opset, constants=["roi", "scales", "sizes"],
        input_names=RESIZE_INPUTS, reference=reference, rtol=tol, atol=tol,
    )  # fmt: skip


def _model(op_type, inputs, attrs, opset):
    names = RESIZE_INPUTS if op_type == "Resize" else None
    constants = ["roi", "scales", "sizes", "size"]
    return make_node_model(
        op_type, inputs, attrs, opset=opset, constants=constants, input_names=names
    )


def check_like(expected, op_type, inputs, attrs, opset, tol=1e-5):
    """Transmuter's output (dtype of X) against `expected`, computed another way."""
    for mode, outputs in transmuter_runs(_model(op_type, inputs, attrs, opset), inputs).items():
        assert outputs[0].dtype == inputs["X"].dtype, f"{mode}: dtype {outputs[0].dtype}"
        got = np.asarray(outputs[0])
        if expected.dtype != object:
            got = got.astype(expected.dtype)
        if tol >= 1:  # integers compared within a tolerance
            got, expected = got.astype(np.float64), expected.astype(np.float64)
        assert_close(got, expected, rtol=tol, atol=tol, what=f"{op_type} ({mode})")


def ort_as(op_type, inputs, attrs, opset, dtype=None):
    """ONNX Runtime's output for the node, with X cast to `dtype` first if given."""
    if dtype is not None:
        inputs = {**inputs, "X": inputs["X"].astype(dtype)}
    return ort_run(_model(op_type, inputs, attrs, opset), inputs)[0]


NEAREST_CASES = [(c, n) for c in ("half_pixel", "asymmetric") for n in NEAREST] + [
    (c, "round_prefer_floor")
    for c in ("pytorch_half_pixel", "align_corners", "half_pixel_symmetric")
]


@pytest.mark.parametrize("shape, given", GEOMETRIES)
@pytest.mark.parametrize("coordinates, nearest_mode", NEAREST_CASES)
def test_resize_nearest(rng, shape, given, coordinates, nearest_mode):
    attrs = {
        "mode": "nearest",
        "coordinate_transformation_mode": coordinates,
        "nearest_mode": nearest_mode,
    }
    reference = "ort"
    if coordinates == "half_pixel_symmetric":
        # ONNX Runtime's nearest path rounds some float32 coordinates that are exact halves
        # (or whole numbers) the other way, so compare with onnx.reference, except where its
        # float64 arithmetic breaks such ties (and output sizes) differently from float32.
        if shape in ((1, 1, 5, 7), (1, 1, 7, 6), (3, 10)):
            pytest.skip("float32 and float64 coordinates round this geometry differently")
        reference = "onnx"
    check_resize(_data(rng, shape), given, attrs, reference=reference)


@pytest.mark.parametrize("shape, given", GEOMETRIES)
@pytest.mark.parametrize("coordinates", COORDINATES)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_interpolating(rng, shape, given, coordinates, mode):
    if mode == "cubic" and len(shape) == 5:
        pytest.skip("ONNX Runtime's cubic mode resizes at most 2 axes (its 4-D kernel)")
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates}
    reference = _align_corners_reference(shape, given, attrs)
    check_resize(_data(rng, shape), given, attrs, reference=reference)


def _align_corners_reference(shape, given, attrs) -> str:
    """align_corners with scales divides by scale * size - 1 (the spec's example data), ONNX
    Runtime by the integer output size less one: where scale * size is fractional, compare with
    onnx.reference (elsewhere its float64 output sizes can differ from float32 ones)."""
    if attrs.get("coordinate_transformation_mode") != "align_corners" or "scales" not in given:
        return "ort"
    resized = np.float32(given["scales"]) * np.float32(shape)
    return "onnx" if np.any(resized != np.floor(resized)) else "ort"


@pytest.mark.parametrize("opset", [11, 13, 18, 19])
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_align_corners_with_scales_divides_by_scale_times_size(mode, opset):
    """The spec's example (test_resize_downsample_scales_linear_align_corners): 4 * 0.6 = 2.4
    resized columns, so output column 1 samples x = 1 * (4 - 1) / (2.4 - 1) = 2.142857."""
    x = np.arange(1, 9, dtype=np.float32).reshape(1, 1, 2, 4)
    attrs = {"mode": mode, "coordinate_transformation_mode": "align_corners"}
    inputs = _resize_inputs(x, {"scales": [1, 1, 0.6, 0.6]}, roi=[] if opset == 11 else None)
    want = check_node(
        "Resize", inputs, attrs, opset=opset, constants=["roi", "scales", "sizes"],
        input_names=RESIZE_INPUTS, reference="onnx",
    )[0]  # fmt: skip
    if mode == "linear":
        np.testing.assert_allclose(want, [[[[1.0, 3.142857]]]], rtol=1e-6)


@pytest.mark.parametrize("shape, given", GEOMETRIES[:5])
@pytest.mark.parametrize("a, exclude_outside", [(-0.5, 0), (-0.75, 1), (-0.5, 1)])
def test_resize_cubic_options(rng, shape, given, a, exclude_outside):
    attrs = {"mode": "cubic", "cubic_coeff_a": a, "exclude_outside": exclude_outside}
    check_resize(_data(rng, shape), given, attrs)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize(
    "shape, given, roi",
    [
        ((1, 1, 6, 7), {"sizes": [1, 1, 4, 5]}, [0, 0, 0.2, 0.3, 1, 1, 0.8, 0.9]),
        ((1, 1, 6, 7), {"sizes": [1, 1, 5, 9]}, [0, 0, -0.2, 0.1, 1, 1, 1.3, 1.2]),
        ((1, 1, 6, 7), {"scales": [1, 1, 0.8, 1.5]}, [0, 0, 0.4, 0.6, 1, 1, 0.6, 0.2]),
        ((1, 1, 6, 7), {"sizes": [1, 1, 1, 3]}, [0, 0, 0.25, 0, 1, 1, 0.5, 1]),
    ],
)
def test_resize_crop_and_resize(rng, mode, shape, given, roi):
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": "tf_crop_and_resize",
        "extrapolation_value": -3.0,
    }
    check_resize(_data(rng, shape), given, attrs, roi=roi)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize(
    "shape, given",
    [
        ((1, 1, 16, 12), {"scales": [1, 1, 0.3, 0.5]}),
        ((1, 2, 9, 17), {"sizes": [1, 2, 4, 5]}),
        ((1, 1, 8, 8), {"scales": [1, 1, 2.0, 0.6]}),
    ],
)
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_antialias(rng, mode, shape, given, exclude_outside):
    attrs = {"mode": mode, "antialias": 1, "exclude_outside": exclude_outside}
    check_resize(_data(rng, shape), given, attrs, opset=18, tol=1e-4)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coordinates", ["align_corners", "asymmetric", "pytorch_half_pixel"])
def test_resize_antialias_coordinates(rng, mode, coordinates):
    attrs = {"mode": mode, "antialias": 1, "coordinate_transformation_mode": coordinates}
    shape, given = (1, 1, 13, 11), {"scales": [1, 1, 0.4, 0.7]}
    reference = _align_corners_reference(shape, given, attrs)
    check_resize(_data(rng, shape), given, attrs, opset=18, tol=1e-4, reference=reference)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize(
    "axes, sizes", [([2, 3], [3, 5]), ([3, 2], [9, 7]), ([-1], [4]), ([1, 3], [3, 2])]
)
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_and_aspect_ratio(rng, policy, axes, sizes, mode):
    attrs = {"mode": mode, "axes": axes, "keep_aspect_ratio_policy": policy}
    x = _data(rng, (1, 2, 4, 6))
    if min(axes) < 0:
        # ONNX Runtime ignores keep_aspect_ratio_policy with negative axes and onnx.reference
        # rejects them: compare with the same axes counted from the front.
        inputs = _resize_inputs(x, {"sizes": sizes})
        expected = ort_as("Resize", inputs, dict(attrs, axes=[a % 4 for a in axes]), 18)
        check_like(expected, "Resize", inputs, attrs, 18)
    else:
        # ONNX Runtime's linear kernel cannot resize the channel axis.
        reference = "onnx" if mode == "linear" and 1 in axes else "ort"
        check_resize(x, {"sizes": sizes}, attrs, opset=18, reference=reference)


def test_resize_axes_with_scales_and_roi(rng):
    attrs = {
        "mode": "linear",
        "axes": [3, 2],
        "coordinate_transformation_mode": "tf_crop_and_resize",
    }
    check_resize(
        _data(rng, (1, 2, 5, 6)), {"scales": [1.5, 0.8]}, attrs, opset=19, roi=[0.1, 0.2, 0.9, 1.0]
    )


@pytest.mark.parametrize("opset", [11, 13, 18, 19])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_versions(rng, opset, mode):
    x = _data(rng, (1, 2, 4, 5))
    roi = [] if opset == 11 else None  # roi and scales are required inputs before version 13
    check_resize(x, {"scales": [1, 1, 1.5, 0.6]}, {"mode": mode}, opset=opset, roi=roi)
    inputs = _resize_inputs(x, {"sizes": [1, 2, 7, 3]}, roi)
    if opset == 11:
        inputs["scales"] = np.zeros(0, np.float32)
    check_node(
        "Resize",
        inputs,
        {"mode": mode},
        opset=opset,
        constants=["roi", "scales", "sizes"],
        input_names=RESIZE_INPUTS,
    )


def test_resize_tf_half_pixel_for_nn(rng):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}
    check_resize(_data(rng, (1, 1, 5, 10)), {"scales": [1, 1, 1.6, 0.65]}, attrs, opset=11, roi=[])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.7, 0.5], [1, 1, 1.5, 0.6]])
def test_resize_v10(rng, mode, scales):
    x = _data(rng, (1, 2, 5, 10))
    inputs = {"X": x, "scales": np.asarray(scales, np.float32)}
    check_node("Resize", inputs, {"mode": mode}, opset=10, constants=["scales"])


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_dtypes(rng, dtype, mode):
    if np.dtype(dtype).kind == "f":
        x = _data(rng, (1, 2, 5, 6), dtype)
    else:
        x = rng.uniform(-50 if np.dtype(dtype).kind == "i" else 40, 100, (1, 2, 5, 6)).astype(dtype)
    given, attrs = {"scales": [1, 1, 1.5, 0.7]}, {"mode": mode}
    # ONNX Runtime has float, int8, uint8 and int32 kernels, and cubic for float only.
    if dtype in (np.int8, np.uint8, np.int32) and mode != "cubic":
        check_resize(x, given, attrs)
        return
    inputs = _resize_inputs(x, given)
    expected = ort_as("Resize", inputs, attrs, 19, np.float32)
    if np.dtype(dtype).kind in "iu":
        # Integers truncate the interpolated value; float32 rounding may land on either side
        # of a whole number, so allow one unit.
        check_like(np.trunc(expected), "Resize", inputs, attrs, 19, tol=1)
    else:
        check_like(expected, "Resize", inputs, attrs, 19, tol=1e-2 if dtype == np.float16 else 1e-5)


def test_resize_strings_and_bool_nearest(rng):
    given = {"scales": [2.0, 0.7]}
    rows, cols = [0, 0, 1, 1], [0, 2]  # half_pixel, round_prefer_floor
    for x in (
        np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object),
        rng.standard_normal((2, 3)) > 0,
    ):
        inputs = _resize_inputs(x, given)
        check_like(x[np.ix_(rows, cols)], "Resize", inputs, {"mode": "nearest"}, 19)


def test_resize_symbolic_and_zero_batch(rng):
    inputs = _resize_inputs(_data(rng, (3, 2, 4, 5)), {"sizes": [3, 2, 8, 7]})
    attrs = {"mode": "linear", "axes": [2, 3]}
    inputs["sizes"] = np.array([8, 7], np.int64)
    check_node(
        "Resize",
        inputs,
        attrs,
        opset=19,
        constants=["roi", "scales", "sizes"],
        input_names=RESIZE_INPUTS,
        symbolic={"X": [0]},
    )
    inputs["X"] = _data(rng, (0, 2, 4, 5))
    check_node(
        "Resize",
        inputs,
        attrs,
        opset=19,
        constants=["roi", "scales", "sizes"],
        input_names=RESIZE_INPUTS,
    )


@pytest.mark.parametrize(
    "opset, attrs",
    [(7, {"scales": [1.0, 1.0, 2.0, 3.0]}), (1, {"height_scale": 2.0, "width_scale": 3.0})],
)
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_attribute_scales(rng, opset, attrs, mode):
    x = _data(rng, (1, 2, 3, 4))
    if opset == 1:
        # ONNX Runtime starts at Upsample-7: compare with it.
        expected = ort_run(
            make_node_model(
                "Upsample", {"X": x}, {"mode": mode, "scales": [1.0, 1.0, 2.0, 3.0]}, opset=7
            ),
            {"X": x},
        )[0]
        model = make_node_model(
            "Upsample",
            {"X": x},
            dict(attrs, mode="bilinear" if mode == "linear" else mode),
            opset=1,
        )
        for name, outputs in transmuter_runs(model, {"X": x}).items():
            assert_close(outputs[0], expected, rtol=1e-5, atol=1e-6, what=f"Upsample-1 ({name})")
    else:
        check_node("Upsample", {"X": x}, dict(attrs, mode=mode), opset=opset)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 1.5, 2.5], [1, 2, 3, 1]])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_upsample_v9(rng, mode, scales, dtype):
    x = (_data(rng, (1, 2, 3, 4)) * 10).astype(dtype)
    inputs = {"X": x, "scales": np.asarray(scales, np.float32)}
    if dtype == np.int32 and mode == "linear":
        # Truncated integers: float32 rounding may land on either side of a whole number.
        check_like(
            ort_as("Upsample", inputs, {"mode": mode}, 9),
            "Upsample",
            inputs,
            {"mode": mode},
            9,
            tol=1,
        )
    else:
        check_node("Upsample", inputs, {"mode": mode}, opset=9, constants=["scales"])


def _grid(rng, shape, spread=1.3):
    """Normalized positions, some beyond [-1, 1], plus exact corners and centers."""
    grid = rng.uniform(-spread, spread, shape).astype(np.float32)
    grid.reshape(-1, shape[-1])[:3] = [[-1] * shape[-1], [1] * shape[-1], [0] * shape[-1]]
    return grid


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_2d(rng, mode, padding_mode, align_corners):
    x, grid = _data(rng, (2, 3, 5, 6)), _grid(rng, (2, 4, 7, 2))
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    check_node("GridSample", {"X": x, "grid": grid}, attrs, opset=20, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "mode, padding_mode, align_corners",
    [("linear", p, a) for p in ("zeros", "border", "reflection") for a in (0, 1)]
    + [("nearest", "reflection", 0), ("nearest", "border", 1)],
)
def test_grid_sample_3d(rng, mode, padding_mode, align_corners):
    x, grid = _data(rng, (1, 2, 3, 4, 5)), _grid(rng, (1, 2, 3, 4, 3))
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    check_node("GridSample", {"X": x, "grid": grid}, attrs, opset=20, rtol=1e-4, atol=1e-4)


def test_grid_sample_3d_cubic(rng):
    # ONNX Runtime has no volumetric cubic kernel.
    x, grid = _data(rng, (1, 2, 3, 4, 5)), _grid(rng, (1, 2, 2, 3, 3))
    # (onnx.reference clamps the coordinate before cubic border sampling, unlike ONNX Runtime and
    # PyTorch, which clamp each tap; zeros padding has no such difference.)
    attrs = {"mode": "cubic", "padding_mode": "zeros"}
    check_node(
        "GridSample",
        {"X": x, "grid": grid},
        attrs,
        opset=20,
        reference="onnx",
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "reflection"])
def test_grid_sample_v16(rng, mode, padding_mode):
    x, grid = _data(rng, (1, 2, 4, 5)), _grid(rng, (1, 3, 3, 2))
    attrs = {"mode": mode, "padding_mode": padding_mode}
    check_node("GridSample", {"X": x, "grid": grid}, attrs, opset=16, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_grid_sample_dtypes(rng, dtype):
    x, grid = _data(rng, (1, 2, 4, 5), dtype), _grid(rng, (1, 3, 3, 2)).astype(dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-6
    check_node("GridSample", {"X": x, "grid": grid}, opset=20, reference="onnx", rtol=tol, atol=tol)


@pytest.mark.parametrize("size", [[2, 3, 4, 5], [1, 1, 3, 2, 4], [2, 1, 1, 3]])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(rng, size, align_corners):
    if align_corners and 1 in size[2:]:
        pytest.skip(
            "a single position is 0 in PyTorch, whose affine_grid the spec follows, but 1 in ONNX Runtime"
        )
    rank = len(size) - 2
    theta = _data(rng, (size[0], rank, rank + 1))
    inputs = {"theta": theta, "size": np.array(size, np.int64)}
    check_node(
        "AffineGrid",
        inputs,
        {"align_corners": align_corners},
        opset=20,
        constants=["size"],
        rtol=1e-5,
        atol=1e-5,
    )


def test_affine_grid_single_position_is_the_center():
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], np.float32)
    inputs = {"theta": theta, "size": np.array([1, 1, 1, 3], np.int64)}
    expected = np.array([[[[-1, 0], [0, 0], [1, 0]]]], np.float32)
    for mode, outputs in transmuter_runs(
        _model("AffineGrid", inputs, {"align_corners": 1}, 20), inputs
    ).items():
        assert_close(outputs[0], expected, rtol=0, atol=0, what=f"AffineGrid ({mode})")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_complex(rng, mode):
    # Resampling is linear, so complex input is its real and imaginary parts resampled apart.
    x = (_data(rng, (1, 1, 4, 5)) + 1j * _data(rng, (1, 1, 4, 5))).astype(np.complex64)
    inputs = _resize_inputs(x, {"scales": [1, 1, 1.5, 0.6]})
    real = ort_as("Resize", {**inputs, "X": x.real.copy()}, {"mode": mode}, 19)
    imag = ort_as("Resize", {**inputs, "X": x.imag.copy()}, {"mode": mode}, 19)
    check_like(real + 1j * imag, "Resize", inputs, {"mode": mode}, 19)
