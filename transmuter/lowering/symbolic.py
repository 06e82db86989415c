"""Shape values holding `jax.export` symbolic dims, for exporting with symbolic shapes.

Shape returns the dims of its input as a host vector; exporting, some dims are symbolic, and the
vector is a numpy object array holding them (`dims_array`). The data-movement operators
(registered with `symbolic=True`: Gather, Concat, Reshape, ...) handle such arrays with numpy on
the host, the arithmetic ones (`symbolic=` one of the functions below) compute on the dims with
Python's operators, and any other operator receives them as int64 device values
(`dims_to_device`); the interpreter routes nodes by their registration.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.export import is_symbolic_dim

from transmuter import dtypes


def dims_array(dims) -> np.ndarray:
    """Dims as a host int64 vector, or an object vector holding `jax.export` symbolic dims when
    exporting with symbolic shapes: shape arithmetic then stays on the host, symbolically."""
    dims = tuple(dims)
    if any(is_symbolic_dim(d) for d in dims):
        return np.array(dims, dtype=object)
    return np.array(dims, dtype=np.int64)


def is_symbolic(value) -> bool:
    """True for a host value holding a `jax.export` symbolic dim (see `dims_array`)."""
    return (
        isinstance(value, np.ndarray)
        and value.dtype == object
        and any(is_symbolic_dim(v) for v in value.reshape(-1))
    )


def dims_to_device(value: np.ndarray):
    """A host value holding symbolic dims as an int64 array of their values, in the trace."""
    return jnp.asarray(value.tolist(), dtype=jnp.int64)


def settle_dims(value):
    """An object array whose dims all turned out concrete back to int64 (strings stay)."""
    if (
        isinstance(value, np.ndarray)
        and value.dtype == object
        and all(isinstance(v, (int, np.integer)) for v in value.reshape(-1))
    ):
        return value.astype(np.int64)
    return value


# jax.export lowers symbolic dims as int32 values, so a concrete bound this large (INT64_MAX
# meaning "to the end") is past any symbolic dim; jax cannot prove that and would keep min(b, 2^63-1).
_PAST_ANY_DIM = 2**31 - 1


def dim_min(a, b):
    """min of two dims, either of which may be a `jax.export` symbolic dim."""
    if not (is_symbolic_dim(a) or is_symbolic_dim(b)):
        return min(a, b)
    if not is_symbolic_dim(a) and a >= _PAST_ANY_DIM:
        return b
    if not is_symbolic_dim(b) and b >= _PAST_ANY_DIM:
        return a
    found = jax.core.min_dim(a, b)
    bounds = _BOUNDS.get()
    if bounds is not None and is_symbolic_dim(found) and found != a and found != b:
        # A symbolic dim clamped by a size the graph states (a Slice of a 64-row table, a Min),
        # which jax.export cannot resolve without a constraint.
        for dim, limit in ((a, b), (b, a)):
            if is_symbolic_dim(dim) and not is_symbolic_dim(limit):
                bounds.append((str(dim), int(limit)))
    return found


# The bounds met while exporting, when `recording_bounds` is on: (dim expression, size) pairs.
_BOUNDS: contextvars.ContextVar[list | None] = contextvars.ContextVar("bounds", default=None)


@contextlib.contextmanager
def recording_bounds():
    """Collect the (dim, size) pairs `dim_min` clamps while tracing (export derives
    constraints such as "sequence <= 64" from them)."""
    found: list[tuple[str, int]] = []
    token = _BOUNDS.set(found)
    try:
        yield found
    finally:
        _BOUNDS.reset(token)


def dim_max(a, b):
    """max of two dims, either of which may be a `jax.export` symbolic dim."""
    if not (is_symbolic_dim(a) or is_symbolic_dim(b)):
        return max(a, b)
    if not is_symbolic_dim(a) and a <= -_PAST_ANY_DIM:
        return b
    if not is_symbolic_dim(b) and b <= -_PAST_ANY_DIM:
        return a
    return jax.core.max_dim(a, b)


# The operators registered with `symbolic=` compute on symbolic dims with these in place of their
# lowering (Add with np.add, ...); those registered with symbolic=True move them with numpy.


def cast_dims(input, *, to, **_):
    """Cast on dims: dims are exact integers, so an integer cast keeps them symbolic; any other
    type needs their values."""
    if np.issubdtype(dtypes.from_onnx(to), np.integer):
        return input
    return dims_to_device(input).astype(dtypes.from_onnx(to))


def _dim_divide(a, b):
    # ONNX integer division truncates; dims are non-negative, where that is floor division.
    if is_symbolic_dim(a) or is_symbolic_dim(b):
        return a // b
    return abs(int(a)) // abs(int(b)) * (1 if (a < 0) == (b < 0) else -1)


divide_dims = np.frompyfunc(_dim_divide, 2, 1)


def _variadic(combine):
    return lambda *xs: functools.reduce(np.frompyfunc(combine, 2, 1), xs)


min_dims = _variadic(dim_min)
max_dims = _variadic(dim_max)
