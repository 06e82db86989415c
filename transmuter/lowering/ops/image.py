"""Image resampling: Resize, Upsample, GridSample and AffineGrid.

Resize and Upsample are separable and their sampling positions depend only on shapes, scales and
roi, which are all known on the host. So each resized axis gets, computed once with numpy, an
(out, taps) table of source indices and weights; on the device that is one gather and one
weighted sum per axis. Coordinates are computed in float32, as ONNX Runtime does, so that
rounding at exact halves (nearest modes) and output sizes from float scales agree with it.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import Attribute, op, variant

_F32 = np.float32
_COORDINATE_MODES = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source_coordinates(
    mode, out: int, resized, size: int, scale, roi_start, roi_end
) -> np.ndarray:
    """Float32 positions in the input of each output index along one axis. `resized` is the
    spec's length_resized: scale * size when scales are given (fractional), else `out`."""
    y = np.arange(out, dtype=_F32)
    scale, size_f, out_f, half = _F32(scale), _F32(size), _F32(out), _F32(0.5)
    if mode == "half_pixel":
        return (y + half) / scale - half
    if mode == "half_pixel_symmetric":
        adjustment = out_f / (scale * size_f)
        offset = size_f / _F32(2) * (_F32(1) - adjustment)
        return offset + (y + half) / scale - half
    if mode == "pytorch_half_pixel":
        return (y + half) / scale - half if out > 1 else np.zeros(out, _F32)
    if mode == "align_corners":
        # The spec's example data (test_resize_downsample_scales_*_align_corners) divide by
        # scale * size - 1, not by the integer output length less one as ONNX Runtime and
        # PyTorch do; the two differ only when scale * size is not a whole number.
        resized = _F32(resized)
        return y * (size_f - 1) / (resized - 1) if resized > 1 else np.zeros(out, _F32)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + half) / scale
    if mode == "tf_crop_and_resize":
        start, end = _F32(roi_start), _F32(roi_end)
        if out > 1:
            return start * (size_f - 1) + y * (end - start) * (size_f - 1) / (out_f - 1)
        return np.full(out, _F32(0.5) * (start + end) * (size_f - 1), _F32)
    raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _nearest(x: np.ndarray, nearest_mode: str, scale) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        return np.ceil(x - _F32(0.5))
    if nearest_mode == "round_prefer_ceil":
        return np.floor(x + _F32(0.5))
    if nearest_mode == "floor":
        return np.floor(x)
    if nearest_mode == "ceil":
        return np.ceil(x)
    if nearest_mode == "legacy":
        # Resize-10 and Upsample: truncate when enlarging, round up when shrinking (as ONNX
        # Runtime and the frameworks that exported these versions do).
        return np.ceil(x) if scale < 1 else np.trunc(x)
    raise ValueError(f"Resize: nearest_mode must be one of {_NEAREST_MODES}, got {nearest_mode!r}")


def _cubic_kernel(t, a: float, xp=np):
    """Keys' cubic convolution weight at distance t (numpy on the host, jnp on the device)."""
    t = xp.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return xp.where(t <= 1, near, xp.where(t < 2, far, 0.0))


def _axis_taps(
    x_src, size: int, scale, mode: str, nearest_mode: str, a: float, exclude_outside, antialias
):
    """Source indices and weights (None for nearest) of shape (out, taps) along one axis."""
    if mode == "nearest":
        index = _nearest(x_src, nearest_mode, scale).astype(np.int64)
        return np.clip(index, 0, size - 1)[:, None], None
    x = x_src.astype(np.float64)
    # Antialiasing stretches the filter by 1/scale when shrinking.
    shrink = min(float(scale), 1.0) if antialias else 1.0
    reach = math.ceil((1.0 if mode == "linear" else 2.0) / shrink)
    taps = np.floor(x)[:, None] + np.arange(1 - reach, reach + 1)
    distance = (taps - x[:, None]) * shrink
    if mode == "linear":
        weights = np.maximum(1 - np.abs(distance), 0.0)
    else:
        weights = _cubic_kernel(distance, a)
    if shrink != 1.0:
        weights = weights / weights.sum(axis=1, keepdims=True)
    if exclude_outside:
        weights = np.where((taps < 0) | (taps > size - 1), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(taps, 0, size - 1).astype(np.int64), weights


def _resample_axis(x, axis: int, index: np.ndarray, weights, dtype):
    """One gather of every tap along `axis`, then the weighted sum over taps."""
    out, taps = index.shape
    if isinstance(x, np.ndarray) and x.dtype == object:  # strings live on the host
        return np.take(x, index[:, 0], axis=axis)
    if weights is None:
        return jnp.take(x, jnp.asarray(index[:, 0]), axis=axis)
    gathered = jnp.take(x, jnp.asarray(index.reshape(-1)), axis=axis).astype(dtype)
    gathered = gathered.reshape(x.shape[:axis] + (out, taps) + x.shape[axis + 1 :])
    w = jnp.asarray(weights.astype(dtype)).reshape((out, taps) + (1,) * (x.ndim - axis - 1))
    return jnp.sum(gathered * w, axis=axis + 1)


def _host_vector(value, dtype) -> np.ndarray | None:
    """A 1-D host input, or None when absent or empty (how ONNX skips roi/scales)."""
    if value is None:
        return None
    value = np.asarray(value, dtype).reshape(-1)
    return value if value.size else None


def _output_plan(shape, scales, sizes, axes, policy):
    """Output size, the scale that maps coordinates and the (possibly fractional) resized
    length scale * size (the output size when sizes are given), per axis of X."""
    rank = len(shape)
    out, scale = list(shape), [1.0] * rank
    given = scales if scales is not None else sizes
    if given is None:
        raise ShapeError("Resize: exactly one of 'scales' and 'sizes' must be given, got neither")
    if scales is not None and sizes is not None:
        raise ShapeError("Resize: exactly one of 'scales' and 'sizes' must be given, got both")
    if len(given) != len(axes):
        raise ShapeError(
            f"Resize: {'scales' if scales is not None else 'sizes'} has {len(given)} values for {len(axes)} axes"
        )
    if scales is not None:
        resized = list(out)
        for axis, s in zip(axes, scales.astype(_F32), strict=True):
            if s <= 0:
                raise ShapeError(f"Resize: scales must be positive, got {scales.tolist()}")
            if s == 1:
                continue  # no arithmetic on a dim that may be symbolic
            # float32 product, as ONNX Runtime computes it (and so matches the frameworks
            # whose float scales were rounded to float32 on export).
            out[axis], scale[axis] = int(np.floor(_F32(s) * _F32(shape[axis]))), s
            resized[axis] = _F32(s) * _F32(shape[axis])
        return out, scale, resized
    ratios = [_F32(n) / _F32(shape[axis]) for axis, n in zip(axes, sizes, strict=True)]
    if policy == "stretch":
        for axis, n, ratio in zip(axes, sizes, ratios, strict=True):
            out[axis], scale[axis] = int(n), ratio
        return out, scale, out
    if policy not in ("not_larger", "not_smaller"):
        raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
    common = min(ratios) if policy == "not_larger" else max(ratios)
    for axis in axes:
        out[axis], scale[axis] = int(np.floor(common * _F32(shape[axis]) + _F32(0.5))), common
    return out, scale, out


def _resize(
    x, roi, scales, sizes, *, mode, coordinate_transformation_mode, cubic_coeff_a=-0.75,
    exclude_outside=0, extrapolation_value=0.0, nearest_mode="round_prefer_floor", antialias=0,
    axes=None, keep_aspect_ratio_policy="stretch", allowed_modes=_COORDINATE_MODES,
):  # fmt: skip
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"Resize: mode must be nearest, linear or cubic, got {mode!r}")
    if coordinate_transformation_mode not in allowed_modes:
        raise ValueError(
            f"Resize: coordinate_transformation_mode must be one of {allowed_modes}, "
            f"got {coordinate_transformation_mode!r}"
        )
    on_host = isinstance(x, np.ndarray) and x.dtype == object
    if on_host and mode != "nearest":
        raise ValueError(
            f"Resize: string tensors can only be resized with mode nearest, not {mode!r}"
        )
    x = x if on_host else jnp.asarray(x)
    in_dtype, rank = x.dtype, x.ndim
    axes = tuple(range(rank)) if axes is None else tuple(a % rank for a in axes)
    out, scale, resized = _output_plan(
        x.shape,
        _host_vector(scales, _F32),
        _host_vector(sizes, np.int64),
        axes,
        keep_aspect_ratio_policy,
    )
    crop = coordinate_transformation_mode == "tf_crop_and_resize"
    roi = _host_vector(roi, np.float64)
    if crop and (roi is None or roi.size != 2 * len(axes)):
        raise ShapeError(
            f"Resize: tf_crop_and_resize needs roi with {2 * len(axes)} values (starts, then ends)"
        )
    if np.dtype(x.dtype).kind == "c" or x.dtype == np.float64:
        dtype = np.dtype(x.dtype)
    else:
        dtype = np.dtype(np.float32)
    outside = None
    for i, axis in enumerate(axes):
        size = x.shape[axis]
        if not crop and out[axis] == size and scale[axis] == 1:
            continue
        start, end = (roi[i], roi[i + len(axes)]) if crop else (0.0, 1.0)
        source = _source_coordinates(
            coordinate_transformation_mode, out[axis], resized[axis], size, scale[axis], start, end
        )
        index, weights = _axis_taps(
            source, size, scale[axis], mode, nearest_mode, cubic_coeff_a, exclude_outside, antialias
        )
        x = _resample_axis(x, axis, index, weights, dtype)
        if crop:
            beyond = ((source < 0) | (source > size - 1)).reshape((-1,) + (1,) * (rank - axis - 1))
            outside = beyond if outside is None else outside | beyond
    if on_host:
        return x
    if outside is not None:
        x = jnp.where(jnp.asarray(outside), jnp.asarray(extrapolation_value, x.dtype), x)
    if np.dtype(in_dtype).kind in "iu" and mode != "nearest":
        # Interpolated integers are truncated toward zero, as ONNX Runtime does; cubic
        # overshoot saturates instead of wrapping.
        info = np.iinfo(in_dtype)
        x = jnp.clip(x, info.min, info.max)
    return x.astype(in_dtype)


_HOST = {"roi": "the crop region", "scales": "the output size", "sizes": "the output size"}


@op("Resize", since=13, host_inputs=_HOST)
def resize_v13(
    x, roi=None, scales=None, sizes=None, *, coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
    exclude_outside=0, extrapolation_value=0.0, mode="nearest", nearest_mode="round_prefer_floor",
):  # fmt: skip
    """ONNX Resize-13: nearest/linear/cubic resampling to scales or sizes."""
    return _resize(
        x, roi, scales, sizes, mode=mode, coordinate_transformation_mode=coordinate_transformation_mode,
        cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value, nearest_mode=nearest_mode,
    )  # fmt: skip


@op("Resize", since=(18, 19), host_inputs=_HOST)
def resize_v18(
    x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
    coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
    extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
    nearest_mode="round_prefer_floor",
):  # fmt: skip
    """ONNX Resize-18..19: Resize-13 plus axes, keep_aspect_ratio_policy, antialias and
    half_pixel_symmetric."""
    return _resize(
        x, roi, scales, sizes, mode=mode, coordinate_transformation_mode=coordinate_transformation_mode,
        cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value, nearest_mode=nearest_mode, antialias=antialias,
        axes=axes, keep_aspect_ratio_policy=keep_aspect_ratio_policy,
        allowed_modes=_COORDINATE_MODES + ("half_pixel_symmetric",),
    )  # fmt: skip


resize_v11 = op("Resize", since=11, host_inputs=_HOST)(variant(
    resize_v13, "resize_v11",
    "ONNX Resize-11: Resize-13 with roi and scales required (scales empty to use sizes).",
    required=("roi", "scales"),
))  # fmt: skip
resize_v10 = op("Resize", since=10, host_inputs={"scales": "the output size"})(variant(
    resize_v13, "resize_v10",
    "ONNX Resize-10: nearest or N-linear resampling by scales, asymmetric coordinates.",
    required=("scales",),
    fixed={"roi": None, "sizes": None, "coordinate_transformation_mode": "asymmetric",
           "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0,
           "nearest_mode": "legacy"},
))  # fmt: skip


def _upsample(x, scales, mode):
    if mode not in ("nearest", "linear", "bilinear"):
        raise ValueError(f"Upsample: mode must be nearest or linear, got {mode!r}")
    mode = "linear" if mode == "bilinear" else mode
    return _resize(
        x,
        None,
        scales,
        None,
        mode=mode,
        coordinate_transformation_mode="asymmetric",
        nearest_mode="legacy",
    )


@op("Upsample", since=1)
def upsample_v1(x, *, height_scale, mode="nearest", width_scale):
    """ONNX Upsample-1: enlarge the H and W axes of NCHW input."""
    if jnp.ndim(x) != 4:
        raise ShapeError(f"Upsample-1: X must be 4-D (N, C, H, W), got rank {jnp.ndim(x)}")
    return _upsample(x, np.array([1, 1, height_scale, width_scale], _F32), mode)


@op("Upsample", since=9, host_inputs={"scales": "the output size"})
def upsample_v9(x, scales, *, mode="nearest"):
    """ONNX Upsample-9: enlarge each axis by the scales input."""
    return _upsample(x, scales, mode)


upsample_v7 = op("Upsample", since=7)(variant(
    upsample_v9, "upsample_v7", "ONNX Upsample-7: enlarge each axis by the scales attribute.",
    attributes={"scales": Attribute("scales", dtype=_F32)},
))  # fmt: skip


def _grid_compute_dtype(x, grid) -> np.dtype:
    return np.dtype(np.float64 if np.float64 in (x.dtype, grid.dtype) else np.float32)


def _reflect(v, low: float, high: float):
    """Fold coordinates into [low, high] by reflecting at the borders, repeatedly."""
    span = high - low
    if span <= 0:
        return jnp.full_like(v, low)
    below = low - v
    above = v - high
    distance = jnp.where(v < low, below, above)
    folds = jnp.floor(distance / span)
    rest = distance - folds * span
    even = jnp.mod(folds, 2) == 0
    from_low = jnp.where(even, low + rest, high - rest)
    from_high = jnp.where(even, high - rest, low + rest)
    return jnp.where(v < low, from_low, jnp.where(v > high, from_high, v))


def _grid_sample(x, grid, mode: str, padding_mode: str, align_corners: int):
    x, grid = jnp.asarray(x), jnp.asarray(grid)
    rank = x.ndim - 2
    if rank < 1 or grid.ndim != x.ndim or grid.shape[0] != x.shape[0] or grid.shape[-1] != rank:
        raise ShapeError(
            f"GridSample: X (N, C, D1..Dr) needs grid (N, D1_out..Dr_out, r); got {x.shape} and {grid.shape}"
        )
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"GridSample: unknown mode {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(
            f"GridSample: padding_mode must be zeros, border or reflection, got {padding_mode!r}"
        )
    dtype = _grid_compute_dtype(x, grid)
    batch, channels, sizes = x.shape[0], x.shape[1], x.shape[2:]
    out_shape = grid.shape[1:-1]
    points = math.prod(out_shape)
    # The grid's last axis lists coordinates innermost first: (x, y, ...) for (..., H, W).
    coords = grid.astype(dtype).reshape(batch, points, rank)[..., ::-1]
    positions, bounds = [], []
    for axis, size in enumerate(sizes):
        g = coords[..., axis]
        if align_corners:
            p, low, high = (g + 1) / 2 * (size - 1), 0.0, size - 1.0
        else:
            p, low, high = ((g + 1) * size - 1) / 2, -0.5, size - 0.5
        if mode == "nearest":
            p = jnp.round(p)  # halves to even, as PyTorch and ONNX Runtime do
        if padding_mode == "border" and mode != "cubic":
            # Cubic keeps the coordinate and clamps each of its taps instead (PyTorch, ORT).
            p = jnp.where((p < low) | (p > high), jnp.clip(p, 0, size - 1), p)
        elif padding_mode == "reflection":
            p = _reflect(p, low, high)
        positions.append(p)
        bounds.append((low, high))

    # Per axis, the (batch, points, taps) integer positions and weights of the interpolation.
    offsets = {"nearest": [0], "linear": [0, 1], "cubic": [-1, 0, 1, 2]}[mode]
    offsets = np.array(offsets, dtype)
    index = jnp.zeros((batch, points) + (1,) * rank, jnp.int64)
    weight = jnp.ones((batch, points) + (1,) * rank, dtype)
    for axis, (p, size, (low, high)) in enumerate(zip(positions, sizes, bounds, strict=True)):
        base = p if mode == "nearest" else jnp.floor(p)
        position = base[..., None] + offsets
        t = (p - base)[..., None]
        if mode == "nearest":
            w = jnp.ones_like(position)
        elif mode == "linear":
            w = jnp.where(offsets == 0, 1 - t, t)
        else:
            w = _cubic_kernel(jnp.abs(offsets - t), -0.75, jnp)
        if padding_mode == "reflection":
            position = jnp.trunc(_reflect(position, low, high))
        elif padding_mode == "zeros":
            w = jnp.where((position >= 0) & (position <= size - 1), w, 0)
        shape = (batch, points) + tuple(len(offsets) if i == axis else 1 for i in range(rank))
        position = jnp.clip(position, 0, size - 1).astype(jnp.int64)
        index = index + (position * math.prod(sizes[axis + 1 :])).reshape(shape)
        weight = weight * w.reshape(shape)
    # Every tap of every point in one gather, then the weighted sum over taps.
    taps = len(offsets) ** rank
    index = jnp.broadcast_to(index, (batch, points) + (len(offsets),) * rank).reshape(batch, 1, -1)
    flat = x.reshape(batch, channels, -1)
    values = jnp.take_along_axis(
        flat, jnp.broadcast_to(index, (batch, channels, points * taps)), axis=2
    )
    values = values.astype(dtype).reshape(batch, channels, points, taps)
    weight = jnp.broadcast_to(weight, (batch, points) + (len(offsets),) * rank).reshape(
        batch, 1, points, taps
    )
    result = jnp.sum(values * weight, axis=3)
    return result.reshape((batch, channels) + out_shape).astype(x.dtype)


@op("GridSample", since=16)
def grid_sample_v16(x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """ONNX GridSample-16: sample 4-D X at normalized grid positions (bilinear/nearest/bicubic)."""
    if jnp.ndim(x) != 4:
        raise ShapeError(f"GridSample-16: X must be 4-D (N, C, H, W), got rank {jnp.ndim(x)}")
    modes = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
    if mode not in modes:
        raise ValueError(f"GridSample-16: mode must be bilinear, nearest or bicubic, got {mode!r}")
    return _grid_sample(x, grid, modes[mode], padding_mode, align_corners)


@op("GridSample", since=(20, 22))
def grid_sample_v20(x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    """ONNX GridSample-20..22: sample N-D X at normalized grid positions (linear/nearest/cubic)."""
    return _grid_sample(x, grid, mode, padding_mode, align_corners)


@op("AffineGrid", since=20, host_inputs={"size": "the output grid shape"})
def affine_grid(theta, size, *, align_corners=0):
    """ONNX AffineGrid-20: the sampling grid of affine matrices theta over a 2-D or 3-D size."""
    theta = jnp.asarray(theta)
    size = tuple(int(d) for d in np.asarray(size).reshape(-1))
    rank = len(size) - 2
    if rank not in (2, 3) or theta.shape[1:] != (rank, rank + 1) or theta.shape[0] != size[0]:
        raise ShapeError(
            f"AffineGrid: theta (N, 2, 3) goes with size (N, C, H, W) and (N, 3, 4) with (N, C, D, H, W); "
            f"got {theta.shape} and {size}"
        )
    dtype = accumulation_dtype(theta.dtype)
    axes = []
    for n in size[2:]:
        step = np.arange(n, dtype=np.float64)
        if align_corners:
            axes.append(step * 2 / (n - 1) - 1 if n > 1 else np.zeros(1))
        else:
            axes.append((step * 2 + 1) / n - 1)
    # Homogeneous positions (x, y[, z], 1) with x running over the innermost axis.
    mesh = list(np.meshgrid(*axes, indexing="ij"))[::-1]
    base = np.stack(mesh + [np.ones_like(mesh[0])], axis=-1).reshape(-1, rank + 1)
    grid = jnp.einsum("pk,nrk->npr", jnp.asarray(base.astype(dtype)), theta.astype(dtype))
    return grid.reshape((size[0],) + size[2:] + (rank,)).astype(theta.dtype)
