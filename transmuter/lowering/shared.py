"""What the operator families share: axes, host values, spatial attributes, broadcasting.

A helper goes here when a second family needs it, so that no family imports another for a
helper; one family's own helpers stay in its module. The accumulation-type policy for half
precision is `transmuter.dtypes.accumulation_dtype`.
"""

from __future__ import annotations

import math
import re

import jax
import jax.custom_batching
import jax.numpy as jnp
import numpy as np
from jax.export import is_symbolic_dim

from transmuter import cpu, dtypes
from transmuter.errors import ShapeError

# ------------------------------------------------------------------------------------ naming


def snake_case(op_type: str) -> str:
    """A Python name for an operator's lowering: "BitwiseAnd" -> "bitwise_and"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", op_type).lower()


# ----------------------------------------------------------------------------- host values


def array_module(*values):
    """numpy for string tensors (object arrays, host only); jax.numpy for everything else."""
    strings = any(isinstance(v, np.ndarray) and v.dtype == object for v in values)
    return np if strings else jnp


def on_host(*values) -> bool:
    """Whether every value (absent ones aside) is a host value: a numpy array or scalar."""
    return all(isinstance(v, (np.ndarray, np.generic)) for v in values if v is not None)


def host_module(*values):
    """numpy where every value is on the host (or one is a string tensor), else jax.numpy: for
    operators whose numpy and JAX forms agree exactly (moving data, integer arithmetic). Host
    values are shape arithmetic evaluated while tracing, and through JAX each new shape of them
    would compile a small XLA program of its own."""
    return np if on_host(*values) else array_module(*values)


def host_ints(value) -> list:
    """A host tensor (or a tuple attribute) as a list of Python ints; symbolic dims stay as
    they are."""
    return [v if is_symbolic_dim(v) else int(v) for v in np.asarray(value).reshape(-1)]


def host_scalar(value, what: str):
    """The single element of a host tensor that must hold exactly one value."""
    array = np.asarray(value)
    if array.size != 1:
        raise ShapeError(f"{what} must hold exactly one value; got shape {list(array.shape)}")
    return array.reshape(())[()]


# ------------------------------------------------------------------------------- scheduling


def after(value, dependency):
    """`value`, available to XLA only once `dependency` is computed: a data dependency it
    cannot fold away (x == x is false for a NaN, so the comparison stays), for work on weights
    that should run next to its use rather than where XLA:CPU's scheduler puts it, at the
    program's start with all the others (their results are then all held at once, and each
    read back from memory). The option that changes that schedule
    (xla_cpu_enable_concurrency_optimized_scheduler) is read from XLA_FLAGS alone, not from a
    program's compile options. A dependency with no elements, or not a float, adds none.

    Its derivative is the identity in `value`; under vmap the gate reads the whole batch, so an
    unbatched weight stays unbatched."""
    dependency = jnp.asarray(dependency)
    if dependency.size == 0 or not jnp.issubdtype(dependency.dtype, jnp.inexact):
        return value
    return _after(value, dependency)


def _gate(value, dependency):
    probe = jnp.ravel(dependency)[0]
    return jnp.where((probe == probe) | (probe != probe), value, jnp.zeros_like(value))


@jax.custom_batching.custom_vmap
def _gated(value, dependency):
    return _gate(value, dependency)


@_gated.def_vmap
def _gated_vmap(axis_size, in_batched, value, dependency):
    return _gate(value, dependency), in_batched[0]


@jax.custom_jvp
def _after(value, dependency):
    return _gated(value, dependency)


@_after.defjvp
def _after_jvp(primals, tangents):
    return _after(*primals), tangents[0]


# ------------------------------------------------------------------------------------- sizes

# The most bytes one tensor may take: no allocation can pass the machine's memory, and XLA aborts
# the process (it cannot raise) on a static size past int64, so a shape read from the graph is
# checked before it is asked for.
MAX_TENSOR_BYTES = cpu.physical_memory()


def check_size(what: str, shape, dtype) -> None:
    """Refuse a tensor of `shape` x `dtype` larger than int64 can count or memory can hold."""
    if any(map(is_symbolic_dim, shape)):
        return  # exporting with symbolic dims: no size to check yet
    elements = math.prod(int(d) for d in shape)
    nbytes = elements * np.dtype(dtype).itemsize
    if elements >= 2**63 or nbytes > MAX_TENSOR_BYTES:
        raise ValueError(
            f"{what} would be {[int(d) for d in shape]} {np.dtype(dtype).name}: {elements} "
            f"elements, {nbytes / 2**30:.4g} GiB, past this machine's "
            f"{MAX_TENSOR_BYTES / 2**30:.4g} GiB of memory"
        )


# -------------------------------------------------------------------------------------- axes


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [0, rank), accepting negative values counted from the back."""
    if not -rank <= axis < rank:
        raise ShapeError(
            f"{what} {axis} is out of range for rank {rank} (expected [{-rank}, {rank - 1}])"
        )
    return axis % rank


# ----------------------------------------------------------------------------------- indices

_INT32 = np.iinfo(np.int32)


def narrow_indices(indices, size):
    """Indices into an axis of `size`, for a JAX gather or scatter, as int32: the one index type
    those work with whether x64 is on or off. Their lowering rules (the index clamp) and their
    transposes read the x64 flag when they run, and under a caller's `jax.grad` or `jax.jit`
    that is after Transmuter's x64 scope has closed, where int64 indices break them. Values past
    int32 saturate, so an index out of range stays out of range (clamped or dropped as before,
    and seen by checkify). An axis longer than int32 counts keeps its indices as they are; host
    indices are narrowed too, for they become constants of the same program."""
    dtype = np.dtype(indices.dtype)
    if dtype == np.int32 or (isinstance(size, int) and size > _INT32.max):
        return indices
    info = np.iinfo(dtype)
    xp = np if isinstance(indices, (np.ndarray, np.generic)) else jnp
    if info.min < _INT32.min or info.max > _INT32.max:
        low, high = max(info.min, _INT32.min), min(info.max, _INT32.max)
        indices = xp.clip(indices, dtype.type(low), dtype.type(high))
    return indices.astype(np.int32)


def arg_extreme(x, axis: int, largest: bool = True, dtype=np.int64):
    """The index (of integer type `dtype`) of the first largest (or smallest) value of `x` along
    `axis`, a NaN counting as the extreme: the reduction `lax.argmax`/`argmin` lower to, with
    every constant made here. Not `jnp.argmax`/`lax.argmax`: their lowering makes the initial
    value and the index type of the reduction when the program is lowered, and under a caller's
    `jax.jit` with x64 off (after Transmuter's x64 scope has closed) int64 indices and 64-bit
    data come out 32-bit there, which fails to lower."""
    value_type = np.dtype(x.dtype)
    if value_type == np.bool_:
        init = np.array(not largest)
    elif jnp.issubdtype(value_type, jnp.integer):
        info = np.iinfo(value_type)
        init = np.array(info.min if largest else info.max, value_type)
    else:
        bound = np.array(np.inf, value_type)
        if not np.isinf(float(bound)):  # no infinity in the type: its largest finite value
            bound = np.array(jnp.finfo(value_type).max, value_type)
        init = -bound if largest else bound
    better = jax.lax.gt if largest else jax.lax.lt

    def pick(candidate, kept):
        (value, index), (kept_value, kept_index) = candidate, kept
        # The candidate's value if better or NaN; its index also on a tie with a lower index.
        take_value = better(value, kept_value) | (value != value)
        take_index = take_value | ((value == kept_value) & (index < kept_index))
        return (
            jax.lax.select(take_value, value, kept_value),
            jax.lax.select(take_index, index, kept_index),
        )

    index = jax.lax.broadcasted_iota(dtype, x.shape, axis)
    # An index has no gradient (and JAX's derivative of a variadic reduce is undefined).
    x = jax.lax.stop_gradient(x)
    return jax.lax.reduce((x, index), (init, np.array(0, dtype)), pick, (axis,))[1]


# ------------------------------------------------------------------------------ broadcasting


def broadcast_unidirectional(value, shape, what: str):
    """`value` broadcast to `shape`, which it may not change (ONNX unidirectional broadcasting:
    Gemm's C, PRelu's slope, a normalization's scale). `what` names the input in the error."""
    try:
        return jnp.broadcast_to(value, shape)
    except ValueError:
        raise ShapeError(
            f"{what} of shape {list(np.shape(value))} is not unidirectionally broadcastable to "
            f"{list(shape)}"
        ) from None


def divide(x, y, dtype):
    """x / y rounded once to the float type `dtype`, as an IEEE division in `dtype` gives it
    (ONNX Runtime's Div and its quantizers' divisions), whatever broadcasts.

    XLA's algebraic simplifier turns a division by a broadcast value into a multiplication by
    its reciprocal, eagerly and jitted: float32 [512] / a scalar is one ulp off on ~22% of the
    elements, and a quotient such as 127.49999 lands on the tie 127.5. Dividing in float64 keeps
    the error (even through a reciprocal) far below half an ulp of float32, and a quotient of
    two floats is never a tie, so the rounding to `dtype` is exact (x64 is on while Transmuter
    traces). float64 has no wider type: there the divisor is broadcast to the full shape behind
    an optimization barrier, which the simplifier does not see through (a copy of it: slower)."""
    wide = np.dtype(np.float64)
    x, y = jnp.asarray(x).astype(wide), jnp.asarray(y).astype(wide)
    if np.dtype(dtype) != wide:
        return (x / y).astype(dtype)
    shape = jnp.broadcast_shapes(x.shape, y.shape)
    if y.shape != shape:
        y = jax.lax.optimization_barrier(jnp.broadcast_to(y, shape))
    return x / y


def widened(x):
    """x in its accumulation type (float32 for half precision), to compute a chain in."""
    x = jnp.asarray(x)
    return x.astype(dtypes.accumulation_dtype(x.dtype))


# ------------------------------------------------------------------- convolution and pooling

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def spatial_attrs(
    op_type: str, rank: int, strides, dilations, pads, auto_pad: str
) -> tuple[tuple, tuple, tuple]:
    """Strides, dilations and (begin, end) pads per spatial axis, defaults filled in and checked."""
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"{op_type}: auto_pad must be one of {AUTO_PADS}, got {auto_pad!r}")
    strides = tuple(strides) if strides is not None else (1,) * rank
    dilations = tuple(dilations) if dilations is not None else (1,) * rank
    pads = tuple(pads) if pads is not None else (0,) * (2 * rank)
    for name, value, size in (
        ("strides", strides, rank),
        ("dilations", dilations, rank),
        ("pads", pads, 2 * rank),
    ):
        if len(value) != size:
            raise ShapeError(
                f"{op_type}: {name} has {len(value)} values, expected {size} for {rank} spatial axes"
            )
    return strides, dilations, tuple(zip(pads[:rank], pads[rank:], strict=True))


def same_pads(size, window: int, stride: int, upper: bool) -> tuple:
    """(begin, end) pads that make the output `ceil(size / stride)` long (SAME_UPPER/LOWER)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    small = total // 2
    return (small, total - small) if upper else (total - small, small)
