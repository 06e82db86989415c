"""Signal processing: DFT, STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix.

ONNX has no complex tensors here: a signal carries a trailing axis of 1 (real) or 2 (real,
imaginary); STFT also takes a real [batch, length] without it, as ONNX Runtime does (for DFT
neither does). The transforms build a complex array, call `jnp.fft`, and split it again;
float16 and bfloat16 are transformed in float32 and rounded once. Transform lengths, axes, frame
sizes and the window/mel parameters decide output shapes, so they are host inputs; the windows
and the mel matrix depend on nothing else and are computed with numpy on the host (float64,
then cast).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from transmuter import dtypes
from transmuter.dtypes import accumulation_dtype
from transmuter.errors import ShapeError
from transmuter.lowering import Attribute, op, variant
from transmuter.lowering.shared import host_scalar

# T2 of the windows and T3 of MelWeightMatrix: every real number type but bool.
_NUMERIC = frozenset(dtypes.from_onnx(code) for code in (1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 16))


def _flag(value: int, name: str) -> bool:
    if value not in (0, 1):
        raise ValueError(f"the {name} attribute must be 0 or 1, got {value}")
    return bool(value)


def _host_int(value, what: str, minimum: int) -> int:
    number = int(host_scalar(value, what))
    if number < minimum:
        raise ShapeError(f"{what} must be >= {minimum}, got {number}")
    return number


def _to_complex(x, what: str):
    """A [..., 1] or [..., 2] signal as (the real or complex values, is_complex)."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ShapeError(
            f"{what} must end with an axis of 1 (real) or 2 (real, imaginary), got shape "
            f"{list(x.shape)}"
        )
    x = x.astype(accumulation_dtype(x.dtype))
    if x.shape[-1] == 1:
        return x[..., 0], False
    return lax.complex(x[..., 0], x[..., 1]), True


def _split(z, dtype):
    """A complex array as [..., 2] (real, imaginary) in `dtype`."""
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1).astype(dtype)


# ---------------------------------------------------------------------------------------- DFT


def _dft(x, dft_length, axis: int, inverse: int, onesided: int):
    x = jnp.asarray(x)
    rank = x.ndim
    # The last axis holds the real/imaginary parts, so it is no signal axis.
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ShapeError(
            f"DFT axis {axis} is out of range for an input of rank {rank} (expected "
            f"[{-rank}, -2] or [0, {rank - 2}])"
        )
    axis %= rank
    inverse, onesided = _flag(inverse, "inverse"), _flag(onesided, "onesided")
    signal, is_complex = _to_complex(x, "DFT input")
    size = signal.shape[axis]
    if dft_length is not None:
        n = _host_int(dft_length, "DFT dft_length", 1)
    else:
        n = 2 * (size - 1) if inverse and onesided else size
        if n < 1:
            raise ShapeError(
                f"DFT: the default dft_length is {n} for axis {axis} of size {size}; pass a "
                "positive dft_length"
            )
    if onesided and inverse:
        if not is_complex:
            raise ShapeError("DFT: the inverse one-sided transform (IRFFT) takes complex input")
        # numpy's irfft: the first n // 2 + 1 bins are used, zero-padded when fewer.
        return jnp.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
    if onesided:
        if is_complex:
            raise ShapeError("DFT: the one-sided forward transform (RFFT) takes real input")
        return _split(jnp.fft.rfft(signal, n=n, axis=axis), x.dtype)
    if not is_complex:
        spectrum = _real_fft(signal, n, axis)
        # ifft(x) = conj(fft(x)) / n for real x.
        return _split(jnp.conj(spectrum) / n if inverse else spectrum, x.dtype)
    transform = jnp.fft.ifft if inverse else jnp.fft.fft
    return _split(transform(signal, n=n, axis=axis), x.dtype)


def _real_fft(signal, n: int, axis: int):
    """The full spectrum of a real signal, from rfft and its conjugate mirror: half the work, and
    exactly Hermitian (a plain complex fft leaves float32 rounding in the zero imaginary parts
    of the DC and Nyquist bins)."""
    half = jnp.fft.rfft(signal, n=n, axis=axis)
    mirror = jnp.flip(lax.slice_in_dim(half, 1, (n + 1) // 2, axis=axis), axis)
    return jnp.concatenate([half, jnp.conj(mirror)], axis=axis)


@op(
    "DFT",
    since=20,
    host_inputs={"dft_length": "the transform length", "axis": "the transform axis"},
)
def dft_v20(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """ONNX DFT-20: (inverse) discrete Fourier transform along the `axis` input (default -2)."""
    axis = -2 if axis is None else int(host_scalar(axis, "DFT axis"))
    return _dft(input, dft_length, axis, inverse, onesided)


dft_v17 = op("DFT", since=17, host_inputs={"dft_length": "the transform length"})(variant(
    dft_v20, "dft_v17",
    "ONNX DFT-17: (inverse) discrete Fourier transform along the `axis` attribute.",
    attributes={"axis": Attribute("axis", 1)},
))  # fmt: skip


# --------------------------------------------------------------------------------------- STFT


@op(
    "STFT",
    since=17,
    host_inputs={"frame_step": "the hop between frames", "frame_length": "the frame size"},
)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """ONNX STFT-17: windowed DFTs of frames of a [batch, length, 1|2] (or real [batch, length])
    signal -> [batch, frames, bins, 2]."""
    x = jnp.asarray(signal)
    if x.ndim == 2:
        # A real signal without its trailing axis of 1: not in the spec, but ONNX Runtime takes
        # it and torch.onnx's stft writes it (Kokoro-82M's iSTFTNet).
        x = x[..., None]
    if x.ndim != 3:
        raise ShapeError(
            f"STFT signal must be [batch, signal_length, 1 or 2] or a real [batch, "
            f"signal_length], got shape {list(x.shape)}"
        )
    onesided = _flag(onesided, "onesided")
    z, is_complex = _to_complex(x, "STFT signal")
    length = x.shape[1]
    step = _host_int(frame_step, "STFT frame_step", 1)
    if window is not None and jnp.ndim(window) != 1:
        raise ShapeError(f"STFT window must be 1-D, got shape {list(jnp.shape(window))}")
    if frame_length is not None:
        size = _host_int(frame_length, "STFT frame_length", 1)
        if window is not None and window.shape[0] != size:
            raise ShapeError(f"STFT window has length {window.shape[0]} but frame_length is {size}")
    else:
        size = length if window is None else window.shape[0]
    if size < 1 or size > length:
        raise ShapeError(f"STFT frame_length {size} must be in [1, signal_length={length}]")
    frames = (length - size) // step + 1
    starts = np.arange(frames)[:, None] * step
    z = z[:, starts + np.arange(size)]  # [batch, frames, frame_length]
    if window is not None:
        z = z * jnp.asarray(window).astype(z.dtype)
    if onesided and not is_complex:
        return _split(jnp.fft.rfft(z, axis=-1), x.dtype)
    spectrum = _real_fft(z, size, z.ndim - 1) if not is_complex else jnp.fft.fft(z, axis=-1)
    if onesided:
        # The spec calls a one-sided complex STFT impossible, yet onesided=1 is the default;
        # ONNX Runtime and onnx.reference keep the first size // 2 + 1 bins, and so do we.
        spectrum = spectrum[..., : size // 2 + 1]
    return _split(spectrum, x.dtype)


# ------------------------------------------------------------------------------------ windows


def _output_dtype(code: int, op_type: str) -> np.dtype:
    dtype = dtypes.from_onnx(code)
    if dtype not in _NUMERIC:
        raise ValueError(f"{op_type}: output_datatype {code} ({dtype.name}) is not a valid output")
    return dtype


def _cosine_window(size, periodic: int, output_datatype: int, coefficients, op_type: str):
    """sum_k (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric)."""
    count = _host_int(size, f"{op_type} size", 0)
    out = _output_dtype(output_datatype, op_type)
    period = count if _flag(periodic, "periodic") else count - 1
    n = np.arange(count, dtype=np.float64)
    # A symmetric window of size 1 is 0/0 in the spec's formula: NaN, as in ONNX Runtime and
    # onnx.reference.
    with np.errstate(divide="ignore", invalid="ignore"):
        phase = 2 * np.pi * n / period
        terms = [(-1) ** k * a * np.cos(k * phase) for k, a in enumerate(coefficients)]
        # Adding a0 last makes the peak exactly 1 (0.42 + 0.5 + 0.08 is not), which matters
        # when output_datatype is an integer type and the cast truncates.
        window = sum(reversed(terms))
        return np.asarray(window, dtype=np.float64).astype(out)


_WINDOWS = (
    ("HannWindow", (0.5, 0.5)),
    # alpha = 25/46 (Hamming's exact cancellation of the first sidelobe), as ONNX Runtime uses.
    ("HammingWindow", (25 / 46, 21 / 46)),
    ("BlackmanWindow", (0.42, 0.5, 0.08)),
)


def _register_window(op_type: str, coefficients: tuple[float, ...]) -> None:
    def window(size, *, output_datatype=1, periodic=1):
        return _cosine_window(size, periodic, output_datatype, coefficients, op_type)

    window.__name__ = window.__qualname__ = op_type.replace("Window", "").lower() + "_window"
    window.__doc__ = f"ONNX {op_type}-17: a periodic or symmetric window of `size` points."
    op(op_type, since=17, host_inputs={"size": "the window length"})(window)


for _op_type, _coefficients in _WINDOWS:
    _register_window(_op_type, _coefficients)


# -------------------------------------------------------------------------------- mel weights


@op(
    "MelWeightMatrix",
    since=17,
    host_inputs={
        "num_mel_bins": "the number of mel bands",
        "dft_length": "the DFT size",
        "sample_rate": "the sample rate",
        "lower_edge_hertz": "the lowest band edge",
        "upper_edge_hertz": "the highest band edge",
    },
)
def mel_weight_matrix(
    num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *, output_datatype=1
):
    """ONNX MelWeightMatrix-17: triangular mel filters, [dft_length // 2 + 1, num_mel_bins]."""
    bands = _host_int(num_mel_bins, "MelWeightMatrix num_mel_bins", 0)
    length = _host_int(dft_length, "MelWeightMatrix dft_length", 1)
    rate = _host_int(sample_rate, "MelWeightMatrix sample_rate", 1)
    out = _output_dtype(output_datatype, "MelWeightMatrix")
    low, high = (
        2595.0 * np.log10(1.0 + float(host_scalar(v, "MelWeightMatrix edge")) / 700.0)
        for v in (lower_edge_hertz, upper_edge_hertz)
    )
    # The spec leaves the band layout open; this is the one ONNX Runtime and onnx.reference share:
    # bands + 2 mel points spaced (high - low) / (bands + 2) apart (so the last one stays below
    # upper_edge_hertz), each mapped to DFT bin floor((dft_length + 1) * hz / sample_rate).
    mel = low + (high - low) / (bands + 2) * np.arange(bands + 2)
    hertz = 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    edges = ((length + 1) * hertz // rate).astype(np.int64)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(length // 2 + 1)[:, None]
    rising = np.where(center > left, (j - left) / np.maximum(center - left, 1), 1.0)
    falling = (right - j) / np.maximum(right - center, 1)
    weights = np.where(
        (j >= left) & (j <= center), rising, np.where((j > center) & (j < right), falling, 0.0)
    )
    return weights.astype(out)
