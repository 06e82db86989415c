"""OpenAI's /v1/audio/transcriptions on the Whisper fixture through a real server and the
official openai client: a WAV upload's text is the pipeline's on the same samples; other
sampling rates and files that are not WAV are 400s naming 'file'."""

from __future__ import annotations

import io
import sys
import wave
from pathlib import Path

import numpy as np
import openai
import pytest
from test_http import Running

import transmuter
from transmuter import load_repo
from transmuter.errors import InputError
from transmuter.serving.api import ApiError
from transmuter.serving.audio import read_wav
from transmuter.serving.http import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from waveforms import waveforms  # noqa: E402

REPO = Path(__file__).resolve().parents[1] / "fixtures" / "pipelines" / "whisper"


def wav_bytes(samples: np.ndarray, rate: int = 16000, channels: int = 1) -> bytes:
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(np.repeat(pcm, channels).tobytes())
    return buffer.getvalue()


def test_wav_files_read_as_float_mono():
    wave_ = waveforms()[0]
    mono, rate = read_wav(wav_bytes(wave_))
    stereo, _ = read_wav(wav_bytes(wave_, channels=2))
    assert rate == 16000 and mono.dtype == np.float32
    np.testing.assert_allclose(mono, wave_, atol=2 / 32768)  # 16-bit rounding and scale
    np.testing.assert_array_equal(stereo, mono)
    with pytest.raises(ApiError, match="not a WAV file") as error:
        read_wav(b"ID3 an mp3")
    assert error.value.param == "file"


@pytest.mark.slow  # Whisper's "past" decoding compiles a program per token
def test_transcriptions_are_the_pipelines():
    # The server and the reference both decode "padded" (a program per bucket, where "past"
    # compiles one per token): what is checked is the server's answer against the pipeline's.
    server = Running(REPO, "automatic-speech-recognition", "--no-warmup", "--decoding", "padded")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        data = wav_bytes(waveforms()[1])
        samples, _ = read_wav(data)
        reference = transmuter.pipeline("automatic-speech-recognition", REPO, decoding="padded")
        want = reference(samples)["text"]
        got = client.audio.transcriptions.create(model="whisper", file=("a.wav", data))
        assert got.text == want
        text = server.http.post("/v1/audio/transcriptions",
                                data={"model": "whisper", "response_format": "text"},
                                files={"file": ("a.wav", data)})  # fmt: skip
        assert text.text == want
        slow = server.http.post("/v1/audio/transcriptions", data={"model": "whisper"},
                                files={"file": ("a.wav", wav_bytes(samples, rate=8000))})  # fmt: skip
        assert slow.status_code == 400 and slow.json()["error"]["param"] == "file"
        assert "resample" in slow.json()["error"]["message"]
    finally:
        assert server.stop()


def test_decoding_is_speech_recognitions_option():
    with pytest.raises(InputError, match="decoding is automatic-speech-recognition's"):
        Server(load_repo(REPO), "feature-extraction", model_id="whisper", decoding="padded")
