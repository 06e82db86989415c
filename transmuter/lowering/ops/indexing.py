"""Indexing operators: Gather*, Scatter*, OneHot, and the data-dependent NonZero, Compress, Unique.

Negative indices count from the end of their axis. Out-of-range indices are an error in ONNX;
when the indices are known on the host they are checked, on the device they cannot be: there a
gather clamps (after one wrap, so an index below -size reads row 0) and a scatter drops the
update, as XLA does. `_wrap` is the one wrap; the JAX calls after it are told not to wrap again
(jnp.take and indexing wrap negatives themselves, which read indices in [-2 size, -size - 1] as
valid rows). transmuter.compile(..., checks=True) raises for them instead (checkify).
NonZero, Compress and Unique have output shapes that depend on the data, so they run on the host
with numpy (`data_dependent=True`). ReverseSequence is a gather along its time axis.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.shared import (
    array_module,
    host_module,
    host_scalar,
    narrow_indices,
    normalize_axis,
)


def _wrap(xp, indices, size: int, what: str):
    """Negative indices made positive; host indices are checked against [-size, size). For JAX,
    as int32 (`narrow_indices`)."""
    if isinstance(indices, np.ndarray) and indices.size:
        low, high = int(indices.min()), int(indices.max())
        if low < -size or high >= size:
            raise ShapeError(
                f"{what} holds {low if low < -size else high}, outside [-{size}, {size - 1}]"
            )
    wrapped = xp.where(indices < 0, indices + size, indices)
    return wrapped if xp is np else narrow_indices(wrapped, size)


def _strings_need_host_indices(ctx, strings, indices, position: int = 1) -> None:
    """String tensors live on the host, so the indices into them (node input `position`) must be
    concrete: traced ones are a graph break, and the compiling runtime runs this node eagerly."""
    if array_module(strings) is np:
        ctx.host_value(position, indices, "indices into a string tensor")


# --------------------------------------------------------------------------------- gathering


@op("Gather", since=(1, 11, 13), context=True, strings_on_host=True, symbolic=True)
def gather(ctx, data, indices, *, axis=0):
    """ONNX Gather-1..13: take entries of `data` along `axis` at `indices` (rank q + r - 1)."""
    _strings_need_host_indices(ctx, data, indices)
    xp = host_module(data, indices)
    axis = normalize_axis(axis, data.ndim, "Gather axis")
    indices = _wrap(xp, indices, data.shape[axis], "Gather indices")
    if xp is np:
        return np.take(data, indices, axis=axis)
    # mode="clip" neither wraps negatives again nor fills NaN: out-of-range rows clamp.
    return jnp.take(data, indices, axis=axis, mode="clip")


@op("GatherElements", since=(11, 13), context=True, strings_on_host=True)
def gather_elements(ctx, data, indices, *, axis=0):
    """ONNX GatherElements-11..13: out[i][j] = data[indices[i][j]][j] (for axis 0), per element."""
    _strings_need_host_indices(ctx, data, indices)
    xp = host_module(data, indices)
    axis = normalize_axis(axis, data.ndim, "GatherElements axis")
    if indices.ndim != data.ndim or any(
        i > d for a, (i, d) in enumerate(zip(indices.shape, data.shape, strict=True)) if a != axis
    ):
        raise ShapeError(
            f"GatherElements indices {list(indices.shape)} must have the rank of data "
            f"{list(data.shape)} and no larger dims off axis {axis}"
        )
    # Off the axis, output position i reads data position i: drop the data rows no index reaches.
    data = data[
        tuple(slice(None) if a == axis else slice(0, n) for a, n in enumerate(indices.shape))
    ]
    indices = _wrap(xp, indices, data.shape[axis], "GatherElements indices")
    if xp is np:
        return np.take_along_axis(data, indices, axis=axis)
    return jnp.take_along_axis(data, indices, axis=axis, mode="clip", wrap_negative_indices=False)


def _gather_nd(data, indices, batch_dims: int):
    xp = array_module(data)
    b, k = batch_dims, indices.shape[-1] if indices.ndim else 0
    if indices.ndim < 1 or not 0 <= b < min(data.ndim, indices.ndim) or k > data.ndim - b:
        raise ShapeError(
            f"GatherND: indices {list(indices.shape)} with batch_dims {b} do not fit data {list(data.shape)}"
        )
    if tuple(data.shape[:b]) != tuple(indices.shape[:b]):
        raise ShapeError(
            f"GatherND batch dims of data {list(data.shape)} and indices {list(indices.shape)} differ"
        )
    batch = math.prod(data.shape[:b])
    count = math.prod(indices.shape[b:-1])
    flat_data = xp.reshape(data, (batch, *data.shape[b:]))
    flat_indices = xp.reshape(indices, (batch, count, k))
    columns = [
        _wrap(xp, flat_indices[..., j], data.shape[b + j], f"GatherND indices[..., {j}]")
        for j in range(k)
    ]
    rows = xp.broadcast_to(
        xp.reshape(xp.arange(batch, dtype=columns[0].dtype if k else np.int32), (batch, 1)),
        (batch, count),
    )
    index = (rows, *columns)
    if xp is np:
        out = flat_data[index]
    else:
        out = jnp.asarray(flat_data).at[index].get(mode="clip", wrap_negative_indices=False)
    return xp.reshape(out, (*indices.shape[:-1], *data.shape[b + k :]))


@op("GatherND", since=11, context=True, strings_on_host=True)
def gather_nd_v11(ctx, data, indices):
    """ONNX GatherND-11: gather slices of `data` addressed by the last dim of `indices`."""
    _strings_need_host_indices(ctx, data, indices)
    return _gather_nd(data, indices, 0)


@op("GatherND", since=(12, 13), context=True, strings_on_host=True)
def gather_nd(ctx, data, indices, *, batch_dims=0):
    """ONNX GatherND-12..13: GatherND with `batch_dims` leading dims shared by data and indices."""
    _strings_need_host_indices(ctx, data, indices)
    return _gather_nd(data, indices, batch_dims)


# ---------------------------------------------------------------------------------- scattering


def _update(data, index: tuple, updates, reduction: str, reductions: tuple[str, ...], unique: bool):
    """A copy of `data` with `updates` written (or reduced) at `index`; `unique` says that no
    two updates address one element."""
    if reduction not in reductions:
        raise ValueError(
            f"reduction {reduction!r} is not supported at this opset; expected one of {list(reductions)}"
        )
    if array_module(data) is np:  # strings live on the host: write them with numpy
        if reduction != "none":
            raise ValueError(f"reduction {reduction!r} does not apply to string tensors")
        out = data.copy()
        out[index] = updates
        return out
    ref = jnp.asarray(data).at[index]
    # The indices are wrapped once already (`_wrap`); out-of-range updates are dropped.
    once = {"mode": "drop", "wrap_negative_indices": False}
    if reduction == "mul":
        # JAX differentiates a scatter-multiply only when told its indices are unique.
        return ref.multiply(updates, unique_indices=unique, **once)
    apply = {"none": ref.set, "add": ref.add, "max": ref.max, "min": ref.min}
    return apply[reduction](updates, **once)


def _host_wrapped(indices, sizes):
    """Host indices (the last axis running over `sizes`) with negatives made positive, or None
    when the indices are traced or a size is symbolic."""
    if not isinstance(indices, np.ndarray) or not all(isinstance(n, int) for n in sizes):
        return None
    sizes = np.array(sizes, indices.dtype)
    return np.where(indices < 0, indices + sizes, indices)


def _unique_along(indices, axis: int, size) -> bool:
    """Whether host ScatterElements indices address distinct elements: two can only collide
    within one fiber along `axis`."""
    wrapped = _host_wrapped(indices[..., None], (size,))
    if wrapped is None:
        return False
    return bool(np.all(np.diff(np.sort(wrapped[..., 0], axis=axis), axis=axis)))


def _unique_tuples(indices, sizes) -> bool:
    """Whether host ScatterND index tuples (the last axis of `indices`) are distinct."""
    wrapped = _host_wrapped(indices, sizes)
    if wrapped is None:
        return False
    rows = wrapped.reshape(math.prod(indices.shape[:-1]), len(sizes))
    return len(np.unique(rows, axis=0)) == len(rows)


def _scatter_elements(data, indices, updates, axis: int, reduction: str, reductions):
    xp = array_module(data)
    axis = normalize_axis(axis, data.ndim, "ScatterElements axis")
    if indices.ndim != data.ndim or tuple(indices.shape) != tuple(updates.shape):
        raise ShapeError(
            f"ScatterElements indices {list(indices.shape)} and updates {list(updates.shape)} must "
            f"have equal shapes of the rank of data {list(data.shape)}"
        )
    wrapped = _wrap(xp, indices, data.shape[axis], "ScatterElements indices")
    index_dtype = wrapped.dtype
    index = []
    for d, n in enumerate(indices.shape):
        if d == axis:
            index.append(wrapped)
        else:
            shape = [1] * data.ndim
            shape[d] = n
            index.append(xp.reshape(xp.arange(n, dtype=index_dtype), shape))
    unique = reduction == "mul" and _unique_along(indices, axis, data.shape[axis])
    return _update(data, tuple(index), updates, reduction, reductions, unique)


@op("Scatter", since=(9, 11), context=True, strings_on_host=True)
@op("ScatterElements", since=(11, 13), context=True, strings_on_host=True)
def scatter_elements_v11(ctx, data, indices, updates, *, axis=0):
    """ONNX ScatterElements-11..13 (and the deprecated Scatter-9..11): GatherElements' inverse."""
    _strings_need_host_indices(ctx, data, indices)
    return _scatter_elements(data, indices, updates, axis, "none", ("none",))


@op("ScatterElements", since=16, context=True, strings_on_host=True)
def scatter_elements_v16(ctx, data, indices, updates, *, axis=0, reduction="none"):
    """ONNX ScatterElements-16: write, add or multiply `updates` into a copy of `data`."""
    _strings_need_host_indices(ctx, data, indices)
    return _scatter_elements(data, indices, updates, axis, reduction, ("none", "add", "mul"))


@op("ScatterElements", since=18, context=True, strings_on_host=True)
def scatter_elements_v18(ctx, data, indices, updates, *, axis=0, reduction="none"):
    """ONNX ScatterElements-18: ScatterElements-16 plus max and min reductions."""
    _strings_need_host_indices(ctx, data, indices)
    return _scatter_elements(
        data, indices, updates, axis, reduction, ("none", "add", "mul", "max", "min")
    )


def _scatter_nd(data, indices, updates, reduction: str, reductions):
    xp = array_module(data)
    k = indices.shape[-1] if indices.ndim else 0
    expected = (*indices.shape[:-1], *data.shape[k:])
    if indices.ndim < 1 or k > data.ndim or tuple(updates.shape) != expected:
        raise ShapeError(
            f"ScatterND: data {list(data.shape)} and indices {list(indices.shape)} need updates "
            f"of shape {list(expected)}; got {list(updates.shape)}"
        )
    index = tuple(
        _wrap(xp, indices[..., j], data.shape[j], f"ScatterND indices[..., {j}]") for j in range(k)
    )
    unique = reduction == "mul" and _unique_tuples(indices, data.shape[:k])
    return _update(data, index, updates, reduction, reductions, unique)


@op("ScatterND", since=(11, 13), context=True, strings_on_host=True)
def scatter_nd_v11(ctx, data, indices, updates):
    """ONNX ScatterND-11..13: write `updates` at the index tuples in the last dim of `indices`."""
    _strings_need_host_indices(ctx, data, indices)
    return _scatter_nd(data, indices, updates, "none", ("none",))


@op("ScatterND", since=16, context=True, strings_on_host=True)
def scatter_nd_v16(ctx, data, indices, updates, *, reduction="none"):
    """ONNX ScatterND-16: write, add or multiply `updates` at the index tuples."""
    _strings_need_host_indices(ctx, data, indices)
    return _scatter_nd(data, indices, updates, reduction, ("none", "add", "mul"))


@op("ScatterND", since=18, context=True, strings_on_host=True)
def scatter_nd_v18(ctx, data, indices, updates, *, reduction="none"):
    """ONNX ScatterND-18: ScatterND-16 plus max and min reductions."""
    _strings_need_host_indices(ctx, data, indices)
    return _scatter_nd(data, indices, updates, reduction, ("none", "add", "mul", "max", "min"))


# ------------------------------------------------------------------------------------ one-hot


def _one_hot(indices, depth, values, axis: int, negative: bool):
    depth = int(host_scalar(depth, "OneHot depth"))
    if depth < 0:
        raise ShapeError(f"OneHot depth must be non-negative; got {depth}")
    if values.shape != (2,):
        raise ShapeError(
            f"OneHot values must be [off_value, on_value]; got shape {list(values.shape)}"
        )
    axis = normalize_axis(axis, indices.ndim + 1, "OneHot axis")
    indices = jnp.asarray(indices).astype(jnp.int64)
    if negative:
        indices = jnp.where(indices < 0, indices + depth, indices)
    classes = jnp.reshape(
        jnp.arange(depth, dtype=indices.dtype), (depth,) + (1,) * (indices.ndim - axis)
    )
    hot = jnp.expand_dims(indices, axis) == classes
    if array_module(values) is np:  # strings; numpy alone would pick a fixed-width str dtype
        return np.where(np.asarray(hot), values[1], values[0]).astype(object)
    return jnp.where(hot, values[1], values[0])


@op(
    "OneHot",
    since=9,
    host_inputs={"depth": "the one-hot size"},
    context=True,
    strings_on_host=True,
)
def one_hot_v9(ctx, indices, depth, values, *, axis=-1):
    """ONNX OneHot-9: values[1] where the new `axis` equals the index, values[0] elsewhere."""
    _strings_need_host_indices(ctx, values, indices, position=0)
    return _one_hot(indices, depth, values, axis, negative=False)


@op(
    "OneHot",
    since=(11, 28),
    host_inputs={"depth": "the one-hot size"},
    context=True,
    strings_on_host=True,
)
def one_hot(ctx, indices, depth, values, *, axis=-1):
    """ONNX OneHot-11..28: OneHot-9 with negative indices counted back from depth."""
    _strings_need_host_indices(ctx, values, indices, position=0)
    return _one_hot(indices, depth, values, axis, negative=True)


# ---------------------------------------------------------------------- data-dependent shapes


@op("NonZero", since=(9, 13), data_dependent=True)
def non_zero(X):
    """ONNX NonZero-9..13: the int64 [rank, count] indices of the non-zero elements."""
    if X.ndim == 0:  # the spec gives a scalar [0, N] indices (numpy would give [1, N])
        return np.zeros((0, int(bool(X))), dtype=np.int64)
    return np.array(np.nonzero(X), dtype=np.int64).reshape(X.ndim, -1)


@op("Compress", since=(9, 11, 28), data_dependent=True)
def compress(input, condition, *, axis=None):
    """ONNX Compress-9..28: the slices (or flat elements) where `condition` is true."""
    condition = np.asarray(condition, dtype=bool).reshape(-1)
    if axis is None:
        input = input.reshape(-1)
        axis = 0
    axis = normalize_axis(axis, input.ndim, "Compress axis")
    # A condition longer than the axis may only be false past its end.
    extra = condition[input.shape[axis] :]
    if extra.any():
        raise ShapeError(
            f"Compress condition selects index {input.shape[axis] + int(np.argmax(extra))} past the axis end"
        )
    return np.compress(condition[: input.shape[axis]], input, axis=axis)


@op("Unique", since=(11, 28), data_dependent=True)
def unique(X, *, axis=None, sorted=1):
    """ONNX Unique-11..28: unique values (or slices along `axis`), first indices, inverse, counts."""
    if axis is not None:
        axis = normalize_axis(axis, X.ndim, "Unique axis")
    values, first, inverse, counts = np.unique(
        X if axis is not None else X.reshape(-1),
        return_index=True,
        return_inverse=True,
        return_counts=True,
        axis=axis,
    )
    inverse = inverse.reshape(-1)
    if not sorted:  # order of first occurrence instead of ascending
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    as_int64 = (a.astype(np.int64) for a in (first, inverse, counts))
    return (values.astype(X.dtype), *as_int64)


# ------------------------------------------------------------------------------- reversing


@op("ReverseSequence", since=(10, 28), context=True, strings_on_host=True)
def reverse_sequence(ctx, input, sequence_lens, *, batch_axis=1, time_axis=0):
    """ONNX ReverseSequence-10..28: reverse the first sequence_lens[b] steps of each batch entry."""
    _strings_need_host_indices(ctx, input, sequence_lens)
    if {batch_axis, time_axis} != {0, 1}:
        raise ValueError(
            "ReverseSequence batch_axis and time_axis must be 0 and 1 (one each); got "
            f"batch_axis={batch_axis}, time_axis={time_axis}"
        )
    if input.ndim < 2:
        raise ShapeError(f"ReverseSequence input must have rank >= 2; got {list(input.shape)}")
    batch, steps = input.shape[batch_axis], input.shape[time_axis]
    if tuple(sequence_lens.shape) != (batch,):
        raise ShapeError(
            f"ReverseSequence sequence_lens must have shape [{batch}] (the batch axis "
            f"{batch_axis} of input {list(input.shape)}); got {list(sequence_lens.shape)}"
        )
    if isinstance(sequence_lens, np.ndarray) and sequence_lens.size:
        low, high = int(sequence_lens.min()), int(sequence_lens.max())
        if low < 0 or high > steps:
            raise ShapeError(
                f"ReverseSequence sequence_lens holds {low if low < 0 else high}, outside "
                f"[0, {steps}] (the time axis {time_axis} of input {list(input.shape)})"
            )
    xp = array_module(input)
    # Device lengths cannot be checked; clipped, an out-of-range one reverses the whole axis.
    lens = xp.clip(xp.asarray(sequence_lens).astype(np.int64), 0, steps)
    t = xp.arange(steps, dtype=np.int64)
    if time_axis == 0:
        t, lens = t[:, None], lens[None, :]
    else:
        t, lens = t[None, :], lens[:, None]
    source = xp.where(t < lens, lens - 1 - t, t)
    source = xp.reshape(source, source.shape + (1,) * (input.ndim - 2))
    return xp.take_along_axis(input, xp.broadcast_to(source, input.shape), axis=time_axis)
