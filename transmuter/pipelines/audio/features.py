"""Audio features with numpy, as transformers' feature extractors compute them from
preprocessor_config.json.

- `log_mel`: Whisper's (n_fft, hop_length, feature_size, sampling_rate, chunk_length): each
  waveform padded with zeros (or cut) to chunk_length seconds, a centered STFT with a periodic
  Hann window (reflect padding), the power spectrum through a Slaney mel filter bank (0 to
  8 kHz), log10, clipped to 8 below its maximum, then (x + 4) / 4.
- `kaldi_fbank`: Kaldi's log mel filter bank (the Audio Spectrogram Transformer's features):
  25 ms frames every 10 ms, no padding at the edges; each frame's mean removed, pre-emphasis
  0.97, a symmetric Hann window, zero-padded to 512 points; the power spectrum through
  triangles evenly spaced on Kaldi's mel scale (1127 ln(1 + f / 700)) from 20 Hz to Nyquist;
  the natural log, floored at float32's epsilon.

Numpy only (tests/fixtures/make_pipelines.py loads this file by path to check it against
transformers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

MAX_FREQUENCY = 8000.0  # WhisperFeatureExtractor's filter bank stops here


def log_mel(waveforms: Sequence[np.ndarray], config: Mapping[str, Any]) -> np.ndarray:
    """float32 [batch, feature_size, chunk frames] log-mel features of 1-D waveforms sampled at
    config["sampling_rate"]."""
    n_fft = int(config.get("n_fft", 400))
    hop = int(config.get("hop_length", 160))
    mels = int(config.get("feature_size", config.get("n_mels", 80)))
    rate = int(config.get("sampling_rate", 16000))
    samples = int(config.get("n_samples", int(config.get("chunk_length", 30)) * rate))
    filters = mel_filters(1 + n_fft // 2, mels, rate)
    window = np.hanning(n_fft + 1)[:-1]
    found = []
    for wave in waveforms:
        wave = np.asarray(wave, np.float64)[:samples]
        wave = np.pad(wave, (0, samples - wave.shape[0]))
        padded = np.pad(wave, n_fft // 2, mode="reflect")
        count = 1 + (padded.shape[0] - n_fft) // hop
        starts = hop * np.arange(count)[:, None] + np.arange(n_fft)[None]
        power = np.abs(np.fft.rfft(padded[starts] * window, n=n_fft)) ** 2  # [frames, bins]
        spec = np.log10(np.maximum(filters.T @ power.T, 1e-10))[:, :-1]
        spec = np.maximum(spec, spec.max() - 8.0)
        found.append((spec + 4.0) / 4.0)
    return np.stack(found).astype(np.float32)


def mel_filters(bins: int, mels: int, rate: int) -> np.ndarray:
    """[bins, mels] triangular filters, Slaney's mel scale and area normalization."""
    edges = _mel_to_hertz(np.linspace(0.0, _hertz_to_mel(MAX_FREQUENCY), mels + 2))
    frequencies = np.linspace(0, rate // 2, bins)
    slopes = edges[None, :] - frequencies[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    bank = np.maximum(0.0, np.minimum(down, up))
    return bank * (2.0 / (edges[2 : mels + 2] - edges[:mels]))[None, :]


_LOG_STEP = 27.0 / np.log(6.4)  # Slaney: linear to 1 kHz (15 mels), logarithmic above


def _hertz_to_mel(hertz):
    hertz = np.asarray(hertz, np.float64)
    mel = 3.0 * hertz / 200.0
    above = hertz >= 1000.0
    return np.where(above, 15.0 + np.log(np.maximum(hertz, 1e-10) / 1000.0) * _LOG_STEP, mel)


def _mel_to_hertz(mel):
    mel = np.asarray(mel, np.float64)
    hertz = 200.0 * mel / 3.0
    return np.where(mel >= 15.0, 1000.0 * np.exp((mel - 15.0) / _LOG_STEP), hertz)


KALDI_FRAME, KALDI_HOP, KALDI_FFT = 400, 160, 512  # 25 ms, 10 ms at 16 kHz; next power of two
KALDI_LOW_FREQUENCY = 20.0
KALDI_FLOOR = float(np.finfo(np.float32).eps)


def kaldi_fbank(wave: np.ndarray, mels: int, rate: int) -> np.ndarray:
    """float32 [frames, mels] log mel filter bank energies of a 1-D waveform."""
    wave = np.asarray(wave, np.float64)
    count = 1 + (wave.shape[0] - KALDI_FRAME) // KALDI_HOP
    if count < 1:
        return np.zeros((0, mels), np.float32)
    starts = KALDI_HOP * np.arange(count)[:, None] + np.arange(KALDI_FRAME)[None]
    frames = wave[starts]
    frames = frames - frames.mean(axis=1, keepdims=True)
    # Pre-emphasis, the first sample against itself as Kaldi does.
    frames = np.concatenate([frames[:, :1] * (1 - 0.97), frames[:, 1:] - 0.97 * frames[:, :-1]], 1)
    frames = frames * np.hanning(KALDI_FRAME)
    power = np.abs(np.fft.rfft(frames, n=KALDI_FFT)) ** 2  # [frames, 257]
    energies = np.maximum(power @ kaldi_mel_filters(mels, rate), KALDI_FLOOR)
    return np.log(energies).astype(np.float32)


def kaldi_mel_filters(mels: int, rate: int) -> np.ndarray:
    """[257, mels] triangles, linear in Kaldi's mel scale, no area normalization."""
    mel = lambda hertz: 1127.0 * np.log1p(np.asarray(hertz, np.float64) / 700.0)  # noqa: E731
    edges = np.linspace(mel(KALDI_LOW_FREQUENCY), mel(rate / 2), mels + 2)
    bins = mel(np.arange(KALDI_FFT // 2 + 1) * rate / KALDI_FFT)
    up = (bins[:, None] - edges[None, :-2]) / np.diff(edges)[None, :-1]
    down = (edges[None, 2:] - bins[:, None]) / np.diff(edges)[None, 1:]
    return np.maximum(0.0, np.minimum(up, down))
