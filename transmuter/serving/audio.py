"""OpenAI's `POST /v1/audio/transcriptions` on an automatic-speech-recognition pipeline: a
multipart upload of a WAV file (PCM, the preprocessor's sampling rate; stereo is averaged to
mono), `model`, `language`, `response_format` "json" or "text".
Part of `transmuter serve`: `pip install transmuter[serve]`.
"""

from __future__ import annotations

import io
import wave
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request
from starlette.responses import PlainTextResponse

from transmuter.serving.protocol import ApiError, PydanticResponse

if TYPE_CHECKING:
    from transmuter.serving.http import Server

# PCM sample widths in bytes, as numpy reads them (8-bit WAV is unsigned, centred on 128).
_PCM = {1: np.uint8, 2: np.dtype("<i2"), 4: np.dtype("<i4")}


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A WAV file's samples as float32 in [-1, 1], averaged to mono, and its sampling rate."""
    try:
        with wave.open(io.BytesIO(data)) as file:
            width, channels, rate = file.getsampwidth(), file.getnchannels(), file.getframerate()
            frames = file.readframes(file.getnframes())
    except (wave.Error, EOFError) as error:
        raise ApiError(400, f"'file' is not a WAV file the server reads ({error}); send PCM WAV",
                       param="file") from None  # fmt: skip
    if width not in _PCM:
        raise ApiError(400, f"'file' has {8 * width}-bit samples; the server reads 8, 16 or "
                       "32-bit PCM", param="file")  # fmt: skip
    samples = np.frombuffer(frames, _PCM[width]).astype(np.float32)
    if width == 1:
        samples = samples - 128
    samples /= float(2 ** (8 * width - 1))
    return samples.reshape(-1, channels).mean(axis=1), rate


async def transcriptions(server: Server, request: Request) -> Any:
    try:
        form = await request.form()
    except Exception as error:  # not multipart, or a malformed body
        raise ApiError(400, f"send multipart/form-data with a 'file' ({error})") from None
    server.check_model(form.get("model"))
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "'file' must be an uploaded audio file", param="file")
    samples, rate = read_wav(await upload.read())
    wanted = server.repo.preprocessor_config.get("sampling_rate")
    if rate != wanted:
        raise ApiError(400, f"'file' is sampled at {rate} Hz; this model takes {wanted} Hz: "
                       "resample it first", param="file")  # fmt: skip
    response_format = form.get("response_format", "json")
    if response_format not in ("json", "text"):
        raise ApiError(400, "'response_format' must be 'json' or 'text'", param="response_format")
    options = {"language": form["language"]} if form.get("language") else {}
    (row,) = await server.infer([{"array": samples, "sampling_rate": rate}], **options)
    if response_format == "text":
        return PlainTextResponse(row["text"])
    return PydanticResponse({"text": row["text"]})
