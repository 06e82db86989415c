"""The real Kokoro-82M int8 file (kokoro-onnx's kokoro-v1.0.int8.onnx) through the text-to-speech
pipeline, against ONNX Runtime on the same file. Runs where bench/get_kokoro.py has written the
repo (TRANSMUTER_KOKORO_REPO, or its default ~/.cache/transmuter/Kokoro-82M-v1.0-ONNX); CI does
not download it, so there it is skipped. The comparison helpers are bench/bench_kokoro_real.py's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_kokoro_real as real  # noqa: E402

import transmuter  # noqa: E402

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        not (real.REPO / real.MODEL).is_file(),
        reason=f"no {real.REPO / real.MODEL}: run bench/get_kokoro.py (or set "
        "TRANSMUTER_KOKORO_REPO)",
    ),
]


@pytest.fixture(scope="module")
def speak():
    return transmuter.pipeline("text-to-speech", str(real.REPO), dtype="q8", voice=real.VOICE)


@pytest.fixture(scope="module")
def compared(speak) -> list[dict]:
    reference = real.ort_session(real.REPO, reference=True)
    pack = real.voice_pack(real.REPO)
    rows = []
    for phonemes in real.SENTENCES:
        ids = [speak.vocab[c] for c in phonemes]
        rows.append(real.compare(speak, reference, ids, pack[len(ids) - 1], phonemes))
    return rows


def test_the_q8_pipeline_speaks(speak):
    out = speak(real.SENTENCES[0], phonemes=True)
    assert out["sampling_rate"] == 24000
    assert not np.isnan(out["audio"]).any()
    assert out["audio"].size == int(out["durations"].sum()) * real.FRAME_SAMPLES > 0
    assert np.abs(out["audio"]).max() > 0.01  # speech, not silence


def test_a_new_token_count_compiles_nothing_before_the_durations(speak):
    """The file has no token mask: `mask_padded_tokens` gives it one, so token counts in one
    bucket (128) share the program before the durations' break (about 7 s to compile)."""
    assert speak.pads_tokens
    speak(real.SENTENCES[2][:50], phonemes=True)
    compiled = []

    def count(event, measurements, metadata):
        if metadata.get("compiled") and metadata["position"] == 0:
            compiled.append(metadata)

    transmuter.telemetry.attach("kokoro-real", ["transmuter.segment.compile.stop"], count)
    try:
        speak(real.SENTENCES[2][:70], phonemes=True)
    finally:
        transmuter.telemetry.detach("kokoro-real")
    assert not compiled


def test_durations_equal_orts_where_they_are_stable(compared):
    # Measured: 0-2 tokens of 37-87 a frame off where ORT keeps them under a 1e-6 nudge.
    for row in compared:
        assert row["... where ORT's are stable"] <= 2, row


@pytest.mark.xfail(
    strict=True,
    reason="ORT's STFT of 20 samples leaves ~1e-6 in the DC and Nyquist bins' imaginary parts, "
    "where a real signal's (torch's, Transmuter's) are 0; the exported atan2 makes other phases "
    "of them, which the vocoder reads, and a duration a frame off moves every later phase: "
    "2.0x, 4.4x and 1.4x ORT's noise on a Xeon with AMX, 2.0x, 1.7x and 1.4x on one without, "
    "1.9x, 1.7x and 4.4x on an AMD EPYC; 0.8x with "
    "only those STFT values taken from ORT (bench/README.md, the real Kokoro-82M int8)",
)
def test_audio_within_twice_orts_own_noise(compared):
    for row in compared:
        assert not row["nan"]
        assert row["log-mel T vs ORT"] <= 2 * row["log-mel ORT vs ORT, style 1e-6"], row
