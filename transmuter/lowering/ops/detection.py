"""Detection and image-patch operators: NonMaxSuppression, RoiAlign, MaxRoiPool, DeformConv,
Col2Im and CenterCropPad.

NonMaxSuppression's output length depends on the scores, so it runs with numpy on the host and
follows ONNX Runtime's algorithm step for step (float32 IoU, ties to the lower box index). The
others run on the device: sampling positions are computed with jnp (so gradients reach the
inputs, RoI coordinates and offsets included) and the pixels they touch are gathered.
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op, variant
from transmuter.lowering.shared import spatial_attrs

_ROI_SIZES = "the RoI sizes (with sampling_ratio=0 they decide how many points each bin samples)"


def _divide(numerator, denominator, dtype):
    """numerator / denominator rounded like an IEEE float32 division, as ONNX Runtime's is.

    XLA on CPU divides by a broadcast scalar by multiplying with its reciprocal, which is one ulp
    off for some values: enough to move a floor or ceil (a bin edge) to the next pixel. The
    float64 quotient of two float32 values, even so computed, rounds to the exact float32 one.
    float64 inputs have no wider type to go through and may differ from ONNX Runtime by an ulp.
    """
    if np.dtype(dtype) == np.float64:
        return numerator / jnp.asarray(denominator, dtype)
    wide = jnp.asarray(numerator).astype(jnp.float64) / jnp.asarray(denominator, jnp.float64)
    return wide.astype(dtype)


def _scalar(value, name: str, default, dtype):
    """An optional scalar input (shape [] or [1]) as a numpy scalar, or `default` if absent."""
    if value is None or np.size(value) == 0:
        return default
    value = np.asarray(value)
    if value.size != 1:
        raise ShapeError(f"NonMaxSuppression: {name} must be a scalar, got shape {value.shape}")
    return dtype(value.reshape(()))


def _corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(x_min, x_max, y_min, y_max) per box, in float32 as ONNX Runtime computes them."""
    if center_point_box == 0:
        y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
        return np.minimum(x1, x2), np.maximum(x1, x2), np.minimum(y1, y2), np.maximum(y1, y2)
    if center_point_box == 1:
        xc, yc, w, h = (boxes[..., i] for i in range(4))
        half_w, half_h = w / np.float32(2), h / np.float32(2)
        return xc - half_w, xc + half_w, yc - half_h, yc + half_h
    raise ValueError(f"NonMaxSuppression: center_point_box must be 0 or 1, got {center_point_box}")


def _suppressed(corners, area, chosen: int, rest: np.ndarray, iou_threshold) -> np.ndarray:
    """Which boxes `rest` overlap box `chosen` by IoU > iou_threshold. Boxes that do not
    intersect, or have no area, never suppress (ONNX Runtime's early exits)."""
    x_min, x_max, y_min, y_max = corners
    ix_min, ix_max = np.maximum(x_min[chosen], x_min[rest]), np.minimum(x_max[chosen], x_max[rest])
    iy_min, iy_max = np.maximum(y_min[chosen], y_min[rest]), np.minimum(y_max[chosen], y_max[rest])
    inter = (ix_max - ix_min) * (iy_max - iy_min)
    union = area[chosen] + area[rest] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / union
    overlap = (ix_max > ix_min) & (iy_max > iy_min) & (inter > 0)
    return overlap & (area[chosen] > 0) & (area[rest] > 0) & (union > 0) & (iou > iou_threshold)


@op("NonMaxSuppression", since=(10, 11), data_dependent=True)
def non_max_suppression(
    boxes,
    scores,
    max_output_boxes_per_class=None,
    iou_threshold=None,
    score_threshold=None,
    *,
    center_point_box=0,
):
    """ONNX NonMaxSuppression-10..11: greedy per-class selection; [num_selected, 3] int64."""
    # The threshold semantics are ONNX Runtime's: a box is dropped when its score is not strictly
    # greater than score_threshold (the spec's text says "less than"), and suppressed when its
    # IoU with a selected box is strictly greater than iou_threshold.
    boxes = np.asarray(boxes, np.float32)
    scores = np.asarray(scores, np.float32)
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ShapeError(f"NonMaxSuppression: boxes must be [batches, boxes, 4], got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ShapeError(
            f"NonMaxSuppression: scores must be [batches, classes, boxes] = "
            f"[{boxes.shape[0]}, C, {boxes.shape[1]}] for boxes {boxes.shape}, got {scores.shape}"
        )
    limit = max(
        int(_scalar(max_output_boxes_per_class, "max_output_boxes_per_class", 0, np.int64)), 0
    )
    iou_threshold = _scalar(iou_threshold, "iou_threshold", np.float32(0), np.float32)
    score_threshold = _scalar(score_threshold, "score_threshold", None, np.float32)
    if not 0 <= iou_threshold <= 1:
        raise ValueError(f"NonMaxSuppression: iou_threshold must be in [0, 1], got {iou_threshold}")
    selected = []
    if limit > 0:
        for batch in range(boxes.shape[0]):
            corners = _corners(boxes[batch], center_point_box)
            area = (corners[1] - corners[0]) * (corners[3] - corners[2])
            for klass in range(scores.shape[1]):
                class_scores = scores[batch, klass]
                candidates = np.arange(class_scores.size)
                if score_threshold is not None:
                    candidates = candidates[class_scores > score_threshold]
                # Highest score first; a stable sort keeps equal scores in box-index order.
                order = candidates[np.argsort(-class_scores[candidates], kind="stable")]
                alive = np.ones(order.size, bool)
                chosen = []
                for i in range(order.size):
                    if not alive[i]:
                        continue
                    chosen.append(order[i])
                    if len(chosen) == limit:
                        break
                    alive[i + 1 :] &= ~_suppressed(
                        corners, area, order[i], order[i + 1 :], iou_threshold
                    )
                selected.extend((batch, klass, box) for box in chosen)
    return np.array(selected, np.int64).reshape(-1, 3)


def _linear(pos, size: int):
    """ONNX Runtime's RoiAlign interpolation along one axis: positions in [-1, size] are clamped
    into the image and split between two neighbouring pixels; others weigh nothing.
    Returns (low index, high index, low weight, high weight), weights zero outside."""
    inside = (pos >= -1) & (pos <= size)
    pos = jnp.clip(pos, 0, size)
    low = jnp.floor(pos).astype(jnp.int32)
    last = low >= size - 1
    low = jnp.where(last, size - 1, low)
    high = jnp.where(last, size - 1, low + 1)
    frac = jnp.where(last, 0, pos - low.astype(pos.dtype))
    zero = jnp.zeros_like(frac)
    return low, high, jnp.where(inside, 1 - frac, zero), jnp.where(inside, frac, zero)


def _roi_align(
    ctx,
    x,
    rois,
    batch_indices,
    mode,
    output_height,
    output_width,
    sampling_ratio,
    spatial_scale,
    half_pixel,
):
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign: mode must be 'avg' or 'max', got {mode!r}")
    x = jnp.asarray(x)
    if x.ndim != 4:
        raise ShapeError(f"RoiAlign: X must be (N, C, H, W), got shape {x.shape}")
    if np.ndim(rois) != 2 or np.shape(rois)[1] != 4:
        raise ShapeError(f"RoiAlign: rois must be (num_rois, 4), got shape {np.shape(rois)}")
    if np.shape(batch_indices) != (np.shape(rois)[0],):
        raise ShapeError(
            f"RoiAlign: batch_indices must be ({np.shape(rois)[0]},) like rois, got {np.shape(batch_indices)}"
        )
    if isinstance(batch_indices, np.ndarray) and np.any(
        (batch_indices < 0) | (batch_indices >= x.shape[0])
    ):
        raise ShapeError(
            f"RoiAlign: batch_indices must lie in [0, {x.shape[0]}), got {batch_indices}"
        )
    ct = accumulation_dtype(x.dtype)
    height, width = x.shape[2], x.shape[3]
    sizes = (output_height, output_width)

    def geometry(r, xp):
        # ONNX Runtime's arithmetic order, in the compute type, so sample points match.
        r = r.astype(ct) * ct.type(spatial_scale) - ct.type(0.5 if half_pixel else 0.0)
        start = (r[:, 1], r[:, 0])  # (h, w)
        extent = (r[:, 3] - r[:, 1], r[:, 2] - r[:, 0])
        if not half_pixel:  # the legacy mode stretches RoIs smaller than a pixel to one pixel
            extent = tuple(xp.maximum(e, ct.type(1)) for e in extent)
        bins = tuple(
            e / ct.type(n) if xp is np else _divide(e, n, ct)
            for e, n in zip(extent, sizes, strict=True)
        )
        return start, bins

    if sampling_ratio > 0:
        grids = (np.full(np.shape(rois)[0], sampling_ratio),) * 2
    elif sampling_ratio == 0:
        # Each RoI samples ceil(bin size) points per bin and axis: the gather's size depends on
        # RoI values. Under a trace, ask the runtime to break the graph here and re-run with
        # concrete RoIs.
        _, bins = geometry(ctx.host_value(1, rois, _ROI_SIZES), np)
        grids = tuple(np.ceil(b).astype(np.int64) for b in bins)
    else:
        raise ValueError(f"RoiAlign: sampling_ratio must be >= 0, got {sampling_ratio}")
    points = max([1] + [int(g.max()) for g in grids if g.size])
    start, bins = geometry(jnp.asarray(rois), jnp)

    axes = []
    for axis in range(2):
        step = jnp.arange(sizes[axis], dtype=ct)[None, :, None]
        sample = jnp.arange(points, dtype=ct)[None, None, :]
        b = bins[axis][:, None, None]
        pos = (
            start[axis][:, None, None]
            + step * b
            + _divide((sample + ct.type(0.5)) * b, np.maximum(grids[axis], 1)[:, None, None], ct)
        )
        low, high, w_low, w_high = _linear(pos, (height, width)[axis])
        # RoIs with fewer points than `points` leave the rest unused.
        used = sample < jnp.asarray(grids[axis], ct)[:, None, None]
        axes.append((jnp.stack([low, high], -1), jnp.stack([w_low, w_high], -1), used))
    (rows, wy, used_y), (cols, wx, used_x) = axes

    # (R, ph, iy, 2, pw, ix, 2, C): the four neighbours of every sample point and their weights.
    # Written as products and reductions (not einsum) so XLA fuses the gather into the reduction
    # instead of materializing it.
    image = jnp.moveaxis(x, 1, -1).astype(ct)
    batch = jnp.asarray(batch_indices).astype(jnp.int32)
    values = image[
        batch[:, None, None, None, None, None, None],
        rows[:, :, :, :, None, None, None],
        cols[:, None, None, None, :, :, :],
    ]
    weights = (wy[:, :, :, :, None, None, None] * wx[:, None, None, None, :, :, :])[..., None]
    used = (used_y[:, :, :, None, None] & used_x[:, None, None, :, :])[
        :, :, :, None, :, :, None, None
    ]
    if mode == "avg":
        count = jnp.maximum(jnp.asarray(grids[0] * grids[1]), 1).astype(ct)
        y = jnp.sum(jnp.where(used, weights * values, 0), axis=(2, 3, 5, 6))
        y = y / count[:, None, None, None]
    else:
        # ONNX Runtime and onnx.reference agree on max mode: each sample is the largest of its
        # four *weighted* neighbours (w * v), not the interpolated value; the bin takes the
        # largest sample. We follow them, as models exported for either expect.
        y = jnp.max(jnp.where(used, weights * values, -jnp.inf), axis=(2, 3, 5, 6))
        # A bin with no sample points (an empty RoI) is 0, as in ONNX Runtime.
        y = jnp.where(jnp.any(used, axis=(2, 3, 5, 6)), y, 0)
    y = jnp.moveaxis(y, -1, 1)
    return y.astype(x.dtype)


@op("RoiAlign", since=(16, 22), context=True, may_need_host=_ROI_SIZES)
def roi_align_v16(
    ctx,
    X,
    rois,
    batch_indices,
    *,
    coordinate_transformation_mode="half_pixel",
    mode="avg",
    output_height=1,
    output_width=1,
    sampling_ratio=0,
    spatial_scale=1.0,
):
    """ONNX RoiAlign-16..22: bilinear RoI pooling, half_pixel or output_half_pixel coordinates."""
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError(
            "RoiAlign: coordinate_transformation_mode must be 'half_pixel' or "
            f"'output_half_pixel', got {coordinate_transformation_mode!r}"
        )
    return _roi_align(
        ctx,
        X,
        rois,
        batch_indices,
        mode,
        output_height,
        output_width,
        sampling_ratio,
        spatial_scale,
        coordinate_transformation_mode == "half_pixel",
    )


roi_align_v10 = op("RoiAlign", since=10, context=True, may_need_host=_ROI_SIZES)(variant(
    roi_align_v16, "roi_align_v10",
    "ONNX RoiAlign-10: bilinear RoI pooling without the half-pixel shift (output_half_pixel).",
    fixed={"coordinate_transformation_mode": "output_half_pixel"},
))  # fmt: skip


def _round_half_away(v):
    """std::round: halves away from zero. floor(|v| + 0.5) would round 0.49999997 up."""
    whole = jnp.trunc(v)
    return whole + jnp.sign(v) * (jnp.abs(v - whole) >= 0.5).astype(v.dtype)


@op("MaxRoiPool", since=(1, 22))
def max_roi_pool(X, rois, *, pooled_shape, spatial_scale=1.0):
    """ONNX MaxRoiPool-1..22: max over integer-aligned RoI bins (Fast R-CNN RoIPool)."""
    x = jnp.asarray(X)
    if x.ndim != 4:
        raise ShapeError(f"MaxRoiPool: X must be (N, C, H, W), got shape {x.shape}")
    if np.ndim(rois) != 2 or np.shape(rois)[1] != 5:
        raise ShapeError(f"MaxRoiPool: rois must be (num_rois, 5), got shape {np.shape(rois)}")
    if len(pooled_shape) != 2 or min(pooled_shape) < 1:
        raise ValueError(f"MaxRoiPool: pooled_shape must be two positive sizes, got {pooled_shape}")
    ct = accumulation_dtype(x.dtype)
    r = jnp.asarray(rois).astype(ct)
    # ONNX Runtime (like Caffe) rounds the scaled corners half away from zero, makes every RoI
    # at least one pixel, and spreads it over bins with floor/ceil edges clamped to the image.
    corner = lax.stop_gradient(_round_half_away(r[:, 1:] * ct.type(spatial_scale))).astype(
        jnp.int32
    )
    masks = []
    for axis, size in ((1, x.shape[2]), (0, x.shape[3])):  # (h, w) from [x1, y1, x2, y2]
        first = corner[:, axis]
        extent = jnp.maximum(corner[:, axis + 2] - first + 1, 1)
        pooled = pooled_shape[1 - axis]
        bin_size = _divide(extent.astype(ct), pooled, ct)
        step = jnp.arange(pooled, dtype=ct)
        lo = jnp.floor(step * bin_size[:, None]).astype(jnp.int32) + first[:, None]
        hi = jnp.ceil((step + 1) * bin_size[:, None]).astype(jnp.int32) + first[:, None]
        lo, hi = jnp.clip(lo, 0, size), jnp.clip(hi, 0, size)
        pixel = jnp.arange(size, dtype=jnp.int32)[None, None, :]
        masks.append((pixel >= lo[..., None]) & (pixel < hi[..., None]))  # (R, pooled, size)
    in_h, in_w = masks
    image = x[jnp.asarray(rois)[:, 0].astype(jnp.int32)]  # (R, C, H, W)
    low = jnp.array(-jnp.inf, x.dtype)
    # Separable: the max over each bin's columns (R, C, H, pw), then over its rows.
    cols = jnp.max(jnp.where(in_w[:, None, None], image[:, :, :, None, :], low), axis=-1)
    y = jnp.max(jnp.where(in_h[:, None, :, :, None], cols[:, :, None], low), axis=3)
    empty = ~jnp.any(in_h, -1)[:, :, None] | ~jnp.any(in_w, -1)[:, None, :]
    return jnp.where(empty[:, None], jnp.zeros((), x.dtype), y)


@op("DeformConv", since=(19, 22))
def deform_conv(
    X,
    W,
    offset,
    B=None,
    mask=None,
    *,
    dilations=None,
    group=1,
    kernel_shape=None,
    offset_group=1,
    pads=None,
    strides=None,
):
    """ONNX DeformConv-19..22: N-D convolution sampling X at offset (bilinear) positions."""
    x, w, offset = jnp.asarray(X), jnp.asarray(W), jnp.asarray(offset)
    rank = x.ndim - 2
    if rank < 1 or w.ndim != x.ndim:
        raise ShapeError(
            f"DeformConv: X must be (N, C, D1, ...) and W of the same rank, got {x.shape} and {w.shape}"
        )
    n, channels = x.shape[:2]
    out_channels, kernel = w.shape[0], tuple(w.shape[2:])
    if kernel_shape is not None and tuple(kernel_shape) != kernel:
        raise ShapeError(
            f"DeformConv: kernel_shape {tuple(kernel_shape)} does not match W's {kernel}"
        )
    if channels != w.shape[1] * group or out_channels % group:
        raise ShapeError(
            f"DeformConv: X has {channels} channels and W is {w.shape}: need C = W.shape[1] x "
            f"group ({group}) and oC divisible by group"
        )
    if channels % offset_group:
        raise ShapeError(
            f"DeformConv: {channels} channels are not divisible by offset_group {offset_group}"
        )
    strides, dilations, pad_pairs = spatial_attrs(
        "DeformConv", rank, strides, dilations, pads, "NOTSET"
    )
    sizes = x.shape[2:]
    out = tuple(
        (s + lo + hi - (k - 1) * d - 1) // st + 1
        for s, (lo, hi), k, d, st in zip(sizes, pad_pairs, kernel, dilations, strides, strict=True)
    )
    taps = math.prod(kernel)
    if offset.shape != (n, offset_group * taps * rank) + out:
        raise ShapeError(
            f"DeformConv: offset must be {(n, offset_group * taps * rank) + out} for these "
            f"shapes and attributes, got {offset.shape}"
        )
    if mask is not None and np.shape(mask) != (n, offset_group * taps) + out:
        raise ShapeError(
            f"DeformConv: mask must be {(n, offset_group * taps) + out}, got {np.shape(mask)}"
        )
    ct = accumulation_dtype(x.dtype)
    places = math.prod(out)
    # Unshifted sampling positions, (taps, rank, places): output position * stride - pad begin
    # + kernel tap * dilation.
    tap = np.stack(np.meshgrid(*(np.arange(k) for k in kernel), indexing="ij"), 0).reshape(
        rank, taps
    )
    grid = np.stack(np.meshgrid(*(np.arange(o) for o in out), indexing="ij"), 0).reshape(
        rank, places
    )
    base = np.stack(
        [
            grid[i][None] * strides[i] - pad_pairs[i][0] + tap[i][:, None] * dilations[i]
            for i in range(rank)
        ],
        1,
    )
    pos = jnp.asarray(base, ct) + offset.astype(ct).reshape(n, offset_group, taps, rank, places)
    # Corners outside X read zero; clipping far positions keeps them outside and in int range.
    pos = jnp.clip(pos, -2, jnp.asarray(sizes, ct)[:, None] + 1)
    low = jnp.floor(pos)
    frac = pos - low
    low = low.astype(jnp.int32)
    flat_strides = [math.prod(sizes[i + 1 :]) for i in range(rank)]
    image = x.reshape(n, offset_group, channels // offset_group, math.prod(sizes))
    image = jnp.moveaxis(image, 2, 3).astype(ct)
    batch = jnp.arange(n)[:, None, None, None]
    groups = jnp.arange(offset_group)[None, :, None, None]
    cols = 0
    for corner in itertools.product((0, 1), repeat=rank):
        index, weight, inside = 0, 1, True
        for i, c in enumerate(corner):
            at = low[:, :, :, i] + c
            inside = inside & (at >= 0) & (at < sizes[i])
            index = index + jnp.clip(at, 0, sizes[i] - 1) * flat_strides[i]
            weight = weight * (frac[:, :, :, i] if c else 1 - frac[:, :, :, i])
        weight = jnp.where(inside, weight, 0)
        cols = cols + weight[..., None] * image[batch, groups, index]  # (N, G, taps, places, C/G)
    if mask is not None:
        cols = cols * jnp.asarray(mask).astype(ct).reshape(n, offset_group, taps, places)[..., None]
    cols = jnp.moveaxis(cols, 4, 2).reshape(n, group, channels // group, taps, places)
    weights = w.astype(ct).reshape(group, out_channels // group, channels // group, taps)
    y = jnp.einsum("ngckl,gock->ngol", cols, weights).reshape((n, out_channels) + out)
    if B is not None:
        y = y + jnp.asarray(B).astype(ct).reshape((1, -1) + (1,) * rank)
    return y.astype(x.dtype)


@op(
    "Col2Im",
    since=18,
    host_inputs={"image_shape": "the image size", "block_shape": "the block size"},
)
def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """ONNX Col2Im-18: sum column blocks [N, C*prod(block), L] back into an N-D image."""
    if np.dtype(x.dtype) in (np.dtype(object), np.dtype(bool)):
        raise ValueError(
            f"Col2Im: overlapping blocks are summed, which {x.dtype} tensors cannot be"
        )
    x = jnp.asarray(x)
    image = tuple(int(v) for v in np.asarray(image_shape).reshape(-1))
    block = tuple(int(v) for v in np.asarray(block_shape).reshape(-1))
    rank = len(image)
    if len(block) != rank or x.ndim != 3:
        raise ShapeError(
            f"Col2Im: input must be [N, C*prod(block), L] with image_shape and block_shape of one "
            f"length; got input {x.shape}, image_shape {image}, block_shape {block}"
        )
    strides, dilations, pad_pairs = spatial_attrs(
        "Col2Im", rank, strides, dilations, pads, "NOTSET"
    )
    taps = math.prod(block)
    if x.shape[1] % taps:
        raise ShapeError(
            f"Col2Im: input dim 1 ({x.shape[1]}) is not a multiple of prod(block_shape) = {taps}"
        )
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(image, pad_pairs, strict=True))
    counts = tuple(
        (p - (b - 1) * d - 1) // st + 1
        for p, b, d, st in zip(padded, block, dilations, strides, strict=True)
    )
    if min(counts) < 1 or math.prod(counts) != x.shape[2]:
        raise ShapeError(
            f"Col2Im: the geometry gives {counts} blocks, but input has L = {x.shape[2]}"
        )
    # Padded-image position of (block tap, block) pairs, flattened: (taps, L).
    tap = np.stack(np.meshgrid(*(np.arange(b) for b in block), indexing="ij"), 0).reshape(
        rank, taps, 1
    )
    at = np.stack(np.meshgrid(*(np.arange(c) for c in counts), indexing="ij"), 0).reshape(
        rank, 1, -1
    )
    position = at * np.array(strides).reshape(rank, 1, 1) + tap * np.array(dilations).reshape(
        rank, 1, 1
    )
    flat = np.ravel_multi_index(tuple(position), padded).reshape(-1)
    n, channels = x.shape[0], x.shape[1] // taps
    y = jnp.zeros((n, channels, math.prod(padded)), x.dtype)
    y = y.at[:, :, flat].add(x.reshape(n, channels, flat.size)).reshape((n, channels) + padded)
    return y[
        (slice(None), slice(None))
        + tuple(slice(lo, lo + s) for s, (lo, _) in zip(image, pad_pairs, strict=True))
    ]


@op("CenterCropPad", since=18, host_inputs={"shape": "the output size"})
def center_crop_pad(input_data, shape, *, axes=None):
    """ONNX CenterCropPad-18: crop or zero-pad the given axes to `shape`, centred."""
    x = input_data
    xp = np if isinstance(x, np.ndarray) and x.dtype == object else jnp
    x = xp.asarray(x)
    rank = x.ndim
    axes = tuple(range(rank)) if axes is None else tuple(axes)
    if any(not -rank <= a < rank for a in axes):
        raise ShapeError(f"CenterCropPad: axes {axes} out of range for rank {rank}")
    axes = tuple(a % rank for a in axes)
    sizes = [int(v) for v in np.asarray(shape).reshape(-1)]
    if len(sizes) != len(axes) or len(set(axes)) != len(axes):
        raise ShapeError(
            f"CenterCropPad: shape {sizes} must give one size per distinct axis of {axes}"
        )
    if min(sizes, default=0) < 0:
        raise ShapeError(f"CenterCropPad: shape must be non-negative, got {sizes}")
    crop = [slice(None)] * rank
    pad = [(0, 0)] * rank
    for axis, size in zip(axes, sizes, strict=True):
        dim = x.shape[axis]
        if size < dim:  # an odd surplus leaves the extra element at the end
            first = (dim - size) // 2
            crop[axis] = slice(first, first + size)
        elif size > dim:  # an odd deficit puts the extra zero at the end
            pad[axis] = ((size - dim) // 2, size - dim - (size - dim) // 2)
    y = x[tuple(crop)]
    if any(p != (0, 0) for p in pad):
        y = xp.pad(y, pad, constant_values="" if xp is np else 0)
    return y
