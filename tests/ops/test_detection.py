"""Detection operators against ONNX Runtime (onnx.reference where ONNX Runtime lacks a version
or a type): NonMaxSuppression, RoiAlign, MaxRoiPool, DeformConv, Col2Im, CenterCropPad."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.test_util import check_grads
from opcheck import (
    assert_close,
    check_node,
    make_node_model,
    ort_run,
    transmuter_runs,
)

from transmuter.errors import NodeError
from transmuter.lowering.ops.detection import deform_conv, roi_align_v16

# ---------------------------------------------------------------- NonMaxSuppression

NMS_INPUTS = ["boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold"]


def _nms(boxes, scores, max_boxes=None, iou=None, score=None, *, opset=11, **attrs):
    inputs = {
        "boxes": np.asarray(boxes, np.float32),
        "scores": np.asarray(scores, np.float32),
        "max_output_boxes_per_class": None
        if max_boxes is None
        else np.array([max_boxes], np.int64),
        "iou_threshold": None if iou is None else np.array([iou], np.float32),
        "score_threshold": None if score is None else np.array([score], np.float32),
    }
    return check_node("NonMaxSuppression", inputs, attrs, opset=opset, input_names=NMS_INPUTS)[0]


def _random_boxes(rng, batches, count, *, center=False, grid=False):
    if grid:  # coordinates on a coarse grid: exact IoU ties and equal-threshold cases
        corners = rng.integers(0, 6, (batches, count, 4)).astype(np.float32)
    else:
        corners = rng.uniform(0, 10, (batches, count, 4)).astype(np.float32)
    if center:
        corners[..., 2:] = np.abs(corners[..., 2:]) + 0.5
    return corners


@pytest.mark.parametrize("opset", [10, 11])
@pytest.mark.parametrize("iou", [0.0, 0.3, 0.5, 1.0])
def test_nms_batches_and_classes(rng, opset, iou):
    boxes = _random_boxes(rng, 2, 30)
    scores = rng.uniform(size=(2, 3, 30))
    selected = _nms(boxes, scores, 7, iou, opset=opset)
    assert selected.shape[0] > 0


@pytest.mark.parametrize("score", [0.0, 0.5, 0.95])
def test_nms_score_threshold(rng, score):
    _nms(_random_boxes(rng, 2, 25), rng.uniform(size=(2, 2, 25)), 10, 0.4, score)


def test_nms_score_threshold_keeps_only_greater():
    boxes = [[[0, 0, 1, 1], [0, 2, 1, 3], [0, 4, 1, 5]]]
    selected = _nms(boxes, [[[0.5, 0.6, 0.4]]], 5, 0.5, 0.5)
    assert selected.tolist() == [[0, 0, 1]]


def test_nms_center_point_box(rng):
    boxes = _random_boxes(rng, 2, 30, center=True)
    _nms(boxes, rng.uniform(size=(2, 3, 30)), 10, 0.3, 0.2, center_point_box=1)


def test_nms_onnx_example_center_point():
    boxes = [
        [
            [0.5, 0.5, 1.0, 1.0],
            [0.5, 0.6, 1.0, 1.0],
            [0.5, 0.4, 1.0, 1.0],
            [0.5, 10.5, 1.0, 1.0],
            [0.5, 10.6, 1.0, 1.0],
            [0.5, 100.5, 1.0, 1.0],
        ]
    ]
    scores = [[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]]
    assert _nms(boxes, scores, 3, 0.5, 0.0, center_point_box=1).tolist() == [
        [0, 0, 3],
        [0, 0, 0],
        [0, 0, 5],
    ]


@pytest.mark.parametrize("max_boxes", [None, 0, -3])
def test_nms_no_boxes_requested(rng, max_boxes):
    selected = _nms(_random_boxes(rng, 1, 8), rng.uniform(size=(1, 2, 8)), max_boxes, 0.5)
    assert selected.shape == (0, 3)


def test_nms_absent_thresholds(rng):
    _nms(_random_boxes(rng, 2, 12), rng.uniform(size=(2, 2, 12)), 4)


@pytest.mark.parametrize("seed", range(3))
def test_nms_ties_and_exact_iou(seed):
    # Grid coordinates make many IoUs exactly 0, 1/3, 1/2 or 1; scores with repeats test that
    # equal scores are taken in box-index order.
    rng = np.random.default_rng(seed)
    boxes = _random_boxes(rng, 2, 40, grid=True)
    scores = rng.integers(0, 4, (2, 3, 40)) / 4
    for iou in (0.0, 1 / 3, 0.5, 1.0):
        _nms(boxes, scores, 40, iou)


def test_nms_identical_boxes_and_equal_scores():
    boxes = [[[0, 0, 2, 2]] * 4 + [[0, 1, 2, 3]]]  # box 4 overlaps the others by IoU 1/3
    scores = [[[0.5, 0.5, 0.5, 0.5, 0.5]]]
    assert _nms(boxes, scores, 10, 0.9).tolist() == [[0, 0, 0], [0, 0, 4]]
    assert _nms(boxes, scores, 10, 1 / 3).tolist() == [[0, 0, 0], [0, 0, 4]]
    assert _nms(boxes, scores, 10, 0.3).tolist() == [[0, 0, 0]]


def test_nms_flipped_and_empty_boxes():
    # Corners in either order; zero-area boxes never suppress nor get suppressed.
    boxes = [
        [[1, 1, 0, 0], [0, 0, 1, 1], [0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5], [1, 0, 0, 1.1]]
    ]
    _nms(boxes, [[[0.9, 0.8, 0.7, 0.6, 0.5]]], 5, 0.5)


@pytest.mark.parametrize("shape", [(1, 0, 2), (2, 3, 0), (0, 1, 2)])
def test_nms_zero_sizes(rng, shape):
    batches, count, classes = shape
    selected = _nms(
        _random_boxes(rng, batches, count), rng.uniform(size=(batches, classes, count)), 3, 0.5
    )
    assert selected.shape == (0, 3)


def test_nms_scalar_inputs(rng):
    inputs = {
        "boxes": _random_boxes(rng, 1, 10),
        "scores": rng.uniform(size=(1, 2, 10)).astype(np.float32),
        "max_output_boxes_per_class": np.array(3, np.int64),
        "iou_threshold": np.array(0.4, np.float32),
        "score_threshold": np.array(0.1, np.float32),
    }
    check_node("NonMaxSuppression", inputs, opset=11, constants=NMS_INPUTS[2:])


def test_nms_rejects_iou_outside_unit_interval(rng):
    inputs = {
        "boxes": _random_boxes(rng, 1, 4),
        "scores": rng.uniform(size=(1, 1, 4)).astype(np.float32),
        "max_output_boxes_per_class": np.array([2]),
        "iou_threshold": np.array([1.5], np.float32),
    }
    model = make_node_model("NonMaxSuppression", inputs, opset=11)
    with pytest.raises(NodeError, match="iou_threshold"):
        transmuter_runs(model, inputs, compiled=False)


# ---------------------------------------------------------------- RoiAlign

ROIS = np.array(
    [
        [1, 1, 6, 7],
        [0.5, 2.2, 9.7, 8.1],
        [-3, -2, 4, 15],
        [3, 3, 3.2, 3.1],
        [8, 9, 2, 1],
        [0, 0, 30, 30],
    ],
    np.float32,
)
BATCH = np.array([0, 1, 1, 0, 1, 0])


def _roi_inputs(rng, dtype=np.float32, rois=ROIS):
    x = rng.standard_normal((2, 3, 10, 12)).astype(dtype)
    return {"X": x, "rois": rois.astype(dtype), "batch_indices": BATCH[: len(rois)]}


def _roi_attrs(mode="avg", sampling_ratio=0, ctm=None, **more):
    attrs = {
        "mode": mode,
        "output_height": 3,
        "output_width": 2,
        "sampling_ratio": sampling_ratio,
        "spatial_scale": 0.8,
        **more,
    }
    if ctm is not None:
        attrs["coordinate_transformation_mode"] = ctm
    return attrs


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("sampling_ratio", [0, 1, 3])
@pytest.mark.parametrize("opset, ctm", [(10, None), (16, "half_pixel"), (16, "output_half_pixel")])
def test_roi_align(rng, opset, ctm, mode, sampling_ratio):
    check_node(
        "RoiAlign",
        _roi_inputs(rng),
        _roi_attrs(mode, sampling_ratio, ctm),
        opset=opset,
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_host_rois(rng, mode):
    # Constant RoIs (as in some exports) size the adaptive grid without a graph break.
    check_node(
        "RoiAlign",
        _roi_inputs(rng),
        _roi_attrs(mode),
        opset=16,
        constants=["rois", "batch_indices"],
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_ort_and_reference_agree(rng, mode):
    # Max mode takes the largest *weighted* neighbour per sample (see detection.py); ONNX Runtime
    # and onnx.reference both do, so the lowering is checked against each.
    inputs, attrs = _roi_inputs(rng), _roi_attrs(mode, 2, "half_pixel", output_height=2)
    check_node("RoiAlign", inputs, attrs, opset=16, rtol=1e-5, atol=1e-5)
    check_node("RoiAlign", inputs, attrs, opset=16, reference="onnx", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_22(rng, mode):  # ONNX Runtime has no RoiAlign-22 kernel
    check_node(
        "RoiAlign",
        _roi_inputs(rng),
        _roi_attrs(mode, 2, "half_pixel"),
        opset=22,
        reference="onnx",
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("dtype, tol", [(np.float16, 2e-2), (np.float64, 1e-10)])
def test_roi_align_dtypes(rng, dtype, tol):
    # ONNX Runtime computes float16 in float16; the lowering in float32, hence the tolerance.
    for mode in ("avg", "max"):
        check_node(
            "RoiAlign", _roi_inputs(rng, dtype), _roi_attrs(mode, 2), opset=16, rtol=tol, atol=tol
        )


def test_roi_align_bfloat16(rng):
    inputs = _roi_inputs(rng, ml_dtypes.bfloat16)
    model = make_node_model("RoiAlign", inputs, _roi_attrs("avg", 2), opset=22)
    wide = {k: v.astype(np.float32) if k != "batch_indices" else v for k, v in inputs.items()}
    expected = ort_run(make_node_model("RoiAlign", wide, _roi_attrs("avg", 2), opset=16), wide)[0]
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert got.dtype == ml_dtypes.bfloat16, mode
        np.testing.assert_allclose(np.asarray(got, np.float32), expected, rtol=2e-2, atol=2e-2)


def test_roi_align_symbolic_rois(rng):
    inputs = _roi_inputs(rng)
    check_node(
        "RoiAlign",
        inputs,
        _roi_attrs("avg", 2),
        opset=16,
        symbolic={"rois": [0], "batch_indices": [0]},
        rtol=1e-5,
        atol=1e-5,
    )


def test_roi_align_zero_rois(rng):
    inputs = _roi_inputs(rng, rois=ROIS[:0])
    check_node("RoiAlign", inputs, _roi_attrs("avg", 2), opset=16)


def test_roi_align_is_differentiable(rng):
    x = rng.standard_normal((2, 3, 10, 12))
    rois = ROIS[:3].astype(np.float64)

    def pooled(x, rois):
        return roi_align_v16(
            None, x, rois, BATCH[:3], output_height=2, output_width=2, sampling_ratio=2
        )

    with jax.enable_x64(True):
        check_grads(
            jax.jit(pooled),
            (jnp.asarray(x), jnp.asarray(rois)),
            order=1,
            modes=["rev"],
            atol=1e-4,
            rtol=1e-4,
        )


# ---------------------------------------------------------------- MaxRoiPool

POOL_ROIS = np.array(
    [
        [0, 1, 1, 6, 7],
        [1, 0.5, 2.2, 9.7, 8.1],
        [1, -3, -2, 4, 15],
        [0, 3, 3, 3.2, 3.1],
        [1, 8, 9, 2, 1],
        [0, 0, 0, 30, 30],
        [1, 2.5, 1.5, 5.5, 4.5],
        [0, 20, 20, 25, 25],
    ],
    np.float32,
)


@pytest.mark.parametrize("pooled_shape", [[1, 1], [3, 2], [4, 5]])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5, 0.625])
def test_max_roi_pool(rng, pooled_shape, spatial_scale):
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    check_node(
        "MaxRoiPool",
        {"X": x, "rois": POOL_ROIS},
        {"pooled_shape": pooled_shape, "spatial_scale": spatial_scale},
        opset=1,
    )


@pytest.mark.parametrize(
    "opset, dtype", [(1, np.float16), (1, np.float64), (22, np.float32), (22, ml_dtypes.bfloat16)]
)
def test_max_roi_pool_versions_and_dtypes(rng, opset, dtype):
    # ONNX Runtime has MaxRoiPool-1 for float32 only: compare with it on the same values.
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32).astype(dtype)  # exact in float32
    inputs = {"X": x, "rois": POOL_ROIS.astype(dtype)}
    attrs = {"pooled_shape": [3, 2], "spatial_scale": 0.5}
    wide = {k: v.astype(np.float32) for k, v in inputs.items()}
    expected = ort_run(make_node_model("MaxRoiPool", wide, attrs, opset=1), wide)[0]
    for mode, (got,) in transmuter_runs(
        make_node_model("MaxRoiPool", inputs, attrs, opset=opset), inputs
    ).items():
        assert_close(got, expected.astype(dtype), rtol=0, atol=0, what=mode)


def test_max_roi_pool_zero_rois(rng):
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    check_node("MaxRoiPool", {"X": x, "rois": POOL_ROIS[:0]}, {"pooled_shape": [2, 2]}, opset=1)


# ---------------------------------------------------------------- DeformConv


def _deform_inputs(
    rng, x_shape, w_shape, attrs, *, bias=False, mask=False, scale=2.0, dtype=np.float32
):
    n, rank = x_shape[0], len(x_shape) - 2
    kernel = w_shape[2:]
    pads = attrs.get("pads", [0] * 2 * rank)
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    out = [
        (s + pads[i] + pads[i + rank] - (k - 1) * d - 1) // st + 1
        for i, (s, k, d, st) in enumerate(zip(x_shape[2:], kernel, dilations, strides, strict=True))
    ]
    taps = int(np.prod(kernel)) * attrs.get("offset_group", 1)
    inputs = {
        "X": rng.standard_normal(x_shape).astype(dtype),
        "W": rng.standard_normal(w_shape).astype(dtype),
        "offset": (scale * rng.standard_normal([n, taps * rank] + out)).astype(dtype),
        "B": rng.standard_normal(w_shape[0]).astype(dtype) if bias else None,
        "mask": rng.uniform(size=[n, taps] + out).astype(dtype) if mask else None,
    }
    return inputs


DEFORM_CASES = [
    ((1, 2, 5, 5), (3, 2, 3, 3), {}, {}),
    ((2, 3, 7, 6), (4, 3, 3, 2), {"pads": [1, 0, 2, 1], "strides": [2, 1]}, {"bias": True}),
    ((1, 2, 9, 8), (2, 2, 2, 3), {"dilations": [2, 2], "pads": [1, 1, 1, 1]}, {"mask": True}),
    (
        (2, 4, 6, 6),
        (6, 2, 3, 3),
        {"group": 2, "offset_group": 2, "pads": [1, 1, 1, 1]},
        {"bias": True, "mask": True},
    ),
    ((1, 4, 6, 7), (2, 4, 1, 1), {"offset_group": 4}, {"scale": 4.0}),
    ((1, 2, 6, 6), (2, 2, 3, 3), {"kernel_shape": [3, 3], "strides": [2, 2]}, {"scale": 10.0}),
]


@pytest.mark.parametrize("opset", [19, 22])
@pytest.mark.parametrize("x_shape, w_shape, attrs, options", DEFORM_CASES)
def test_deform_conv(rng, opset, x_shape, w_shape, attrs, options):
    inputs = _deform_inputs(rng, x_shape, w_shape, attrs, **options)
    check_node(
        "DeformConv",
        inputs,
        attrs,
        opset=opset,
        input_names=["X", "W", "offset", "B", "mask"],
        rtol=1e-4,
        atol=1e-4,
    )


def test_deform_conv_symbolic_and_zero_batch(rng):
    inputs = _deform_inputs(rng, (2, 2, 5, 5), (3, 2, 3, 3), {})
    check_node(
        "DeformConv", inputs, opset=19, symbolic={"X": [0], "offset": [0]}, rtol=1e-4, atol=1e-4
    )
    check_node("DeformConv", _deform_inputs(rng, (0, 2, 5, 5), (3, 2, 3, 3), {}), opset=19)


def test_deform_conv_reference_agrees(rng):
    x_shape, w_shape, attrs, options = DEFORM_CASES[3]
    inputs = _deform_inputs(rng, x_shape, w_shape, attrs, **options)
    check_node(
        "DeformConv",
        inputs,
        attrs,
        opset=19,
        reference="onnx",
        rtol=1e-4,
        atol=1e-4,
        input_names=["X", "W", "offset", "B", "mask"],
    )


def test_deform_conv_integer_offsets(rng):
    # Whole-pixel offsets land exactly on pixels (and past the border, where X reads zero).
    inputs = _deform_inputs(rng, (1, 2, 6, 6), (2, 2, 3, 3), {})
    inputs["offset"] = np.round(inputs["offset"] * 2)
    check_node("DeformConv", inputs, opset=19, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(np.float16, 5e-2), (np.float64, 1e-10)])
def test_deform_conv_dtypes(rng, dtype, tol):
    x_shape, w_shape, attrs, options = DEFORM_CASES[1]
    inputs = _deform_inputs(rng, x_shape, w_shape, attrs, dtype=dtype, **options)
    check_node(
        "DeformConv",
        inputs,
        attrs,
        opset=19,
        rtol=tol,
        atol=tol,
        input_names=["X", "W", "offset", "B"],
    )


def test_deform_conv_bfloat16(rng):
    inputs = _deform_inputs(rng, (1, 2, 5, 5), (3, 2, 3, 3), {}, bias=True)
    low = {k: v.astype(ml_dtypes.bfloat16) for k, v in inputs.items() if v is not None}
    wide = {k: v.astype(np.float32) for k, v in low.items()}
    expected = ort_run(make_node_model("DeformConv", wide, opset=19), wide)[0]
    for mode, (got,) in transmuter_runs(make_node_model("DeformConv", low, opset=22), low).items():
        assert got.dtype == ml_dtypes.bfloat16, mode
        np.testing.assert_allclose(np.asarray(got, np.float32), expected, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 3, 9), (4, 3, 3), {"pads": [1, 2], "strides": [2], "dilations": [2]}),
        ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 2]}),
    ],
)
def test_deform_conv_zero_offsets_is_conv(rng, x_shape, w_shape, attrs):
    # ONNX Runtime and onnx.reference only take 2-D DeformConv; with zero offsets and a unit
    # mask it is a plain convolution, which checks the N-D path.
    inputs = _deform_inputs(rng, x_shape, w_shape, attrs, bias=True, scale=0.0)
    conv_inputs = {k: inputs[k] for k in ("X", "W", "B")}
    expected = ort_run(make_node_model("Conv", conv_inputs, attrs, opset=19), conv_inputs)[0]
    model = make_node_model(
        "DeformConv", inputs, attrs, opset=19, input_names=["X", "W", "offset", "B"]
    )
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert_close(got, expected, rtol=1e-4, atol=1e-4, what=mode)


def test_deform_conv_is_differentiable(rng):
    inputs = _deform_inputs(
        rng, (1, 2, 5, 5), (2, 2, 3, 3), {"pads": [1, 1, 1, 1]}, mask=True, dtype=np.float64
    )
    # Bilinear sampling has kinks at whole pixels: keep the finite differences away from them.
    inputs["offset"] = np.round(inputs["offset"]) + rng.uniform(0.2, 0.8, inputs["offset"].shape)

    def conv(x, w, offset):
        return deform_conv(x, w, offset, None, inputs["mask"], pads=(1, 1, 1, 1))

    with jax.enable_x64(True):
        args = tuple(jnp.asarray(inputs[k]) for k in ("X", "W", "offset"))
        check_grads(jax.jit(conv), args, order=1, modes=["rev"], atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- Col2Im

COL2IM_CASES = [
    ([4, 4], [2, 2], {}),
    ([5, 6], [2, 3], {"strides": [2, 1]}),
    ([5, 5], [3, 3], {"pads": [1, 1, 1, 1]}),
    ([7, 6], [2, 2], {"dilations": [2, 3], "pads": [0, 1, 1, 2], "strides": [1, 2]}),
    ([4, 5, 3], [2, 2, 2], {"strides": [2, 1, 1], "pads": [0, 1, 0, 0, 0, 1]}),
]


def _col2im_inputs(rng, image, block, attrs, *, n=2, channels=3, dtype=np.float32):
    rank = len(image)
    pads = attrs.get("pads", [0] * 2 * rank)
    strides = attrs.get("strides", [1] * rank)
    dilations = attrs.get("dilations", [1] * rank)
    blocks = np.prod(
        [
            (s + pads[i] + pads[i + rank] - (b - 1) * d - 1) // st + 1
            for i, (s, b, d, st) in enumerate(zip(image, block, dilations, strides, strict=True))
        ]
    )
    data = rng.standard_normal((n, channels * int(np.prod(block)), int(blocks))) * 10
    return {
        "input": data.astype(dtype),
        "image_shape": np.array(image),
        "block_shape": np.array(block),
    }


@pytest.mark.parametrize("image, block, attrs", COL2IM_CASES)
def test_col2im(rng, image, block, attrs):
    inputs = _col2im_inputs(rng, image, block, attrs)
    check_node(
        "Col2Im",
        inputs,
        attrs,
        opset=18,
        constants=["image_shape", "block_shape"],
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_col2im_dtypes(rng, dtype):
    image, block, attrs = COL2IM_CASES[3]
    inputs = _col2im_inputs(rng, image, block, attrs, dtype=dtype)
    # ONNX Runtime's Col2Im takes float32 only.
    check_node(
        "Col2Im",
        inputs,
        attrs,
        opset=18,
        constants=["image_shape", "block_shape"],
        reference="onnx",
        rtol=1e-2 if dtype == np.float16 else 1e-7,
    )


def test_col2im_symbolic_and_zero_batch(rng):
    image, block, attrs = COL2IM_CASES[1]
    check_node(
        "Col2Im",
        _col2im_inputs(rng, image, block, attrs),
        attrs,
        opset=18,
        constants=["image_shape", "block_shape"],
        symbolic={"input": [0]},
    )
    inputs = _col2im_inputs(rng, image, block, attrs, n=0)
    model = make_node_model(
        "Col2Im", inputs, attrs, opset=18, constants=["image_shape", "block_shape"]
    )
    for mode, (got,) in transmuter_runs(model, inputs).items():
        assert got.shape == (0, 3, 5, 6), mode


def test_col2im_rejects_wrong_block_count(rng):
    inputs = _col2im_inputs(rng, [4, 4], [2, 2], {})
    inputs["input"] = inputs["input"][:, :, :-1]
    model = make_node_model("Col2Im", inputs, opset=18, constants=["image_shape", "block_shape"])
    with pytest.raises(Exception, match="blocks"):
        transmuter_runs(model, inputs, compiled=False)


# ---------------------------------------------------------------- CenterCropPad

CROP_CASES = [
    ((6, 7), [4, 4], None),  # crop, even and odd surplus
    ((3, 4), [6, 7], None),  # pad, odd and even deficit
    ((5, 4), [2, 9], None),  # crop one axis, pad the other
    ((2, 5, 6), [3, 3], [1, 2]),
    ((2, 5, 6), [8], [-1]),
    ((2, 5, 6), [2, 5], [-3, 1]),  # unchanged sizes
    ((4, 3, 5), [0, 3], [0, 2]),
]


@pytest.mark.parametrize("shape, target, axes", CROP_CASES)
def test_center_crop_pad(rng, shape, target, axes):
    inputs = {
        "input_data": rng.standard_normal(shape).astype(np.float32),
        "shape": np.array(target),
    }
    attrs = {} if axes is None else {"axes": axes}
    check_node("CenterCropPad", inputs, attrs, opset=18, constants=["shape"])


def test_center_crop_pad_int32_shape(rng):
    # ONNX Runtime's expansion of the function body fails on an int32 shape (Max of int64 and
    # int32), so this one is checked against onnx.reference.
    inputs = {
        "input_data": rng.standard_normal((5, 4, 3)).astype(np.float32),
        "shape": np.array([2, 7], np.int32),
    }
    check_node(
        "CenterCropPad", inputs, {"axes": [0, -1]}, opset=18, constants=["shape"], reference="onnx"
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.int64, np.bool_])
def test_center_crop_pad_dtypes(rng, dtype):
    x = (rng.standard_normal((5, 4, 3)) * 10).astype(dtype)
    check_node(
        "CenterCropPad",
        {"input_data": x, "shape": np.array([3, 6])},
        {"axes": [0, 1]},
        opset=18,
        constants=["shape"],
    )


def test_center_crop_pad_strings():
    # ONNX Runtime has no string Pad, and onnx.reference pads strings with the integer 0; the
    # padding value of a string tensor is ONNX's zero for strings, "".
    x = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
    inputs = {"input_data": x, "shape": np.array([3, 2])}
    model = make_node_model("CenterCropPad", inputs, opset=18, constants=["shape"])
    # compiled=False: transmuter.compile of a graph whose only input is a string tensor fails in
    # the runtime (not in this op); reported to the lead.
    (got,) = transmuter_runs(model, inputs, compiled=False)["eager"]
    assert got.tolist() == [["a", "b"], ["d", "e"], ["", ""]]


def test_center_crop_pad_symbolic(rng):
    x = rng.standard_normal((3, 6, 5)).astype(np.float32)
    check_node(
        "CenterCropPad",
        {"input_data": x, "shape": np.array([4, 7])},
        {"axes": [1, 2]},
        opset=18,
        constants=["shape"],
        symbolic={"input_data": [0]},
    )
