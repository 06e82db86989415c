"""What the audio tasks take as one clip, as transformers' audio pipelines take it: a 1-D float
array at the model's sampling rate, or a {"array" (or "raw"), "sampling_rate"} dict. Audio files
and other rates are refused with what to do (transformers decodes files with ffmpeg and
resamples with torchaudio; neither is a dependency here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transmuter.errors import InputError

DESCRIPTION = 'a waveform (a 1-D float array or a {"array", "sampling_rate"} dict)'


class WaveformItems:
    """The item of an audio task (put before its Task base): one clip, as `is_waveform` says."""

    def is_item(self, value: Any) -> bool:
        return is_waveform(value)

    def describe_items(self) -> str:
        return f"give {DESCRIPTION}, a list or a generator of them"


def is_waveform(value: Any) -> bool:
    """Whether `value` is one clip (or a file, which `waveform` refuses), not a list of them."""
    return isinstance(value, (np.ndarray, Mapping, str, bytes))


def waveform(value: Any, rate: int) -> np.ndarray:
    """The clip `value` as a 1-D float array sampled at `rate` Hz."""
    if isinstance(value, (str, bytes)):
        raise InputError(
            "give the audio as a waveform (decode files first, e.g. with soundfile); got "
            f"a {type(value).__name__}"
        )
    if isinstance(value, Mapping):
        if "sampling_rate" not in value or not ({"array", "raw"} & set(value)):
            raise InputError(
                'a waveform dict has "sampling_rate" and "array" (or "raw"); got keys '
                f"{sorted(value)}"
            )
        if value["sampling_rate"] != rate:
            raise InputError(
                f"the waveform is sampled at {value['sampling_rate']} Hz and the model takes "
                f"{rate} Hz: resample it first"
            )
        value = value["array"] if "array" in value else value["raw"]
    wave = np.asarray(value)
    if wave.ndim != 1 or wave.size == 0 or not np.issubdtype(wave.dtype, np.floating):
        raise InputError(
            f"a waveform is a non-empty 1-D float array; got {wave.dtype}{list(wave.shape)}"
        )
    return wave
