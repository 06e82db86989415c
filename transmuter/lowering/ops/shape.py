"""Shape and data-movement operators: Shape, Reshape, Slice, Concat, Pad, Constant, Range, ...

Values that decide shapes (Reshape's shape, Slice's bounds, Pad's pads, ...) arrive as numpy
arrays (`host_inputs`). Shape and Size always return numpy, and Constant returns its value as
numpy, so shape arithmetic built from them stays known on the host while tracing. String tensors
are numpy object arrays; the ops that only move data handle them with numpy (`array_module`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax.export import is_symbolic_dim

from transmuter import dtypes
from transmuter.errors import ShapeError
from transmuter.lowering import Attribute, op, variant
from transmuter.lowering.shared import (
    array_module,
    check_size,
    host_ints,
    host_module,
    host_scalar,
    normalize_axis,
)
from transmuter.lowering.symbolic import dim_max, dim_min, dims_array

_LATEST = (21, 23, 24, 25)  # since-versions that only added element types


def _axis_slice(rank: int, axis: int, part: slice) -> tuple:
    return (slice(None),) * axis + (part,) + (slice(None),) * (rank - axis - 1)


# ---------------------------------------------------------------------------- shapes on the host


@op("Shape", since=(1, 13), reads_shape=True, symbolic=True)
def shape_v1(data):
    """ONNX Shape-1..13: the input's shape as a host int64 vector."""
    return dims_array(data.shape)


@op("Shape", since=(15, 19, *_LATEST), reads_shape=True, symbolic=True)
def shape_v15(data, *, end=None, start=0):
    """ONNX Shape-15..25: dims [start, end) of the input's shape, clamped, as host int64."""
    rank = len(data.shape)
    begin = min(max(start + rank if start < 0 else start, 0), rank)
    stop = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return dims_array(data.shape[begin:stop])


@op("Size", since=(1, 13, 19, *_LATEST), reads_shape=True, symbolic=True)
def size(data):
    """ONNX Size-1..25: the number of elements as a host int64 scalar."""
    return dims_array([math.prod(data.shape)]).reshape(())


# ------------------------------------------------------------------------------- reshaping


def _reshape(data, shape, allowzero: int):
    dims = host_ints(shape)
    if allowzero and 0 in dims and -1 in dims:
        raise ShapeError(
            f"Reshape shape {dims} has both 0 and -1 with allowzero=1: the -1 is ambiguous"
        )
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise ShapeError(
            f"Reshape shape {dims} may hold at most one -1 and no other negative values"
        )
    target = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= data.ndim:
                raise ShapeError(
                    f"Reshape shape {dims} copies dim {i} (0) of a rank-{data.ndim} input"
                )
            target.append(data.shape[i])
        else:
            target.append(d)
    total = math.prod(data.shape)
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        if known == 0 or total % known:
            raise ShapeError(
                f"Reshape cannot infer the -1 in {dims} for an input of shape {list(data.shape)}"
            )
        target[target.index(-1)] = total // known
    elif math.prod(target) != total:
        raise ShapeError(
            f"Reshape shape {dims} has {math.prod(target)} elements; the input {list(data.shape)} has {total}"
        )
    return host_module(data).reshape(data, target)


@op("Reshape", since=1, symbolic=True)
def reshape_v1(data, *, consumed_inputs=None, shape=None):
    """ONNX Reshape-1: reshape to the `shape` attribute (0 copies a dim, -1 is inferred)."""
    return _reshape(data, shape if shape is not None else (), allowzero=0)


@op("Reshape", since=(14, 19, *_LATEST), host_inputs={"shape": "the target shape"}, symbolic=True)
def reshape_v14(data, shape, *, allowzero=0):
    """ONNX Reshape-14..25: reshape; with allowzero=1 a 0 in `shape` is a zero-size dim."""
    return _reshape(data, shape, allowzero)


reshape_v5 = op("Reshape", since=(5, 13), host_inputs={"shape": "the target shape"}, symbolic=True)(
    variant(
        reshape_v14, "reshape_v5",
        "ONNX Reshape-5..13: reshape to the `shape` input (0 copies a dim, -1 is inferred).",
        fixed={"allowzero": 0},
    )
)  # fmt: skip


@op("Flatten", since=(1, 9, 11, 13, *_LATEST), symbolic=True)
def flatten(input, *, axis=1):
    """ONNX Flatten-1..25: 2-D view (prod(dims[:axis]), prod(dims[axis:]))."""
    rank = input.ndim
    if not -rank <= axis <= rank:
        raise ShapeError(
            f"Flatten axis {axis} is out of range for rank {rank} (expected [{-rank}, {rank}])"
        )
    axis = axis + rank if axis < 0 else axis
    shape = (math.prod(input.shape[:axis]), math.prod(input.shape[axis:]))
    return host_module(input).reshape(input, shape)


def _squeeze(data, axes):
    if axes is None:
        drop = {i for i, d in enumerate(data.shape) if d == 1}
    else:
        drop = {normalize_axis(a, data.ndim, "Squeeze axis") for a in axes}
        wide = [a for a in sorted(drop) if data.shape[a] != 1]
        if wide:
            raise ShapeError(
                f"Squeeze axes {wide} of input shape {list(data.shape)} are not of size 1"
            )
    shape = [d for i, d in enumerate(data.shape) if i not in drop]
    return host_module(data).reshape(data, shape)


@op("Squeeze", since=(13, *_LATEST), host_inputs={"axes": "the axes to drop"}, symbolic=True)
def squeeze_v13(data, axes=None):
    """ONNX Squeeze-13..25: drop the size-1 dims in the `axes` input (all if absent)."""
    return _squeeze(data, None if axes is None else host_ints(axes))


squeeze_v1 = op("Squeeze", since=(1, 11), symbolic=True)(variant(
    squeeze_v13, "squeeze_v1",
    "ONNX Squeeze-1..11: drop the size-1 dims in the `axes` attribute (all if absent).",
    attributes={"axes": Attribute("axes", None, np.int64)},
))  # fmt: skip


def _unsqueeze(data, axes):
    rank = data.ndim + len(axes)
    inserted = [normalize_axis(a, rank, "Unsqueeze axis") for a in axes]
    if len(set(inserted)) != len(inserted):
        raise ShapeError(f"Unsqueeze axes {list(axes)} repeat an axis")
    dims = iter(data.shape)
    shape = [1 if i in inserted else next(dims) for i in range(rank)]
    return host_module(data).reshape(data, shape)


@op("Unsqueeze", since=(13, *_LATEST), host_inputs={"axes": "the axes to insert"}, symbolic=True)
def unsqueeze_v13(data, axes):
    """ONNX Unsqueeze-13..25: insert size-1 dims at the `axes` input (output positions)."""
    return _unsqueeze(data, host_ints(axes))


unsqueeze_v1 = op("Unsqueeze", since=(1, 11), symbolic=True)(variant(
    unsqueeze_v13, "unsqueeze_v1",
    "ONNX Unsqueeze-1..11: insert size-1 dims at the `axes` attribute (output positions).",
    attributes={"axes": Attribute("axes", dtype=np.int64)},
))  # fmt: skip


@op("Transpose", since=(1, 13, *_LATEST), symbolic=True)
def transpose(data, *, perm=None):
    """ONNX Transpose-1..25: permute dims by `perm` (reversed when absent)."""
    perm = tuple(reversed(range(data.ndim))) if perm is None else tuple(perm)
    if sorted(perm) != list(range(data.ndim)):
        raise ShapeError(
            f"Transpose perm {list(perm)} is not a permutation of the {data.ndim} input dims"
        )
    return host_module(data).transpose(data, perm)


def _depth_to_space(x, blocksize: int, mode: str):
    if x.ndim != 4:
        raise ShapeError(
            f"DepthToSpace expects a 4-D [N, C, H, W] input; got shape {list(x.shape)}"
        )
    b, c, h, w = x.shape
    bs = blocksize
    if c % (bs * bs):
        raise ShapeError(f"DepthToSpace: channels {c} are not divisible by blocksize^2 = {bs * bs}")
    xp = array_module(x)
    if mode == "DCR":
        x = xp.transpose(xp.reshape(x, (b, bs, bs, c // (bs * bs), h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        x = xp.transpose(xp.reshape(x, (b, c // (bs * bs), bs, bs, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise ValueError(f"DepthToSpace mode {mode!r} is not supported; expected 'DCR' or 'CRD'")
    return xp.reshape(x, (b, c // (bs * bs), h * bs, w * bs))


@op("DepthToSpace", since=(11, 13, 28))
def depth_to_space_v11(input, *, blocksize, mode="DCR"):
    """ONNX DepthToSpace-11..28: move depth into spatial blocks in DCR or CRD order."""
    return _depth_to_space(input, blocksize, mode)


depth_to_space_v1 = op("DepthToSpace", since=1)(variant(
    depth_to_space_v11, "depth_to_space_v1",
    "ONNX DepthToSpace-1: move depth into spatial blocks (DCR order).", fixed={"mode": "DCR"},
))  # fmt: skip


def _space_to_depth(x, blocksize: int, mode: str):
    if x.ndim != 4:
        raise ShapeError(
            f"SpaceToDepth expects a 4-D [N, C, H, W] input; got shape {list(x.shape)}"
        )
    b, c, h, w = x.shape
    bs = blocksize
    if h % bs or w % bs:
        raise ShapeError(f"SpaceToDepth: spatial dims {h}x{w} are not divisible by blocksize {bs}")
    perms = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}
    if mode not in perms:
        raise ValueError(f"SpaceToDepth mode {mode!r} is not supported; expected 'DCR' or 'CRD'")
    xp = array_module(x)
    x = xp.transpose(xp.reshape(x, (b, c, h // bs, bs, w // bs, bs)), perms[mode])
    return xp.reshape(x, (b, c * bs * bs, h // bs, w // bs))


@op("SpaceToDepth", since=(1, 13))
def space_to_depth_v1(input, *, blocksize):
    """ONNX SpaceToDepth-1..13: move spatial blocks into depth (DCR order)."""
    return _space_to_depth(input, blocksize, "DCR")


@op("SpaceToDepth", since=28)
def space_to_depth_v28(input, *, blocksize, mode="DCR"):
    """ONNX SpaceToDepth-28: move spatial blocks into depth in DCR or CRD order."""
    return _space_to_depth(input, blocksize, mode)


# ------------------------------------------------------------------------ joining and splitting


def _concat(inputs, axis: int):
    if not inputs:
        raise ShapeError("Concat needs at least one input")
    first = inputs[0]
    axis = normalize_axis(axis, first.ndim, "Concat axis")
    for i, x in enumerate(inputs):
        if x.ndim != first.ndim or any(
            a != b for d, (a, b) in enumerate(zip(x.shape, first.shape, strict=True)) if d != axis
        ):
            raise ShapeError(
                f"Concat input {i} has shape {list(x.shape)}; it must match input 0 "
                f"{list(first.shape)} in every dim but axis {axis}"
            )
    return host_module(*inputs).concatenate(inputs, axis=axis)


@op("Concat", since=1, symbolic=True)
def concat_v1(*inputs, axis=None):
    """ONNX Concat-1: join along `axis` (1 when absent, as the spec's text says)."""
    return _concat(inputs, 1 if axis is None else axis)


@op("Concat", since=(4, 11, 13), symbolic=True)
def concat(*inputs, axis):
    """ONNX Concat-4..13: join the inputs along `axis`."""
    return _concat(inputs, axis)


def _split(input, axis: int, sizes, count: int):
    axis = normalize_axis(axis, input.ndim, "Split axis")
    dim = input.shape[axis]
    if sizes is None:
        if dim % count:
            raise ShapeError(
                f"Split: axis {axis} of size {dim} cannot be split into {count} equal outputs; "
                "give the split sizes"
            )
        sizes = [dim // count] * count
    sizes = [int(s) for s in sizes]
    if len(sizes) != count or any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise ShapeError(
            f"Split sizes {sizes} must be {count} non-negative values summing to the size {dim} of axis {axis}"
        )
    starts = np.cumsum([0, *sizes])
    return tuple(
        input[_axis_slice(input.ndim, axis, slice(int(a), int(b)))]
        for a, b in zip(starts[:-1], starts[1:], strict=True)
    )


# Split-1 has an input and an attribute both named `split`: the input is positional-only here.
@op("Split", since=1, host_inputs={"split_input": "the output sizes"}, context=True)
def split_v1(ctx, input, split_input=None, /, *, axis=None, split=None):
    """ONNX Split-1: split along `axis` (0 when absent) by the split input or attribute."""
    sizes = host_ints(split_input) if split_input is not None else split
    return _split(input, 0 if axis is None else axis, sizes, ctx.num_outputs)


@op("Split", since=(2, 11), context=True)
def split_v2(ctx, input, *, axis=0, split=None):
    """ONNX Split-2..11: split along `axis` by the `split` attribute, or into equal parts."""
    return _split(input, axis, split, ctx.num_outputs)


@op("Split", since=13, host_inputs={"split": "the output sizes"}, context=True)
def split_v13(ctx, input, split=None, *, axis=0):
    """ONNX Split-13: split along `axis` by the `split` input, or into equal parts."""
    return _split(input, axis, None if split is None else host_ints(split), ctx.num_outputs)


@op("Split", since=18, host_inputs={"split": "the output sizes"}, context=True)
def split_v18(ctx, input, split=None, *, axis=0, num_outputs=None):
    """ONNX Split-18: split by the `split` input, or into `num_outputs` parts (last one smaller)."""
    if split is not None and num_outputs is not None:
        raise ShapeError("Split-18 takes either the 'split' input or 'num_outputs', not both")
    if split is not None:
        return _split(input, axis, host_ints(split), ctx.num_outputs)
    if num_outputs is None:
        return _split(input, axis, None, ctx.num_outputs)
    if num_outputs != ctx.num_outputs:
        raise ShapeError(
            f"Split num_outputs={num_outputs} but the node lists {ctx.num_outputs} outputs"
        )
    dim = input.shape[normalize_axis(axis, input.ndim, "Split axis")]
    chunk = -(-dim // num_outputs)
    last = dim - chunk * (num_outputs - 1)
    if last < 0:
        raise ShapeError(
            f"Split: axis of size {dim} cannot be cut into {num_outputs} chunks of {chunk}"
        )
    return _split(input, axis, [chunk] * (num_outputs - 1) + [last], num_outputs)


# --------------------------------------------------------------------------- slicing and tiling


def _slice(data, starts, ends, axes, steps):
    starts, ends = host_ints(starts), host_ints(ends)
    axes = list(range(len(starts))) if axes is None else host_ints(axes)
    steps = [1] * len(starts) if steps is None else host_ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ShapeError(
            f"Slice starts {starts}, ends {ends}, axes {axes} and steps {steps} must have equal lengths"
        )
    index = [slice(None)] * data.ndim
    seen = set()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = normalize_axis(axis, data.ndim, "Slice axis")
        if axis in seen or step == 0:
            raise ShapeError(
                f"Slice axes {axes} repeat axis {axis}" if step else "Slice steps must not be 0"
            )
        seen.add(axis)
        dim = data.shape[axis]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            index[axis] = slice(
                dim_min(dim_max(start, 0), dim), dim_min(dim_max(end, 0), dim), step
            )
        else:  # backwards: start in [0, dim-1], end in [-1, dim-1] where -1 means "past the front"
            end = dim_min(dim_max(end, -1), dim - 1)
            index[axis] = slice(dim_min(dim_max(start, 0), dim - 1), None if end < 0 else end, step)
    if isinstance(data, np.ndarray) and data.dtype != object and _has_symbolic(index):
        data = jnp.asarray(data)  # a host constant sliced to a symbolic length: numpy cannot
    return data[tuple(index)]


def _has_symbolic(index: list) -> bool:
    return any(is_symbolic_dim(bound) for part in index for bound in (part.start, part.stop))


@op("Slice", since=1, symbolic=True)
def slice_v1(data, *, ends, starts, axes=None):
    """ONNX Slice-1: slice by the starts/ends/axes attributes (negative counts from the end)."""
    return _slice(data, starts, ends, axes, None)


@op(
    "Slice",
    since=(10, 11, 13),
    host_inputs={
        "starts": "slice bounds",
        "ends": "slice bounds",
        "axes": "slice axes",
        "steps": "slice steps",
    },
    symbolic=True,
)
def slice_v10(data, starts, ends, axes=None, steps=None):
    """ONNX Slice-10..13: numpy-style slicing with clamped bounds and negative steps."""
    return _slice(data, starts, ends, axes, steps)


@op("Expand", since=(8, 13), host_inputs={"shape": "the target shape"}, symbolic=True)
def expand(input, shape):
    """ONNX Expand-8..13: broadcast `input` and `shape` against each other (numpy rules)."""
    target = host_ints(shape)
    rank = max(input.ndim, len(target))
    have = (1,) * (rank - input.ndim) + tuple(input.shape)
    want = (1,) * (rank - len(target)) + tuple(target)
    out = []
    for a, b in zip(have, want, strict=True):
        if a != b and a != 1 and b != 1:
            raise ShapeError(
                f"Expand: input shape {list(input.shape)} does not broadcast with {target}"
            )
        out.append(a if b == 1 else b)
    check_size("Expand's output", out, input.dtype)
    return host_module(input).broadcast_to(input, tuple(out))


def _tile(input, repeats):
    if len(repeats) != input.ndim or any(r < 0 for r in repeats):
        raise ShapeError(
            f"Tile repeats {repeats} must be {input.ndim} non-negative values (one per input dim)"
        )
    check_size("Tile's output", [d * r for d, r in zip(input.shape, repeats)], input.dtype)
    # Symbolic repeat counts (exporting with symbolic shapes) give a traced value.
    xp = jnp if any(map(is_symbolic_dim, repeats)) else host_module(input)
    return xp.tile(input, repeats)


@op(
    "Tile",
    since=1,
    host_inputs={"tiles": "the repeat count", "axis": "the axis to repeat"},
    symbolic=True,
)
def tile_v1(input, tiles, axis):
    """ONNX Tile-1: repeat the input `tiles` times along one `axis`."""
    repeats = [1] * input.ndim
    repeats[normalize_axis(int(host_scalar(axis, "Tile axis")), input.ndim, "Tile axis")] = int(
        host_scalar(tiles, "Tile tiles")
    )
    return _tile(input, repeats)


@op("Tile", since=(6, 13), host_inputs={"repeats": "the repeat counts"}, symbolic=True)
def tile(input, repeats):
    """ONNX Tile-6..13: numpy.tile with one repeat count per dim."""
    return _tile(input, host_ints(repeats))


def _pad(data, pads, value, axes, mode: str, modes: tuple[str, ...]):
    if mode not in modes:
        raise ValueError(
            f"Pad mode {mode!r} is not supported at this opset; expected one of {list(modes)}"
        )
    rank = data.ndim
    axes = (
        list(range(rank))
        if axes is None
        else [normalize_axis(a, rank, "Pad axis") for a in host_ints(axes)]
    )
    pads = host_ints(pads)
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"Pad pads {pads} must hold 2 values per padded axis ({len(axes)} axes)")
    width = [[0, 0] for _ in range(rank)]
    for i, axis in enumerate(axes):
        width[axis] = [pads[i], pads[i + len(axes)]]
    # Negative pads remove elements: crop first, then pad what is left.
    for d, (b, e) in enumerate(width):
        if max(-b, 0) + max(-e, 0) > data.shape[d]:
            raise ShapeError(
                f"Pad pads {pads} remove more than the {data.shape[d]} elements of axis {d}"
            )
    crop = tuple(slice(max(-b, 0), data.shape[d] - max(-e, 0)) for d, (b, e) in enumerate(width))
    data = data[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    if not any(b or e for b, e in width):
        return data
    check_size("Pad's output", [n + b + e for n, (b, e) in zip(data.shape, width)], data.dtype)
    xp = array_module(data)
    if mode != "constant":
        if any(data.shape[d] == 0 for d, (b, e) in enumerate(width) if b or e):
            raise ShapeError(
                f"Pad mode {mode!r} cannot pad an axis of size 0 (input {list(data.shape)})"
            )
        return xp.pad(data, width, mode=mode)
    if value is None or getattr(value, "size", 1) == 0:
        value = "" if xp is np else np.zeros((), data.dtype)
    elif getattr(value, "ndim", 0):
        value = xp.reshape(value, ())
    return xp.pad(data, width, mode="constant", constant_values=xp.asarray(value, dtype=data.dtype))


_PAD_MODES = ("constant", "reflect", "edge")


@op("Pad", since=1)
def pad_v1(data, *, paddings, mode="constant", value=0.0):
    """ONNX Pad-1: pad by the `paddings` attribute [x1_begin, x2_begin, ..., x1_end, ...]."""
    return _pad(data, paddings, value, None, mode, _PAD_MODES)


@op("Pad", since=2)
def pad_v2(data, *, pads, mode="constant", value=0.0):
    """ONNX Pad-2: pad (or crop, where negative) by the `pads` attribute."""
    return _pad(data, pads, value, None, mode, _PAD_MODES)


@op("Pad", since=18, host_inputs={"pads": "the pad widths", "axes": "the padded axes"})
def pad_v18(data, pads, constant_value=None, axes=None, *, mode="constant"):
    """ONNX Pad-18: Pad-13 restricted to the `axes` input."""
    return _pad(data, pads, constant_value, axes, mode, _PAD_MODES)


pad_v11 = op("Pad", since=(11, 13), host_inputs={"pads": "the pad widths"})(variant(
    pad_v18, "pad_v11",
    "ONNX Pad-11..13: pad by the `pads` input with constant, reflect or edge values.",
    fixed={"axes": None},
))  # fmt: skip


@op("Pad", since=(19, *_LATEST), host_inputs={"pads": "the pad widths", "axes": "the padded axes"})
def pad_v19(data, pads, constant_value=None, axes=None, *, mode="constant"):
    """ONNX Pad-19..25: Pad-18 plus the 'wrap' (torus) mode."""
    return _pad(data, pads, constant_value, axes, mode, (*_PAD_MODES, "wrap"))


# ------------------------------------------------------------------------- constants and ranges


@op(
    "ConstantOfShape",
    since=(9, 20, *_LATEST),
    host_inputs={"input": "the output shape"},
    symbolic=True,
)
def constant_of_shape(input, *, value=None):
    """ONNX ConstantOfShape-9..25: a tensor of the given shape filled with `value` (float32 0)."""
    shape = host_ints(input)
    if any(d < 0 for d in shape):
        raise ShapeError(f"ConstantOfShape shape {shape} has negative dims")
    fill = np.zeros((), np.float32) if value is None else np.asarray(value)
    if fill.size != 1:
        raise ShapeError(
            f"ConstantOfShape value must be a one-element tensor; got shape {list(fill.shape)}"
        )
    check_size("ConstantOfShape's output", shape, fill.dtype)
    xp = jnp if any(map(is_symbolic_dim, shape)) else np  # a symbolic shape: a traced value
    return xp.full(shape, fill.reshape(()), dtype=fill.dtype)


def _constant(**given):
    present = {k: v for k, v in given.items() if v is not None}
    if len(present) != 1:
        raise ValueError(
            f"Constant needs exactly one value attribute; got {sorted(present) or 'none'}"
        )
    ((name, value),) = present.items()
    if name in ("value_int", "value_ints"):
        return np.array(value, dtype=np.int64)
    if name in ("value_float", "value_floats"):
        return np.array(value, dtype=np.float32)
    if name in ("value_string", "value_strings"):
        return np.array(value if name == "value_string" else list(value), dtype=object)
    return np.asarray(value)  # value, or sparse_value (densified by the front end)


@op("Constant", since=(1, 9))
def constant_v1(*, value):
    """ONNX Constant-1..9: the `value` tensor, as a host value."""
    return _constant(value=value)


@op("Constant", since=11)
def constant_v11(*, sparse_value=None, value=None):
    """ONNX Constant-11: the `value` or `sparse_value` tensor, as a host value."""
    return _constant(sparse_value=sparse_value, value=value)


@op("Constant", since=(12, 13, 19, *_LATEST))
def constant_v12(
    *,
    sparse_value=None,
    value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
    value_string=None,
    value_strings=None,
):
    """ONNX Constant-12..25: a tensor from exactly one of value, sparse_value, value_*."""
    return _constant(
        sparse_value=sparse_value,
        value=value,
        value_float=value_float,
        value_floats=value_floats,
        value_int=value_int,
        value_ints=value_ints,
        value_string=value_string,
        value_strings=value_strings,
    )


@op("Identity", since=(1, 13, 14, 16, 19, *_LATEST), symbolic=True)
def identity(input):
    """ONNX Identity-1..25: the input itself (tensor, sequence or optional)."""
    return input


def _range(start, limit, delta, compute_dtype=None):
    dtype = np.asarray(start).dtype
    first, stop, step = (
        host_scalar(v, f"Range {n}")
        for v, n in ((start, "start"), (limit, "limit"), (delta, "delta"))
    )
    if step == 0:
        raise ValueError("Range delta must not be 0")
    if any(map(is_symbolic_dim, (first, stop, step))):
        # A symbolic length (exporting with symbolic shapes): the range is a traced value.
        count = dim_max(-((first - stop) // step), 0)
        out = dtype if np.issubdtype(dtype, np.integer) else np.dtype(np.int64)
        bounds = (jnp.asarray(v, dtype=out) for v in (first, step))
        return next(bounds) + jnp.arange(count, dtype=out) * next(bounds)
    if np.issubdtype(dtype, np.integer):
        first, stop, step = int(first), int(stop), int(step)
        count = max(-((first - stop) // step), 0)  # ceil((stop - first) / step), exactly
        return (first + np.arange(count, dtype=np.int64) * step).astype(dtype)
    work = np.dtype(compute_dtype or dtype)
    first, stop, step = (np.asarray(v, dtype=work) for v in (first, stop, step))
    count = max(math.ceil((float(stop) - float(first)) / float(step)), 0)
    return (first + np.arange(count, dtype=work) * step).astype(dtype)


@op(
    "Range",
    since=11,
    host_inputs={"start": "range bounds", "limit": "range bounds", "delta": "range bounds"},
    symbolic=True,
)
def range_v11(start, limit, delta):
    """ONNX Range-11: start + i*delta for i in [0, max(ceil((limit-start)/delta), 0))."""
    return _range(start, limit, delta)


_STASH_TYPES = {1: np.float32, 11: np.float64}


@op(
    "Range",
    since=27,
    host_inputs={"start": "range bounds", "limit": "range bounds", "delta": "range bounds"},
    symbolic=True,
)
def range_v27(start, limit, delta, *, stash_type=1):
    """ONNX Range-27: Range-11; float16/bfloat16 computed in the `stash_type` precision."""
    if np.asarray(start).dtype not in dtypes.HALF:
        return _range(start, limit, delta)
    if stash_type not in _STASH_TYPES:
        raise ValueError(
            f"Range stash_type {stash_type} is not supported; expected 1 (float) or 11 (double)"
        )
    return _range(start, limit, delta, _STASH_TYPES[stash_type])


@op("EyeLike", since=(9, 22))
def eye_like(input, *, dtype=None, k=0):
    """ONNX EyeLike-9..22: ones on diagonal `k` of a matrix shaped like the 2-D input."""
    if input.ndim != 2:
        raise ShapeError(f"EyeLike expects a 2-D input; got shape {list(input.shape)}")
    out = input.dtype if dtype is None else dtypes.from_onnx(dtype)
    return jnp.eye(input.shape[0], input.shape[1], k, dtype=out)


@op("Trilu", since=14, host_inputs={"k": "the diagonal offset"})
def trilu(input, k=None, *, upper=1):
    """ONNX Trilu-14: keep the upper (or lower) triangle of the last two dims from diagonal k."""
    if input.ndim < 2:
        raise ShapeError(f"Trilu expects an input of rank >= 2; got shape {list(input.shape)}")
    offset = 0 if k is None else int(host_scalar(k, "Trilu k"))
    return (jnp.triu if upper else jnp.tril)(input, offset)
