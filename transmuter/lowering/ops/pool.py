"""Pooling: MaxPool (with Indices), AveragePool, LpPool, their Global forms, and MaxUnpool.

Windows are `lax.reduce_window` over the spatial axes. The output length follows ONNX:
floor or ceil ((in + pads - dilated kernel) / stride) + 1, where with ceil_mode a window that
would start in the end padding is dropped; the extra end padding ceil_mode needs is never
counted as data or as padding.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op, variant
from transmuter.lowering.shared import same_pads, spatial_attrs


class _Windows:
    """The window geometry of one pooling node over the trailing spatial axes of X."""

    def __init__(self, op_type, x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
        rank = x.ndim - 2
        if rank < 1:
            raise ShapeError(f"{op_type}: X must be (N, C, D1, ...), got shape {x.shape}")
        if kernel_shape is None or len(kernel_shape) != rank:
            raise ShapeError(f"{op_type}: kernel_shape must give {rank} sizes, got {kernel_shape}")
        self.kernel = tuple(kernel_shape)
        self.strides, self.dilations, explicit = spatial_attrs(
            op_type, rank, strides, dilations, pads, auto_pad
        )
        sizes = x.shape[2:]
        span = tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations, strict=True))
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            explicit = tuple(
                same_pads(n, w, s, auto_pad == "SAME_UPPER")
                for n, w, s in zip(sizes, span, self.strides, strict=True)
            )
        elif auto_pad == "VALID":
            explicit = ((0, 0),) * rank
        self.explicit = explicit
        self.extra = []  # end padding beyond `explicit` that ceil_mode needs
        for n, w, s, (lo, hi) in zip(sizes, span, self.strides, explicit, strict=True):
            room = n + lo + hi - w
            out = (-(-room // s) if ceil_mode else room // s) + 1
            if ceil_mode and (out - 1) * s >= n + lo:
                out -= 1
            # max_dim: the window count may be a jax.export symbolic dim (exporting).
            self.extra.append(jax.core.max_dim((out - 1) * s + w - (n + lo + hi), 0))

    def padding(self):
        """(lo, hi) per spatial axis: the explicit pads plus ceil_mode's extra end padding."""
        return tuple((lo, hi + e) for (lo, hi), e in zip(self.explicit, self.extra, strict=True))

    def reduce(self, x, init, computation, padding=None):
        # init must be a numpy scalar: a jnp one is a tracer under jit, and JAX then picks a
        # generic window reduction instead of its max/add ones, which have gradients.
        if padding is None:
            padding = self.padding()
        return lax.reduce_window(
            x,
            init,
            computation,
            window_dimensions=(1, 1) + self.kernel,
            window_strides=(1, 1) + self.strides,
            padding=((0, 0), (0, 0)) + tuple(padding),
            window_dilation=(1, 1) + self.dilations,
        )

    def counts(self, spatial, include_pad: bool, dtype):
        """How many elements each window averages: data only, or data and explicit pads."""
        ones = jnp.ones((1, 1) + tuple(spatial), dtype)
        zero = np.array(0, dtype)
        if not include_pad:
            return self.reduce(ones, zero, lax.add)
        ones = jnp.pad(ones, ((0, 0), (0, 0)) + self.explicit, constant_values=1)
        return self.reduce(ones, zero, lax.add, padding=tuple((0, e) for e in self.extra))


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind == "f" or dtype == jnp.bfloat16 else np.iinfo(dtype).min


def _max_by_taps(x, init, windows):
    """The max over dilated windows as the max of one strided slice of the padded input per
    kernel tap: JAX has no reverse-mode rule for a dilated max reduce_window."""
    return _by_taps(x, init, windows, lax.max)


def ordered_window_sums(op_type, x, count_include_pad, **geometry):
    """(sums, counts) of AveragePool's windows, each sum added one kernel tap at a time in
    row-major tap order, as a direct loop over the window adds them (ONNX Runtime's
    QLinearAveragePool kernel); reduce_window's order differs, and float sums depend on it."""
    x = jnp.asarray(x)
    windows = _Windows(op_type, x, **geometry)
    total = _by_taps(x, np.array(0, x.dtype), windows, lax.add)
    return total, windows.counts(x.shape[2:], bool(count_include_pad), x.dtype)


def _by_taps(x, init, windows, combine):
    padded = lax.pad(
        x, init, ((0, 0, 0), (0, 0, 0)) + tuple((lo, hi, 0) for lo, hi in windows.padding())
    )
    n, c, *sizes = padded.shape
    # The window count reduce_window gives for this padding, so both paths agree exactly.
    outs = [
        max((size - (k - 1) * d - 1) // s + 1, 0)
        for size, k, s, d in zip(
            sizes, windows.kernel, windows.strides, windows.dilations, strict=True
        )
    ]
    if 0 in outs:
        return jnp.zeros((n, c, *outs), x.dtype)
    y = None
    for tap in itertools.product(*(range(k) for k in windows.kernel)):
        start = [t * d for t, d in zip(tap, windows.dilations, strict=True)]
        limit = [b + (o - 1) * s + 1 for b, o, s in zip(start, outs, windows.strides, strict=True)]
        window = lax.slice(padded, (0, 0, *start), (n, c, *limit), (1, 1, *windows.strides))
        y = window if y is None else combine(y, window)
    return y


def _max_pool(x, indices: bool, storage_order: int, **geometry):
    x = jnp.asarray(x)
    windows = _Windows("MaxPool", x, **geometry)
    init = np.array(_lowest(x.dtype), x.dtype)
    if any(d != 1 for d in windows.dilations):
        y = _max_by_taps(x, init, windows)
    else:
        y = windows.reduce(x, init, lax.max)
    if not indices:
        return y
    spatial = x.shape[2:]
    size = math.prod(spatial)
    flat = jnp.broadcast_to(jnp.arange(size, dtype=jnp.int64).reshape(spatial), x.shape)

    def pick(a, b):
        # The larger value; among equal values the first in row-major scan order, as ORT does.
        take_b = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
        return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

    # JAX cannot differentiate a (value, index) reduction: Y comes from the max alone above,
    # and the indices, which have no gradient, from the pair reduction of a constant X.
    _, row_major = windows.reduce(
        (lax.stop_gradient(x), flat), (init, np.array(np.iinfo(np.int64).max)), pick
    )
    if storage_order == 1:
        coords = jnp.unravel_index(row_major, spatial)
        steps = np.cumprod((1,) + spatial[:-1])
        within = sum(c * int(s) for c, s in zip(coords, steps, strict=True))
    elif storage_order == 0:
        within = row_major
    else:
        raise ValueError(f"MaxPool: storage_order must be 0 or 1, got {storage_order}")
    planes = jnp.arange(x.shape[0] * x.shape[1], dtype=jnp.int64).reshape(
        x.shape[:2] + (1,) * len(spatial)
    )
    return y, within + planes * size


@op("MaxPool", since=1)
def max_pool_v1(x, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """ONNX MaxPool-1: max over windows."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=None, pads=pads)
    return _max_pool(x, False, 0, auto_pad=auto_pad, ceil_mode=0, **geometry)


@op("MaxPool", since=8, context=True)
def max_pool_v8(
    ctx, x, *, auto_pad="NOTSET", kernel_shape, pads=None, storage_order=0, strides=None
):
    """ONNX MaxPool-8: max over windows, with optional flat Indices."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=None, pads=pads)
    return _max_pool(x, ctx.wants(1), storage_order, auto_pad=auto_pad, ceil_mode=0, **geometry)


@op("MaxPool", since=(10, 11, 12, 22), context=True)
def max_pool_v10(
    ctx,
    x,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    kernel_shape,
    pads=None,
    storage_order=0,
    strides=None,
):
    """ONNX MaxPool-10..22: max over dilated windows, ceil_mode, optional flat Indices."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=dilations, pads=pads)
    return _max_pool(
        x, ctx.wants(1), storage_order, auto_pad=auto_pad, ceil_mode=ceil_mode, **geometry
    )


def _average_pool(x, count_include_pad, **geometry):
    x = jnp.asarray(x)
    windows = _Windows("AveragePool", x, **geometry)
    dtype = accumulation_dtype(x.dtype)
    total = windows.reduce(x.astype(dtype), np.array(0, dtype), lax.add)
    counts = windows.counts(x.shape[2:], bool(count_include_pad), dtype)
    return (total / counts).astype(x.dtype)


@op("AveragePool", since=1)
def average_pool_v1(x, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """ONNX AveragePool-1: mean over windows, padding excluded."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=None, pads=pads)
    return _average_pool(x, 0, auto_pad=auto_pad, ceil_mode=0, **geometry)


@op("AveragePool", since=7)
def average_pool_v7(
    x, *, auto_pad="NOTSET", count_include_pad=0, kernel_shape, pads=None, strides=None
):
    """ONNX AveragePool-7: mean over windows, padding optionally counted."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=None, pads=pads)
    return _average_pool(x, count_include_pad, auto_pad=auto_pad, ceil_mode=0, **geometry)


@op("AveragePool", since=(10, 11))
def average_pool_v10(
    x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape, pads=None, strides=None
):
    """ONNX AveragePool-10..11: mean over windows with ceil_mode."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=None, pads=pads)
    return _average_pool(x, count_include_pad, auto_pad=auto_pad, ceil_mode=ceil_mode, **geometry)


@op("AveragePool", since=(19, 22))
def average_pool_v19(
    x,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    kernel_shape,
    pads=None,
    strides=None,
):
    """ONNX AveragePool-19..22: mean over dilated windows with ceil_mode."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=dilations, pads=pads)
    return _average_pool(x, count_include_pad, auto_pad=auto_pad, ceil_mode=ceil_mode, **geometry)


def _lp(x, p, reduce):
    """(sum |x|^p)^(1/p) with `reduce` doing the sum, in float32 for half precision."""
    x = jnp.asarray(x)
    dtype = accumulation_dtype(x.dtype)
    magnitude = jnp.abs(x.astype(dtype))
    if p == 1:
        return reduce(magnitude, dtype).astype(x.dtype)
    if p == 2:
        return jnp.sqrt(reduce(magnitude * magnitude, dtype)).astype(x.dtype)
    p = jnp.array(p, dtype)
    return (reduce(magnitude**p, dtype) ** (1 / p)).astype(x.dtype)


def _lp_pool(x, p, **geometry):
    windows = _Windows("LpPool", jnp.asarray(x), **geometry)
    return _lp(x, p, lambda v, dtype: windows.reduce(v, np.array(0, dtype), lax.add))


@op("LpPool", since=1)
def lp_pool_v1(x, *, auto_pad="NOTSET", kernel_shape=None, p=2.0, pads=None, strides=None):
    """ONNX LpPool-1: Lp norm over windows, float p."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=None, pads=pads)
    return _lp_pool(x, p, auto_pad=auto_pad, ceil_mode=0, **geometry)


@op("LpPool", since=(2, 11))
def lp_pool_v2(x, *, auto_pad="NOTSET", kernel_shape, p=2, pads=None, strides=None):
    """ONNX LpPool-2..11: Lp norm over windows."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=None, pads=pads)
    return _lp_pool(x, p, auto_pad=auto_pad, ceil_mode=0, **geometry)


@op("LpPool", since=(18, 22))
def lp_pool_v18(
    x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, p=2, pads=None, strides=None
):
    """ONNX LpPool-18..22: Lp norm over dilated windows with ceil_mode."""
    geometry = dict(kernel_shape=kernel_shape, strides=strides, dilations=dilations, pads=pads)
    return _lp_pool(x, p, auto_pad=auto_pad, ceil_mode=ceil_mode, **geometry)


def _spatial_axes(op_type, x) -> tuple[int, ...]:
    if x.ndim < 3:
        raise ShapeError(f"{op_type}: X must be (N, C, D1, ...), got shape {x.shape}")
    return tuple(range(2, x.ndim))


@op("GlobalAveragePool", since=(1, 22))
def global_average_pool(x):
    """ONNX GlobalAveragePool-1..22: mean over all spatial axes, kept as size 1."""
    x = jnp.asarray(x)
    axes = _spatial_axes("GlobalAveragePool", x)
    return jnp.mean(x, axis=axes, keepdims=True, dtype=accumulation_dtype(x.dtype)).astype(x.dtype)


@op("GlobalMaxPool", since=(1, 22))
def global_max_pool(x):
    """ONNX GlobalMaxPool-1..22: max over all spatial axes, kept as size 1."""
    x = jnp.asarray(x)
    return jnp.max(x, axis=_spatial_axes("GlobalMaxPool", x), keepdims=True)


def _global_lp_pool(x, p):
    x = jnp.asarray(x)
    axes = _spatial_axes("GlobalLpPool", x)
    return _lp(x, p, lambda v, dtype: jnp.sum(v, axis=axes, keepdims=True, dtype=dtype))


@op("GlobalLpPool", since=(2, 22))
def global_lp_pool_v2(x, *, p=2):
    """ONNX GlobalLpPool-2..22: Lp norm over all spatial axes."""
    return _global_lp_pool(x, p)


global_lp_pool_v1 = op("GlobalLpPool", since=1)(variant(
    global_lp_pool_v2, "global_lp_pool_v1", "ONNX GlobalLpPool-1: as GlobalLpPool-2, float p.",
    defaults={"p": 2.0},
))  # fmt: skip


@op("MaxUnpool", since=(9, 11, 22), host_inputs={"output_shape": "the output shape"})
def max_unpool(x, i, output_shape=None, *, kernel_shape, pads=None, strides=None):
    """ONNX MaxUnpool-9..22: scatter X into zeros at MaxPool's flat Indices."""
    x, i = jnp.asarray(x), jnp.asarray(i)
    rank = x.ndim - 2
    if rank < 1 or i.shape != x.shape:
        raise ShapeError(
            f"MaxUnpool: X (N, C, D1, ...) and I must have one shape, got {x.shape} and {i.shape}"
        )
    if kernel_shape is None or len(kernel_shape) != rank:
        raise ShapeError(f"MaxUnpool: kernel_shape must give {rank} sizes, got {kernel_shape}")
    strides, _, pad_pairs = spatial_attrs("MaxUnpool", rank, strides, None, pads, "NOTSET")
    grid = x.shape[:2] + tuple(
        (n - 1) * s + k - lo - hi
        for n, s, k, (lo, hi) in zip(x.shape[2:], strides, kernel_shape, pad_pairs, strict=True)
    )
    out = jnp.zeros((math.prod(grid),), x.dtype)
    out = out.at[i.reshape(-1)].set(x.reshape(-1), mode="drop").reshape(grid)
    if output_shape is None:
        return out
    shape = tuple(int(d) for d in np.asarray(output_shape).reshape(-1))
    if len(shape) != x.ndim:
        raise ShapeError(f"MaxUnpool: output_shape must have {x.ndim} values, got {shape}")
    if any(want < have for want, have in zip(shape, grid, strict=True)):
        raise ShapeError(
            f"MaxUnpool: output_shape {list(shape)} is smaller than the unpooled shape "
            f"{list(grid)} that kernel_shape, strides and pads give"
        )
    # As the spec's example (test_maxunpool_export_with_output_shape) and onnx.reference do, the
    # indices address the grid that kernel_shape, strides and pads give, and output_shape adds
    # zeros at the end of each axis. ONNX Runtime reads the indices in output_shape's own
    # row-major layout instead; the two agree when output_shape equals that grid.
    return jnp.pad(out, [(0, want - have) for want, have in zip(shape, grid, strict=True)])
