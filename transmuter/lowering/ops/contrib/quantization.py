"""com.microsoft quantized operators: the QLinear family, QGemm, DynamicQuantizeMatMul,
MatMulIntegerToFloat, DynamicQuantizeLSTM and ONNX Runtime's own QuantizeLinear and
DequantizeLinear.

The spec is ONNX Runtime's (ContribOperators.md); where it is silent, ONNX Runtime's CPU kernels
are the reference, and their rounding is reproduced:
- QLinearAdd, QLinearMul and QLinearAveragePool add the output zero point before rounding
  (round(v + zero), half to even), unlike QuantizeLinear (round(v) + zero);
- QLinearSigmoid, QLinearLeakyRelu, QLinearConcat and QLinearWhere compute what ONNX Runtime's
  256-entry lookup tables hold: QuantizeLinear(f(DequantizeLinear(x)));
- QGemm and QLinearGlobalAveragePool requantize an int32 accumulator: round(acc * scale) + zero;
- QLinearSoftmax scales by floor(1 / y_scale), as ONNX Runtime's kernel does.
Integer products accumulate in int32; float results are computed in float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from transmuter.errors import ShapeError
from transmuter.lowering import op
from transmuter.lowering.ops.pool import ordered_window_sums
from transmuter.lowering.ops.quantization import (
    INT_RANGES,
    dequantize_linear_v21,
    divide,
    dynamic_quantize_linear,
    integer_matmul,
    matmul_integer,
    quantize_linear_v21,
    quantize_linear_v23,
    requantize,
)
from transmuter.lowering.ops.rnn import LSTM, lengths, num_directions, recurrent
from transmuter.lowering.shared import normalize_axis

MS = "com.microsoft"
_F32 = np.dtype(np.float32)
_FLOAT = 1  # TensorProto.FLOAT


def _scalar(value, what: str):
    value = jnp.asarray(value)
    if value.size != 1:
        raise ShapeError(f"{what} must be a scalar (per-tensor), got shape {list(value.shape)}")
    return value.reshape(())


def _zero(zero_point, dtype):
    """A scalar zero point, 0 of `dtype` when absent."""
    if zero_point is None:
        return jnp.zeros((), dtype)
    return _scalar(zero_point, "the zero point")


def _dequantize(x, scale, zero_point):
    """Per-tensor (x - zero_point) * scale in float32."""
    x = jnp.asarray(x)
    return dequantize_linear_v21(x, _scalar(scale, "the scale"), _zero(zero_point, x.dtype))


def _rounded_dequantize(x, scale, zero_point):
    """(x - zero_point) * scale as float32 products that stay rounded inside a fused sum.

    XLA:CPU contracts a float32 product feeding an add into an FMA, which rounds once where
    ONNX Runtime rounds twice (1.6% of a QLinearAveragePool's outputs one step off). So the
    product is made without a float multiply that rounds: scale = m * 2^e with m a 24-bit
    integer, (x - zero_point) * m is exact in int64, its conversion to float32 is the one
    rounding (to nearest even, the float32 product's), and the power of two scales exactly."""
    x = jnp.asarray(x)
    shifted = x.astype(jnp.int64) - _zero(zero_point, x.dtype).astype(jnp.int64)
    fraction, exponent = jnp.frexp(_scalar(scale, "the scale").astype(_F32))
    mantissa = (fraction * jnp.float32(2**24)).astype(jnp.int64)
    power = jnp.ldexp(jnp.float32(1), exponent - 24)
    return (shifted * mantissa).astype(_F32) * power


def _quantize(value, scale, zero_point, dtype):
    """Per-tensor saturate(round(value / scale) + zero_point), to `dtype`."""
    return quantize_linear_v21(value, _scalar(scale, "the scale"), _zero(zero_point, dtype))


def _round_after_zero(value, zero_point, dtype):
    """saturate(round(value + zero_point)): ONNX Runtime's rounding where the zero point is
    added in float before rounding (QLinearAdd, QLinearMul, QLinearAveragePool)."""
    low, high = INT_RANGES[np.dtype(dtype)]
    value = jnp.round(value + _zero(zero_point, dtype).astype(_F32))
    return jnp.clip(value, low, high).astype(dtype)


def _ratio(numerator, denominator):
    """numerator / denominator of two per-tensor scales, an IEEE float32 division."""
    return divide(_scalar(numerator, "a scale"), _scalar(denominator, "C_scale"), _F32)


@op("QuantizeLinear", since=1, domain=MS)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=None):
    """com.microsoft QuantizeLinear-1: per-tensor or per-axis (axis defaults to 1).

    Float16 x is divided in float32, as ONNX Runtime's kernel does (ai.onnx QuantizeLinear-21
    divides in the scale's type)."""
    return quantize_linear_v23(
        x, y_scale, y_zero_point, axis=1 if axis is None else axis, precision=_FLOAT
    )


@op("DequantizeLinear", since=1, domain=MS, converts=True)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=None):
    """com.microsoft DequantizeLinear-1: per-tensor or per-axis (axis defaults to 1)."""
    return dequantize_linear_v21(x, x_scale, x_zero_point, axis=1 if axis is None else axis)


@op("QLinearAdd", since=1, domain=MS)
def qlinear_add(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """com.microsoft QLinearAdd-1: (A_scale(A - A_zp) + B_scale(B - B_zp)) / C_scale + C_zp."""
    a, b = jnp.asarray(A), jnp.asarray(B)
    da = a.astype(_F32) - _zero(A_zero_point, a.dtype).astype(_F32)
    db = b.astype(_F32) - _zero(B_zero_point, b.dtype).astype(_F32)
    value = da * _ratio(A_scale, C_scale) + db * _ratio(B_scale, C_scale)
    return _round_after_zero(value, C_zero_point, a.dtype)


@op("QLinearMul", since=1, domain=MS)
def qlinear_mul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    """com.microsoft QLinearMul-1: (A - A_zp)(B - B_zp) A_scale B_scale / C_scale + C_zp."""
    a, b = jnp.asarray(A), jnp.asarray(B)
    da = a.astype(_F32) - _zero(A_zero_point, a.dtype).astype(_F32)
    db = b.astype(_F32) - _zero(B_zero_point, b.dtype).astype(_F32)
    # da * db, a product of two 8-bit differences, is exact in float32.
    multiplier = _ratio(_scalar(A_scale, "A_scale") * _scalar(B_scale, "B_scale"), C_scale)
    return _round_after_zero(da * db * multiplier, C_zero_point, a.dtype)


@op("QLinearSigmoid", since=1, domain=MS)
def qlinear_sigmoid(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None):
    """com.microsoft QLinearSigmoid-1: quantize(sigmoid(dequantize(X)))."""
    x = jnp.asarray(X)
    value = jax.nn.sigmoid(_dequantize(x, X_scale, X_zero_point))
    return _quantize(value, Y_scale, Y_zero_point, x.dtype)


@op("QLinearLeakyRelu", since=1, domain=MS)
def qlinear_leaky_relu(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None, *, alpha=0.01):
    """com.microsoft QLinearLeakyRelu-1: quantize(leaky_relu(dequantize(X), alpha))."""
    x = jnp.asarray(X)
    value = _dequantize(x, X_scale, X_zero_point)
    value = jnp.where(value >= 0, value, value * jnp.float32(alpha))
    return _quantize(value, Y_scale, Y_zero_point, x.dtype)


@op("QLinearSoftmax", since=1, domain=MS)
def qlinear_softmax(X, X_scale, x_zero_point, y_scale, y_zero_point, *, axis=-1, opset):
    """com.microsoft QLinearSoftmax-1: softmax of dequantized X along `axis` (opset >= 13) or
    over the dims from `axis` on (opset < 13), quantized.

    ONNX Runtime's kernel multiplies the probabilities by floor(1 / y_scale), not 1 / y_scale
    (y_scale 1/255 gives at most 254); so does this. Its exponentials come from a float table
    summed in order, so an output can differ from it by one step where p / y_scale lies within
    float rounding of a half.
    """
    x = jnp.asarray(X)
    axis = normalize_axis(axis, x.ndim, "QLinearSoftmax: axis")
    shape = x.shape
    values = x.astype(jnp.int32)
    if opset < 13:
        # Softmax-1/11 semantics: the dims from `axis` on are one row.
        values = values.reshape(shape[:axis] + (math.prod(shape[axis:]),))
    # The zero point cancels: softmax is invariant to a shift of its input.
    high = jnp.max(values, axis=axis, keepdims=True, initial=np.iinfo(np.int32).min)
    exps = jnp.exp((values - high).astype(_F32) * _scalar(X_scale, "X_scale"))
    total = jnp.sum(exps, axis=axis, keepdims=True)
    multiplier = jnp.floor(divide(jnp.float32(1), _scalar(y_scale, "y_scale"), _F32))
    value = divide(exps * multiplier, total, _F32)
    zero = _scalar(y_zero_point, "y_zero_point")
    low, top = INT_RANGES[np.dtype(x.dtype)]
    y = jnp.clip(jnp.round(value) + zero.astype(_F32), low, top).astype(x.dtype)
    return y.reshape(shape)


def _channels_first(x, channels_last: int):
    return jnp.moveaxis(x, -1, 1) if channels_last else x


def _channels_back(x, channels_last: int):
    return jnp.moveaxis(x, 1, -1) if channels_last else x


@op("QLinearAveragePool", since=1, domain=MS)
def qlinear_average_pool(
    X,
    x_scale,
    x_zero_point,
    y_scale,
    y_zero_point=None,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    channels_last=0,
    count_include_pad=0,
    kernel_shape,
    pads=None,
    strides=None,
):
    """com.microsoft QLinearAveragePool-1: AveragePool of dequantized X, quantized;
    channels_last takes X as (N, D1, ..., C)."""
    x = jnp.asarray(X)
    value = _channels_first(_rounded_dequantize(x, x_scale, x_zero_point), channels_last)
    # ONNX Runtime's kernel: the dequantized window summed element by element in float32,
    # divided by the count, then by y_scale (two float32 divisions, never reciprocals).
    total, counts = ordered_window_sums(
        "QLinearAveragePool",
        value,
        count_include_pad,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
        kernel_shape=kernel_shape,
        strides=strides,
        dilations=None,
        pads=pads,
    )
    mean = divide(divide(total, counts, _F32), _scalar(y_scale, "y_scale"), _F32)
    return _channels_back(_round_after_zero(mean, y_zero_point, x.dtype), channels_last)


@op("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(
    X, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0
):
    """com.microsoft QLinearGlobalAveragePool-1: mean over the spatial axes (kept as size 1),
    requantized from the int32 sum as ONNX Runtime does."""
    x = jnp.asarray(X)
    if x.ndim < 3:
        raise ShapeError(f"QLinearGlobalAveragePool: X must have rank >= 3, got {list(x.shape)}")
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    count = math.prod(x.shape[a] for a in axes)
    shifted = x.astype(jnp.int32) - _zero(x_zero_point, x.dtype).astype(jnp.int32)
    acc = jnp.sum(shifted, axis=axes, keepdims=True)
    multiplier = divide(
        _scalar(x_scale, "x_scale"), _scalar(y_scale, "y_scale") * jnp.float32(count), _F32
    )
    return requantize(acc, multiplier, _zero(y_zero_point, x.dtype))


@op("QLinearReduceMean", since=1, domain=MS)
def qlinear_reduce_mean(
    data, data_scale, data_zero_point, reduced_scale, reduced_zero_point=None, *, axes, keepdims
):
    """com.microsoft QLinearReduceMean-1: ReduceMean of dequantized data, quantized (ONNX
    Runtime has no CPU kernel; this follows the spec's formula)."""
    x = jnp.asarray(data)
    axes = tuple(sorted({normalize_axis(a, x.ndim, "QLinearReduceMean: axis") for a in axes}))
    value = jnp.mean(
        _dequantize(x, data_scale, data_zero_point), axis=axes, keepdims=bool(keepdims)
    )
    return _quantize(value, reduced_scale, reduced_zero_point, x.dtype)


@op("QLinearConcat", since=1, domain=MS)
def qlinear_concat(Y_scale, Y_zero_point, *inputs, axis):
    """com.microsoft QLinearConcat-1: Concat of (tensor, scale, zero point) triples, each
    requantized to Y_scale / Y_zero_point."""
    if not inputs or len(inputs) % 3:
        raise ShapeError(
            f"QLinearConcat: inputs must be (tensor, scale, zero point) triples, got {len(inputs)}"
        )
    zero = _scalar(Y_zero_point, "Y_zero_point")
    parts = [
        _quantize(_dequantize(x, scale, zero_point), Y_scale, zero, zero.dtype)
        for x, scale, zero_point in zip(inputs[::3], inputs[1::3], inputs[2::3], strict=True)
    ]
    return jnp.concatenate(parts, axis=normalize_axis(axis, parts[0].ndim, "QLinearConcat: axis"))


@op("QLinearWhere", since=1, domain=MS)
def qlinear_where(
    condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale, z_zero_point
):
    """com.microsoft QLinearWhere-1: Where(condition, X, Y), both requantized to z's scale."""
    dtype = jnp.asarray(z_zero_point).dtype
    x = _quantize(_dequantize(X, x_scale, x_zero_point), z_scale, z_zero_point, dtype)
    y = _quantize(_dequantize(Y, y_scale, y_zero_point), z_scale, z_zero_point, dtype)
    return jnp.where(jnp.asarray(condition), x, y)


@op("QGemm", since=1, domain=MS)
def qgemm(
    A,
    a_scale,
    a_zero_point,
    B,
    b_scale,
    b_zero_point,
    C=None,
    y_scale=None,
    y_zero_point=None,
    *,
    alpha=1.0,
    transA=0,
    transB=0,
):
    """com.microsoft QGemm-1: alpha * a_scale * b_scale * ((A' - a_zp)(B' - b_zp) + C), where
    C is int32; quantized with y_scale and y_zero_point when y_zero_point is given.

    b_scale and b_zero_point are scalars or one value per column of B'. With y_scale but no
    y_zero_point, ONNX Runtime returns the float result divided by y_scale; so does this."""
    a, b = jnp.asarray(A), jnp.asarray(B)
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"QGemm: A and B must be 2-D, got {list(a.shape)} and {list(b.shape)}")
    a = a.T if transA else a
    b = b.T if transB else b
    acc = matmul_integer(a, b, _scalar(a_zero_point, "a_zero_point"), b_zero_point)
    if C is not None:
        acc = acc + jnp.broadcast_to(jnp.asarray(C).astype(jnp.int32), acc.shape)
    multiplier = jnp.float32(alpha) * _scalar(a_scale, "a_scale") * jnp.asarray(b_scale)
    if y_scale is not None:
        multiplier = divide(multiplier, _scalar(y_scale, "y_scale"), _F32)
    if y_zero_point is None:
        return acc.astype(_F32) * multiplier
    return requantize(acc, multiplier, _scalar(y_zero_point, "y_zero_point"))


def _scaled_product(acc, a_scale, b_scale, bias, dtype):
    """float(acc) * a_scale * b_scale (+ bias): the int32 product scaled back, in float32."""
    scale = jnp.asarray(a_scale).astype(_F32) * jnp.asarray(b_scale).astype(_F32)
    y = acc.astype(_F32) * scale
    if bias is not None:
        y = y + jnp.asarray(bias).astype(_F32)
    return y.astype(dtype)


@op("DynamicQuantizeMatMul", since=1, domain=MS)
def dynamic_quantize_matmul(A, B, b_scale, b_zero_point=None, bias=None):
    """com.microsoft DynamicQuantizeMatMul-1: A quantized to uint8 with DynamicQuantizeLinear,
    then (A_q - a_zp) @ (B - b_zp) * a_scale * b_scale + bias."""
    a_q, a_scale, a_zero = dynamic_quantize_linear(A)
    acc = matmul_integer(a_q, B, a_zero, b_zero_point)
    return _scaled_product(acc, a_scale, b_scale, bias, _F32)


@op("MatMulIntegerToFloat", since=1, domain=MS)
def matmul_integer_to_float(
    A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None
):
    """com.microsoft MatMulIntegerToFloat-1: (A - a_zp) @ (B - b_zp) * a_scale * b_scale +
    bias, in a_scale's type (scales: scalars or one value per column of B)."""
    acc = matmul_integer(A, B, a_zero_point, b_zero_point)
    return _scaled_product(acc, a_scale, b_scale, bias, jnp.asarray(a_scale).dtype)


def _fake_quantize(x):
    """x as ONNX Runtime's quantized GEMMs see it: DynamicQuantizeLinear, then dequantized.

    (q - zero) * scale times dequantized weights equals the integer product scaled back, up to
    float32 rounding."""
    q, scale, zero = dynamic_quantize_linear(x)
    return (q.astype(_F32) - zero.astype(_F32)) * scale


def _lstm_weights(w, scale, zero_point, num_dir: int, what: str):
    """Quantized [num_directions, rows, 4 * hidden] weights dequantized and transposed to the
    ai.onnx LSTM layout [num_directions, 4 * hidden, rows]."""
    w = jnp.asarray(w)
    if w.ndim != 3 or w.shape[0] != num_dir or w.shape[2] % 4:
        raise ShapeError(
            f"DynamicQuantizeLSTM: {what} must be [{num_dir}, rows, 4 * hidden_size], got "
            f"{list(w.shape)}"
        )
    scale, zero_point = jnp.asarray(scale), jnp.asarray(zero_point)
    for value, name in ((scale, f"{what}_scale"), (zero_point, f"{what}_zero_point")):
        if value.shape not in ((num_dir,), (num_dir, w.shape[2])):
            raise ShapeError(
                f"DynamicQuantizeLSTM: {name} must be [{num_dir}] (per tensor) or "
                f"[{num_dir}, {w.shape[2]}] (per column), got {list(value.shape)}"
            )
    scale = scale.astype(_F32).reshape(num_dir, 1, -1)
    zero = zero_point.astype(_F32).reshape(num_dir, 1, -1)
    return jnp.swapaxes((w.astype(_F32) - zero) * scale, 1, 2)


@op("DynamicQuantizeLSTM", since=1, domain=MS, context=True)
def dynamic_quantize_lstm(
    ctx,
    X,
    W,
    R,
    B,
    sequence_lens,
    initial_h,
    initial_c,
    P,
    W_scale,
    W_zero_point,
    R_scale,
    R_zero_point,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    input_forget=0,
):
    """com.microsoft DynamicQuantizeLSTM-1: ai.onnx LSTM with int8/uint8 W [D, input, 4H] and
    R [D, H, 4H], X and every step's hidden state quantized to uint8 on the fly.

    As ONNX Runtime's kernel run on one thread: X is quantized once over its first
    max(sequence_lens) steps, and at each step the hidden state of the whole batch is quantized
    before its product with R. (With more threads ONNX Runtime quantizes the hidden state per
    chunk of the batch, so its results depend on its thread count, by about 1e-3.)
    """
    num_dir = num_directions(direction)
    x = jnp.asarray(X).astype(_F32)
    if x.ndim != 3:
        raise ShapeError(f"DynamicQuantizeLSTM: X must be 3-D, got {list(x.shape)}")
    steps, batch, _ = x.shape
    w = _lstm_weights(W, W_scale, W_zero_point, num_dir, "W")
    r = _lstm_weights(R, R_scale, R_zero_point, num_dir, "R")
    hidden = r.shape[2]
    if r.shape[1] != 4 * hidden or w.shape[1] != 4 * hidden or w.shape[2] != x.shape[2]:
        raise ShapeError(
            f"DynamicQuantizeLSTM: W {list(jnp.shape(W))} and R {list(jnp.shape(R))} do not "
            f"fit X {list(x.shape)} (W: [D, input, 4H], R: [D, H, 4H])"
        )
    lens = lengths(sequence_lens, steps, batch)
    if lens is not None:
        # Steps past the longest sequence are left out of X's range (0 is in it anyway).
        x = jnp.where((jnp.arange(steps, dtype=jnp.int32) < jnp.max(lens))[:, None, None], x, 0.0)

    def quantized_product(h, quantized_r, step):
        # ONNX Runtime zeroes a sequence's state once it has ended, so the hidden state quantized
        # at a step holds zeros for sequences that ended before the previous step.
        if lens is not None:
            h = jnp.where((step <= lens)[:, None], h, 0.0)
        r_int, r_zero, r_scale = quantized_r
        q, scale, zero = dynamic_quantize_linear(h)
        # As ONNX Runtime's quantized GEMM: the integer product, exact, scaled once per column.
        return integer_matmul(q, r_int, zero, r_zero).astype(_F32) * (scale * r_scale)

    per_column = jnp.shape(R_scale)[-1:] == (r.shape[1],)
    quantized_r = (  # per direction: R [H, 4H], its zero point and scale (scalars or [4H])
        jnp.asarray(R),
        jnp.asarray(R_zero_point).reshape(num_dir, *(r.shape[1:2] if per_column else ())),
        jnp.asarray(R_scale).astype(_F32).reshape(num_dir, *(r.shape[1:2] if per_column else ())),
    )
    return recurrent(
        ctx, LSTM, _fake_quantize(x), w, r, B, sequence_lens, initial_h, initial_c, P,
        activation_alpha=activation_alpha, activation_beta=activation_beta,
        activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
        layout=0, input_forget=input_forget, recurrent_product=quantized_product,
        recurrent_weights=quantized_r,
    )  # fmt: skip
