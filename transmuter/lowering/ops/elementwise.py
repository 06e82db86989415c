"""Elementwise operators: unary math, arithmetic and comparison, logic and bits, variadic
Min/Max/Sum/Mean, Where, Clip, Cast/CastLike and the activation functions.

Binary operators broadcast NumPy-style from opset 7; opsets 1 and 6 use the legacy
`broadcast`/`axis` attributes (the second input broadcast onto the first), handled by
`_legacy_broadcast`. Inputs of one operator have one element type (the spec's type variable), so
no promotion happens here. String tensors (numpy object arrays) are handled with numpy on the
host: Equal, Where and Cast from or to strings.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from transmuter import dtypes
from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import op, variant
from transmuter.lowering.shared import (
    array_module,
    broadcast_unidirectional,
    divide,
    on_host,
    snake_case,
)
from transmuter.lowering.symbolic import cast_dims, divide_dims, max_dims, min_dims


def _is_int(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer)


def _half_in_float32(fn):
    """Evaluate a multi-step activation of a float16/bfloat16 input in float32 and round once."""

    @functools.wraps(fn)
    def wrapped(X, **attrs):
        return fn(X.astype(accumulation_dtype(X.dtype)), **attrs).astype(X.dtype)

    return wrapped


def _numpy_on_host(fn, host_fn):
    """`fn`, or `host_fn` (numpy, the same semantics) when every input is a host value. Host
    values are shape arithmetic, evaluated while tracing: through JAX each new shape of them
    would compile a small XLA program of its own."""

    @functools.wraps(fn)
    def either(*xs):
        return host_fn(*xs) if on_host(*xs) else fn(*xs)

    return either


# ----------------------------------------------------------------------------------- unary


def _erf(x):
    # Erf accepts integer inputs (the result is truncated back to the input type).
    if _is_int(x.dtype):
        return jax.scipy.special.erf(x.astype(jnp.float64)).astype(x.dtype)
    return jax.scipy.special.erf(x)


_UNARY = (
    ("Abs", (1, 6, 13), _numpy_on_host(jnp.abs, np.abs)),
    ("Exp", (1, 6, 13), jnp.exp),
    ("Log", (1, 6, 13), jnp.log),
    ("Sqrt", (1, 6, 13), jnp.sqrt),
    ("Reciprocal", (1, 6, 13), jnp.reciprocal),
    ("Floor", (1, 6, 13), _numpy_on_host(jnp.floor, np.floor)),
    ("Ceil", (1, 6, 13), _numpy_on_host(jnp.ceil, np.ceil)),
    ("Relu", (1, 6, 13, 14), lambda x: jnp.maximum(x, 0)),
    ("Sigmoid", (1, 6, 13), jax.nn.sigmoid),
    ("Tanh", (1, 6, 13), jnp.tanh),
    ("Round", (11, 22), jnp.round),  # half to even, as the spec asks
    ("Sign", (9, 13), _numpy_on_host(jnp.sign, np.sign)),
    ("Sin", (7, 22), jnp.sin),
    ("Cos", (7, 22), jnp.cos),
    ("Tan", (7, 22), jnp.tan),
    ("Asin", (7, 22), jnp.arcsin),
    ("Acos", (7, 22), jnp.arccos),
    ("Atan", (7, 22), jnp.arctan),
    ("Sinh", (9, 22), jnp.sinh),
    ("Cosh", (9, 22), jnp.cosh),
    ("Asinh", (9, 22), jnp.arcsinh),
    ("Acosh", (9, 22), jnp.arccosh),
    ("Atanh", (9, 22), jnp.arctanh),
    ("Erf", (9, 13), _erf),
    ("IsNaN", (9, 13, 20), jnp.isnan),
    ("Not", 1, _numpy_on_host(jnp.logical_not, np.logical_not)),
    ("BitwiseNot", 18, jnp.bitwise_not),
    ("Softplus", (1, 22), _half_in_float32(lambda X: jnp.logaddexp(X, 0))),
    ("Softsign", (1, 22), _half_in_float32(lambda X: X / (1 + jnp.abs(X)))),
    ("HardSwish", (14, 22), lambda X: X * jnp.clip(X / 6 + 0.5, 0, 1)),
    ("Mish", (18, 22), _half_in_float32(lambda X: X * jnp.tanh(jnp.logaddexp(X, 0)))),
)

# Version 1 of these carries the legacy `consumed_inputs` attribute (an in-place hint).
_CONSUMED_INPUTS_V1 = set("Abs Neg Exp Log Sqrt Reciprocal Floor Ceil Relu Sigmoid Tanh".split())


def _unary(name: str, fn, legacy: bool):
    if legacy:

        def lowering(X, *, consumed_inputs=None):
            return fn(X)
    else:

        def lowering(X):
            return fn(X)

    lowering.__name__ = lowering.__qualname__ = (
        f"{snake_case(name)}_v1" if legacy else snake_case(name)
    )
    lowering.__doc__ = f"ONNX {name}: elementwise {name.lower()}."
    return lowering


for _name, _since, _fn in _UNARY:
    _versions = (_since,) if isinstance(_since, int) else _since
    if _name in _CONSUMED_INPUTS_V1:
        op(_name, since=1)(_unary(_name, _fn, legacy=True))
        _versions = _versions[1:]
    op(_name, since=_versions)(_unary(_name, _fn, legacy=False))

_negative = _numpy_on_host(jnp.negative, np.negative)
op("Neg", since=1)(_unary("Neg", _negative, legacy=True))
op("Neg", since=(6, 13), symbolic=np.negative)(_unary("Neg", _negative, legacy=False))


@op("IsInf", since=(10, 20))
def isinf(X, *, detect_negative=1, detect_positive=1):
    """ONNX IsInf-10..20: true where X is an infinity of a detected sign."""
    found = jnp.zeros(X.shape, dtype=bool)
    if detect_positive:
        found = found | jnp.isposinf(X)
    if detect_negative:
        found = found | jnp.isneginf(X)
    return found


# ---------------------------------------------------------------------------------- binary


def _divide(A, B):
    # Integer Div truncates toward zero (C semantics); jnp's floor_divide would round down.
    if _is_int(A.dtype):
        if on_host(A, B):
            quotient = np.abs(A) // np.maximum(np.abs(B), 1)  # x / 0 is undefined in ONNX
            return np.where((A < 0) != (B < 0), -quotient, quotient).astype(A.dtype)
        return lax.div(*jnp.broadcast_arrays(A, B))
    if on_host(A, B):
        return np.divide(A, B)
    # XLA multiplies by the reciprocal of a divisor it broadcasts, one ulp off where ORT divides.
    if jnp.shape(B) != jnp.broadcast_shapes(jnp.shape(A), jnp.shape(B)):
        return divide(A, B, jnp.result_type(A, B))
    return jnp.divide(A, B)


def _equal(A, B):
    if array_module(A, B) is np or on_host(A, B):
        return np.asarray(A == B, dtype=bool)
    return jnp.equal(A, B)


def _legacy_broadcast(A, B, broadcast: int, axis):
    """Opset 1/6 broadcasting: B must equal A's shape unless `broadcast` is set; then B's shape
    matches a contiguous run of A's dims starting at `axis` (default: A's trailing dims)."""
    if not broadcast:
        if tuple(B.shape) != tuple(A.shape):
            raise ShapeError(
                f"B of shape {list(B.shape)} must equal A's shape {list(A.shape)} without the "
                "broadcast attribute (legacy broadcasting before opset 7)"
            )
        return B
    if axis is not None:
        start = axis + A.ndim if axis < 0 else axis
        if not 0 <= start <= A.ndim - B.ndim:
            raise ShapeError(
                f"broadcast axis {axis} does not fit B of shape {list(B.shape)} into A of shape "
                f"{list(A.shape)}"
            )
        B = jnp.reshape(B, tuple(B.shape) + (1,) * (A.ndim - start - B.ndim))
    return broadcast_unidirectional(B, A.shape, "B")


def _binary(name: str, fn):
    def lowering(A, B):
        return fn(A, B)

    lowering.__name__ = lowering.__qualname__ = snake_case(name)
    lowering.__doc__ = f"ONNX {name}: elementwise, NumPy-style broadcasting."
    return lowering


def _legacy_binary(name: str, fn, since: int, consumed_inputs: bool):
    if consumed_inputs:

        def lowering(A, B, *, axis=None, broadcast=0, consumed_inputs=None):
            return fn(A, _legacy_broadcast(A, B, broadcast, axis))
    else:

        def lowering(A, B, *, axis=None, broadcast=0):
            return fn(A, _legacy_broadcast(A, B, broadcast, axis))

    lowering.__name__ = lowering.__qualname__ = f"{snake_case(name)}_v{since}"
    lowering.__doc__ = f"ONNX {name} before opset 7: elementwise, B broadcast onto A if asked."
    return lowering


# The last column computes on `jax.export` symbolic dims (lowering/symbolic.py).
for _name, _fn, _on_dims in (
    ("Add", _numpy_on_host(jnp.add, np.add), np.add),
    ("Sub", _numpy_on_host(jnp.subtract, np.subtract), np.subtract),
    ("Mul", _numpy_on_host(jnp.multiply, np.multiply), np.multiply),
    ("Div", _divide, divide_dims),
):
    op(_name, since=1)(_legacy_binary(_name, _fn, 1, consumed_inputs=True))
    op(_name, since=6)(_legacy_binary(_name, _fn, 6, consumed_inputs=False))
    op(_name, since=(7, 13, 14), symbolic=_on_dims)(_binary(_name, _fn))

for _name, _since, _fn in (
    ("And", (7,), _numpy_on_host(jnp.logical_and, np.logical_and)),
    ("Or", (7,), _numpy_on_host(jnp.logical_or, np.logical_or)),
    ("Xor", (7,), _numpy_on_host(jnp.logical_xor, np.logical_xor)),
    ("Less", (7, 9, 13), _numpy_on_host(jnp.less, np.less)),
    ("Greater", (7, 9, 13), _numpy_on_host(jnp.greater, np.greater)),
):
    op(_name, since=1)(_legacy_binary(_name, _fn, 1, consumed_inputs=False))
    op(_name, since=_since)(_binary(_name, _fn))

op("Equal", since=1)(_legacy_binary("Equal", _equal, 1, consumed_inputs=False))
op("Equal", since=(7, 11, 13, 19), symbolic=True)(_binary("Equal", _equal))

for _name, _since, _fn in (
    ("LessOrEqual", (12, 16), _numpy_on_host(jnp.less_equal, np.less_equal)),
    ("GreaterOrEqual", (12, 16), _numpy_on_host(jnp.greater_equal, np.greater_equal)),
    ("BitwiseAnd", 18, jnp.bitwise_and),
    ("BitwiseOr", 18, jnp.bitwise_or),
    ("BitwiseXor", 18, jnp.bitwise_xor),
):
    op(_name, since=_since)(_binary(_name, _fn))


def _power(X, Y):
    """X ** Y with the result in X's type; Y may have another numeric type (Pow-12+)."""
    if dtypes.is_float(X.dtype):
        if Y.dtype == X.dtype or not dtypes.is_float(Y.dtype):
            return jnp.power(X, Y.astype(X.dtype))
        # Mixed float types: compute in the wider one (float32 at least), round to X's type.
        wide = max(
            (np.dtype(X.dtype), np.dtype(Y.dtype), np.dtype(np.float32)), key=lambda d: d.itemsize
        )
        return jnp.power(X.astype(wide), Y.astype(wide)).astype(X.dtype)
    if dtypes.is_float(Y.dtype):
        # An integer base with a float exponent: the real power, truncated to X's type.
        return jnp.power(X.astype(jnp.float64), Y.astype(jnp.float64)).astype(X.dtype)
    Y = Y.astype(X.dtype)
    # jnp.power has no meaning for negative integer exponents; the real power truncated is 0
    # unless |X| == 1 (X == 0 divides by zero: undefined).
    reciprocal = jnp.where(jnp.abs(X) == 1, jnp.where(Y % 2 == 0, 1, X), 0)
    return jnp.where(Y < 0, reciprocal, jnp.power(X, jnp.maximum(Y, 0)))


@op("Pow", since=1)
def pow_v1(X, Y, *, axis=None, broadcast=0):
    """ONNX Pow-1: X ** Y, Y broadcast onto X if `broadcast` is set."""
    return _power(X, _legacy_broadcast(X, Y, broadcast, axis))


@op("Pow", since=(7, 12, 13, 15))
def pow_(X, Y):
    """ONNX Pow-7..15: X ** Y in X's type, NumPy-style broadcasting."""
    return _power(X, Y)


@op("Mod", since=(10, 13, 28))
def mod(A, B, *, fmod=0):
    """ONNX Mod-10..28: remainder; fmod=0 rounds the quotient down, fmod=1 toward zero."""
    # Mod-28 defines fmod=0 for floats (A - floor(A/B)*B); earlier versions only allowed it for
    # integers, where the result is the same.
    if fmod == 0:
        remainder = jnp.remainder(A, B)
        if dtypes.is_float(remainder.dtype):
            # A zero result takes B's sign (Mod-28), which jnp.remainder does not give.
            zero = jnp.copysign(jnp.zeros_like(remainder), B)
            remainder = jnp.where(remainder == 0, zero, remainder)
        return remainder
    if fmod == 1:
        return jnp.fmod(A, B)
    raise ValueError(f"Mod attribute fmod must be 0 or 1, got {fmod}")


@op("BitShift", since=(11, 28))
def bit_shift(X, Y, *, direction):
    """ONNX BitShift-11..28: shift X's bits by Y; out-of-range Y gives the sign fill (28)."""
    bits = jnp.iinfo(X.dtype).bits
    in_range = (Y >= 0) & (Y < bits)
    amount = jnp.where(in_range, Y, 0)
    if direction == "LEFT":
        return jnp.where(in_range, jnp.left_shift(X, amount), 0)
    if direction == "RIGHT":
        # right_shift is arithmetic for signed types; shifting by bits-1 yields the sign fill.
        signed = jnp.issubdtype(X.dtype, jnp.signedinteger)
        fill = jnp.right_shift(X, bits - 1) if signed else jnp.zeros_like(X)
        return jnp.where(in_range, jnp.right_shift(X, amount), fill)
    raise ValueError(f"BitShift direction must be 'LEFT' or 'RIGHT', got {direction!r}")


# -------------------------------------------------------------------------------- variadic


def _sum(values):
    wide = accumulation_dtype(values[0].dtype)
    return functools.reduce(jnp.add, [v.astype(wide) for v in values])


def _variadic(name: str, combine, legacy: bool):
    if legacy:

        def lowering(*data_0, consumed_inputs=None):
            return combine(data_0)
    else:

        def lowering(*data_0):
            return combine(data_0)

    lowering.__name__ = lowering.__qualname__ = (
        f"{snake_case(name)}_v1" if legacy else snake_case(name)
    )
    lowering.__doc__ = f"ONNX {name}: elementwise {name.lower()} of the inputs, broadcast."
    return lowering


def _mean(values):
    return (_sum(values) / len(values)).astype(values[0].dtype)


def _total(values):
    return _sum(values).astype(values[0].dtype)


_minimum = _numpy_on_host(jnp.minimum, np.minimum)
_maximum = _numpy_on_host(jnp.maximum, np.maximum)
# The last column computes on `jax.export` symbolic dims (lowering/symbolic.py).
for _name, _since, _combine, _on_dims in (
    ("Min", (6, 8, 12, 13), lambda xs: functools.reduce(_minimum, xs), min_dims),
    ("Max", (6, 8, 12, 13), lambda xs: functools.reduce(_maximum, xs), max_dims),
    ("Sum", (6, 8, 13), _total, False),
    ("Mean", (6, 8, 13), _mean, False),
):
    op(_name, since=1)(_variadic(_name, _combine, legacy=True))
    op(_name, since=_since, symbolic=_on_dims)(_variadic(_name, _combine, legacy=False))


@op("Where", since=(9, 16), context=True, strings_on_host=True, symbolic=True)
def where(ctx, condition, X, Y):
    """ONNX Where-9..16: X where condition holds, else Y, broadcast."""
    xp = np if on_host(condition, X, Y) else array_module(X, Y)
    if xp is np:  # strings live on the host, so choosing among them needs the condition there
        condition = ctx.host_value(0, condition, "the condition, to pick strings")
    return xp.where(condition, X, Y)


@op("Clip", since=1)
def clip_v1(input, *, consumed_inputs=None, max=None, min=None):
    """ONNX Clip-1: limit to [min, max] attributes; an absent bound does not clip."""
    if min is not None:
        input = jnp.maximum(input, min)
    return input if max is None else jnp.minimum(input, max)


@op("Clip", since=6)
def clip_v6(input, *, max=3.4028234663852886e38, min=-3.4028234663852886e38):
    """ONNX Clip-6: limit to [min, max] attributes (defaults: the float32 range)."""
    return jnp.minimum(jnp.maximum(input, min), max)


@op("Clip", since=(11, 12, 13))
def clip(input, min=None, max=None):
    """ONNX Clip-11..13: Min(max, Max(input, min)) with optional scalar bounds."""
    if min is not None:
        input = jnp.maximum(input, min)
    return input if max is None else jnp.minimum(input, max)


# ------------------------------------------------------------------------------------ Cast

_FNUZ = {np.dtype(ml_dtypes.float8_e4m3fnuz), np.dtype(ml_dtypes.float8_e5m2fnuz)}
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_SUB_BYTE_INTS = {
    np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)
}
# Cast-1 names its target with TensorProto.DataType names; these are the types it allows.
_CAST_V1_TYPES = {
    "FLOAT": 1,
    "UINT8": 2,
    "INT8": 3,
    "UINT16": 4,
    "INT16": 5,
    "INT32": 6,
    "INT64": 7,
    "BOOL": 9,
    "FLOAT16": 10,
    "DOUBLE": 11,
    "UINT32": 12,
    "UINT64": 13,
}


def _cast(x, to, *, saturate=1, inf_saturates=True, round_mode="up"):
    """x as numpy/JAX dtype `to` under the rules of Cast (see the spec's tables).

    inf_saturates: whether saturating casts map +-Inf to +-FLT_MAX for the FNUZ float8 types
    (Cast-23 and later) or to NaN (Cast-19/21).
    """
    to = np.dtype(to)
    if to.kind == "O" or np.dtype(x.dtype).kind == "O":
        return _cast_strings(
            x, to, saturate=saturate, inf_saturates=inf_saturates, round_mode=round_mode
        )
    if to in dtypes.FLOAT8 and saturate:
        # Inputs are clipped in at least float32, so the bound itself is exact before rounding.
        wide = x if np.dtype(x.dtype) == np.float64 else jnp.asarray(x).astype(jnp.float32)
        limit = float(ml_dtypes.finfo(to).max)
        clipped = jnp.clip(wide, -limit, limit)
        if to in _FNUZ and not inf_saturates:
            clipped = jnp.where(jnp.isinf(wide), jnp.nan, clipped)
        return clipped.astype(to)
    if to == _E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if to in _SUB_BYTE_INTS and dtypes.is_float(x.dtype):
        # Every Cast version leaves out-of-range float -> integer undefined; for the 4- and 2-bit
        # types onnx's conformance data truncates toward zero and keeps the low bits (INT4:
        # 8 -> -8, -9 -> 7), as integer -> integer casts do. XLA's float -> int4 would saturate.
        return jnp.asarray(x).astype(jnp.int64).astype(to)
    if on_host(x) and _same_on_host(np.dtype(x.dtype), to):
        return np.asarray(x).astype(to)
    return jnp.asarray(x).astype(to)


_IEEE = {np.dtype(t) for t in (np.float16, np.float32, np.float64)}


def _same_on_host(source: np.dtype, target: np.dtype) -> bool:
    """Casts numpy computes as XLA does: between integers and booleans (integers wrap), and to
    IEEE floats from those or from IEEE floats (round to nearest even). Float -> integer is
    out-of-range-defined differently, so it stays with JAX."""
    exact = source.kind in "biu" or source in _IEEE
    return (target.kind in "biu" and source.kind in "biu") or (target in _IEEE and exact)


def _to_e8m0(x, saturate, round_mode: str):
    """Cast to float8e8m0 (a power of two 2**(e-127), 0xFF is NaN): the exponent of |x|,
    rounded by `round_mode`; zero, underflow (below float32's smallest normal), overflow and Inf
    saturate or become NaN as the Cast-24 table says. Negative inputs are unspecified; their
    magnitude is used."""
    if round_mode not in ("up", "down", "nearest"):
        raise ValueError(f"Cast round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    magnitude = jnp.abs(jnp.asarray(x).astype(jnp.float32))
    # magnitude = fraction * 2**exponent with fraction in [0.5, 1)
    fraction, exponent = jnp.frexp(magnitude)
    exponent = exponent.astype(jnp.int32)
    if round_mode == "up":
        exponent = exponent + (fraction > 0.5).astype(jnp.int32)
    elif round_mode == "nearest":
        exponent = exponent + (fraction >= 0.75).astype(jnp.int32)
    biased = exponent + 126
    low, high = (0, 254) if saturate else (255, 255)
    code = jnp.where(biased > 254, high, biased)
    # Zero and float32 subnormals underflow (XLA may flush subnormals to zero anyway).
    code = jnp.where(magnitude < np.finfo(np.float32).tiny, low, code)
    code = jnp.where(jnp.isinf(magnitude), high, code)
    code = jnp.where(jnp.isnan(magnitude), 255, code)
    return lax.bitcast_convert_type(code.astype(jnp.uint8), ml_dtypes.float8_e8m0fnu)


def _cast_strings(x, to, **rules):
    """Casts from or to strings, on the host: numbers parse with C-like literals ("1e-5",
    "INF", "NaN"); numbers print like ONNX Runtime (%.8g for floats, 1/0 for booleans)."""
    x = np.asarray(x)
    if to.kind == "O":
        return _to_strings(x)
    if x.dtype.kind != "O":
        raise ValueError(f"cannot cast {x.dtype} to {to}")
    texts = [s.decode() if isinstance(s, bytes) else str(s) for s in x.reshape(-1)]
    if to == np.bool_:
        return np.array([float(t) != 0 for t in texts], dtype=bool).reshape(x.shape)
    if _is_int(to):
        info = ml_dtypes.iinfo(to)
        span = 1 << info.bits
        # Out-of-range integers wrap like integer casts do; "100.5" truncates to 100.
        values = [(_parse_int(t) - info.min) % span + info.min for t in texts]
        return np.array(values, dtype=to).reshape(x.shape)
    parsed = np.array([float(t) for t in texts], dtype=np.float64).reshape(x.shape)
    return np.asarray(_cast(parsed, to, **rules))


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return int(float(text))


def _to_strings(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_:
        texts = ["1" if v else "0" for v in x.reshape(-1)]
    elif _is_int(x.dtype):
        texts = [str(int(v)) for v in x.reshape(-1)]
    else:
        texts = [_float_text(float(v)) for v in x.reshape(-1)]
    return np.array(texts, dtype=object).reshape(x.shape)


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return f"{value:.8g}"


# Cast and CastLike convert element by element (`converts`: a stored weight's conversion runs
# next to its reader); strings live on the host.
_CAST_LIKE = {"context": True, "strings_on_host": True, "converts": True}
_CAST = {**_CAST_LIKE, "symbolic": cast_dims}


def _target(ctx, x, to):
    """Strings exist only on the host: a traced input cannot become one."""
    if np.dtype(to).kind == "O":
        ctx.host_value(0, x, "its input, to print it as strings")
    return to


@op("Cast", since=1, **_CAST)
def cast_v1(ctx, input, *, to):
    """ONNX Cast-1: cast to the type named by the string `to` ("FLOAT", "INT64", ...)."""
    code = _CAST_V1_TYPES.get(str(to).upper())
    if code is None:
        raise ValueError(f"Cast-1 'to' must name a tensor type (FLOAT, INT64, ...), got {to!r}")
    return _cast(input, _target(ctx, input, dtypes.from_onnx(code)))


@op("Cast", since=(19, 21), **_CAST)
def cast_v19(ctx, input, *, saturate=1, to):
    """ONNX Cast-19..21: cast; float8 targets saturate (Inf becomes NaN for the FNUZ types)."""
    target = _target(ctx, input, dtypes.from_onnx(to))
    return _cast(input, target, saturate=saturate, inf_saturates=False)


@op("Cast", since=23, **_CAST)
def cast_v23(ctx, input, *, saturate=1, to):
    """ONNX Cast-23: cast; float8 targets saturate, Inf included."""
    return _cast(input, _target(ctx, input, dtypes.from_onnx(to)), saturate=saturate)


# Before opset 19 no target type saturates (no float8 types yet): any saturate value is the same.
cast_v6 = op("Cast", since=(6, 9, 13), **_CAST)(
    variant(cast_v23, "cast_v6", "ONNX Cast-6..13: cast to element type `to`.", fixed={"saturate": 1})
)  # fmt: skip


@op("Cast", since=(24, 25, 28), **_CAST)
def cast_v24(ctx, input, *, round_mode="up", saturate=1, to):
    """ONNX Cast-24..28: cast; float8 targets saturate, float8e8m0 rounds by `round_mode`."""
    target = _target(ctx, input, dtypes.from_onnx(to))
    return _cast(input, target, saturate=saturate, round_mode=round_mode)


@op("CastLike", since=(19, 21), **_CAST_LIKE)
def cast_like_v19(ctx, input, target_type, *, saturate=1):
    """ONNX CastLike-19..21: cast like Cast-19 to the element type of `target_type`."""
    target = _target(ctx, input, target_type.dtype)
    return _cast(input, target, saturate=saturate, inf_saturates=False)


@op("CastLike", since=23, **_CAST_LIKE)
def cast_like_v23(ctx, input, target_type, *, saturate=1):
    """ONNX CastLike-23: cast like Cast-23 to the element type of `target_type`."""
    return _cast(input, _target(ctx, input, target_type.dtype), saturate=saturate)


cast_like_v15 = op("CastLike", since=15, **_CAST_LIKE)(variant(
    cast_like_v23, "cast_like_v15", "ONNX CastLike-15: cast to the element type of `target_type`.",
    fixed={"saturate": 1},
))  # fmt: skip


@op("CastLike", since=(24, 25), **_CAST_LIKE)
def cast_like_v24(ctx, input, target_type, *, round_mode="up", saturate=1):
    """ONNX CastLike-24..25: cast like Cast-24 to the element type of `target_type`."""
    target = _target(ctx, input, target_type.dtype)
    return _cast(input, target, saturate=saturate, round_mode=round_mode)


# ----------------------------------------------------------------------------- activations


@op("LeakyRelu", since=(6, 16))
def leaky_relu(X, *, alpha=0.009999999776482582):
    """ONNX LeakyRelu-6..16: alpha * x for x < 0, else x."""
    return jnp.where(X < 0, alpha * X, X)


# Version 1 of the activations carries the legacy `consumed_inputs` attribute (an in-place hint).
_CONSUMED = {"consumed_inputs": None}
leaky_relu_v1 = op("LeakyRelu", since=1)(variant(
    leaky_relu, "leaky_relu_v1", "ONNX LeakyRelu-1: alpha * x for x < 0, else x.",
    ignored=_CONSUMED,
))  # fmt: skip


@op("PRelu", since=6)
def prelu_v6(X, slope):
    """ONNX PRelu-6: slope * x for x < 0, else x; slope is shared, per channel or per element."""
    # Before unidirectional broadcasting (opset 7) the slope is "shared across channels" when it
    # has one element, else per channel: a [C] slope applies along axis 1 of X [N, C, ...], as
    # in Caffe2, where the operator comes from (and the pytorch-converted PReLU models).
    if math.prod(slope.shape) == 1:
        slope = jnp.reshape(slope, ())
    elif slope.ndim == 1 and X.ndim >= 2 and slope.shape[0] == X.shape[1]:
        slope = jnp.reshape(slope, (-1,) + (1,) * (X.ndim - 2))
    elif tuple(slope.shape) != tuple(X.shape):
        raise ShapeError(
            f"PRelu-6 slope must have one element, one per channel (X's axis 1) or X's shape "
            f"{list(X.shape)}, got {list(slope.shape)}"
        )
    return jnp.where(X < 0, slope * X, X)


prelu_v1 = op("PRelu", since=1)(variant(
    prelu_v6, "prelu_v1", "ONNX PRelu-1: PRelu-6 with the legacy consumed_inputs.",
    ignored=_CONSUMED,
))  # fmt: skip


@op("PRelu", since=(7, 9, 16))
def prelu(X, slope):
    """ONNX PRelu-7..16: slope * x for x < 0, else x; slope broadcasts onto X."""
    return jnp.where(X < 0, broadcast_unidirectional(slope, X.shape, "slope") * X, X)


@_half_in_float32
def _elu(X, *, alpha):
    return jnp.where(X < 0, alpha * jnp.expm1(X), X)


@op("Elu", since=(6, 22))
def elu(X, *, alpha=1.0):
    """ONNX Elu-6..22: alpha * (exp(x) - 1) for x < 0, else x."""
    return _elu(X, alpha=alpha)


elu_v1 = op("Elu", since=1)(variant(
    elu, "elu_v1", "ONNX Elu-1: alpha * (exp(x) - 1) for x < 0, else x.", ignored=_CONSUMED
))  # fmt: skip


@_half_in_float32
def _selu(X, *, alpha, gamma):
    return gamma * jnp.where(X <= 0, alpha * jnp.expm1(X), X)


@op("Selu", since=(6, 22))
def selu(X, *, alpha=1.6732631921768188, gamma=1.0507010221481323):
    """ONNX Selu-6..22: gamma * (alpha * (exp(x) - 1) for x <= 0, else x)."""
    return _selu(X, alpha=alpha, gamma=gamma)


selu_v1 = op("Selu", since=1)(variant(
    selu, "selu_v1", "ONNX Selu-1: gamma * (alpha * (exp(x) - 1) for x <= 0, else x).",
    ignored=_CONSUMED, defaults={"alpha": 1.673200011253357, "gamma": 1.0506999492645264},
))  # fmt: skip


@op("Celu", since=(12, 28))
@_half_in_float32
def celu(X, *, alpha=1.0):
    """ONNX Celu-12..28: max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    return jnp.maximum(X, 0) + jnp.minimum(0, alpha * jnp.expm1(X / alpha))


@op("HardSigmoid", since=(6, 22))
def hard_sigmoid(X, *, alpha=0.20000000298023224, beta=0.5):
    """ONNX HardSigmoid-6..22: max(0, min(1, alpha * x + beta))."""
    return jnp.clip(alpha * X + beta, 0, 1)


hard_sigmoid_v1 = op("HardSigmoid", since=1)(variant(
    hard_sigmoid, "hard_sigmoid_v1", "ONNX HardSigmoid-1: max(0, min(1, alpha * x + beta)).",
    ignored=_CONSUMED,
))  # fmt: skip


@op("ThresholdedRelu", since=(10, 22))
def thresholded_relu(X, *, alpha=1.0):
    """ONNX ThresholdedRelu-10..22: x for x > alpha, else 0."""
    return jnp.where(X > alpha, X, 0)


@op("Gelu", since=20)
@_half_in_float32
def gelu(X, *, approximate="none"):
    """ONNX Gelu-20: x * Phi(x), exactly (erf) or with the tanh approximation."""
    if approximate == "none":
        return 0.5 * X * (1 + jax.scipy.special.erf(X / math.sqrt(2)))
    if approximate == "tanh":
        return 0.5 * X * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (X + 0.044715 * X**3)))
    raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")


@op("Swish", since=24)
@_half_in_float32
def swish(X, *, alpha=1.0):
    """ONNX Swish-24: x * sigmoid(alpha * x)."""
    return X * jax.nn.sigmoid(alpha * X)


@op("Shrink", since=9)
def shrink(input, *, bias=0.0, lambd=0.5):
    """ONNX Shrink-9: x + bias below -lambd, x - bias above lambd, else 0."""
    # Integer inputs are compared and shifted in floating point, then truncated back.
    x = input.astype(jnp.float64) if _is_int(input.dtype) else input
    y = jnp.where(x < -lambd, x + bias, jnp.where(x > lambd, x - bias, 0))
    return y.astype(input.dtype)
