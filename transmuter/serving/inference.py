"""`POST /predict` for every task without an OpenAI or TEI route, in the Hugging Face Inference
API's shape: `{"inputs": ..., "parameters": {...}}`, the answer being what the task's pipeline
returns for `pipeline(inputs, **parameters)` (numpy arrays as lists, images as PNG data URLs).

What `inputs` holds follows the task's kind, read from the registry (pipelines/registry.py):
- text tasks: the pipeline's own input forms as JSON (a text, a list of texts,
  question-answering's {"question", "context"});
- image tasks (vision.*): each image as a base64 string of an image file or a `data:` URL of
  one (`data:image/png;base64,...`), alone, in a list, or as the "image" of a dict item
  (zero-shot-object-detection's {"image", "candidate_labels"}). A string is never read as a
  path on the server. Images past MAX_IMAGE_PIXELS are refused before they are decoded;
- audio tasks (audio.*, not text-to-speech): each clip as a base64 WAV file (or data URL), or
  {"array": [samples], "sampling_rate": n}.
`parameters` are the pipeline's per-call options, their names checked against its signature.
Part of `transmuter serve`: `pip install transmuter[serve]`, and `transmuter[image]` for images.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import io
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request

from transmuter.pipelines.registry import entry
from transmuter.serving.api import ApiError, read_body
from transmuter.serving.audio import read_wav
from transmuter.serving.protocol import InferenceRequest

if TYPE_CHECKING:
    from transmuter.pipelines import Repo
    from transmuter.serving.http import Server

MAX_IMAGE_PIXELS = 4096 * 4096
# Per-call options that are not JSON values (a PRNG key, callbacks): never from a request.
_NOT_PARAMETERS = {"key", "on_token", "callback", "generator", "batch_size"}
_SPEECH = {"text-to-speech", "text-to-audio"}


def input_kind(task: str) -> str:
    """ "text", "image" or "audio": what a request's items are for `task`."""
    package = entry(task).target.split(".")[0]
    if package == "vision":
        return "image"
    if package == "audio" and task not in _SPEECH:
        return "audio"
    return "text"


def parameter_names(pipeline: Any) -> set[str] | None:
    """The per-call options `pipeline` takes (None: any, it takes **options)."""
    call = getattr(pipeline, "run_items", None) or pipeline.__call__
    parameters = list(inspect.signature(call).parameters.values())[1:]  # after the inputs
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {
        p.name
        for p in parameters
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _NOT_PARAMETERS
    }


def warmup_example(task: str, repo: Repo) -> Any:
    """An item that `task`'s pipeline takes with no options, to compile before traffic; None
    where the task needs options (labels, prompts) to run."""
    kind = input_kind(task)
    if task in ("feature-extraction", "text-classification", "token-classification"):
        return "warm up"
    if task in ("image-classification", "image-feature-extraction", "depth-estimation"):
        from PIL import Image

        return Image.new("RGB", (64, 64), (128, 128, 128))
    if kind == "audio":
        rate = int(repo.preprocessor_config.get("sampling_rate") or 16000)
        return {"array": np.zeros(rate, np.float32), "sampling_rate": rate}
    return None


async def predict(server: Server, request: Request) -> Any:
    body = await read_body(request, InferenceRequest)
    names = server.parameters
    for name in body.parameters:
        if name in _NOT_PARAMETERS or (names is not None and name not in names):
            takes = ", ".join(sorted(names or ())) or "none"
            raise ApiError(400, f"'parameters'.{name}: {server.task} takes no such option; it "
                           f"takes {takes}", param="parameters")  # fmt: skip
    inputs = body.inputs
    if isinstance(inputs, list):
        if not inputs:
            raise ApiError(400, "'inputs' is an empty list", param="inputs")
        server.check_count(len(inputs), "inputs")
    if inputs is None:
        raise ApiError(400, "'inputs' is missing", param="inputs")
    if server.kind != "text":
        inputs = decoded(inputs, server.kind, server.repo)
    return await server.infer(inputs, **body.parameters)


def decoded(inputs: Any, kind: str, repo: Any) -> Any:
    """Requests' images or audio clips, decoded, in the same forms (alone, listed, in dicts)."""
    if isinstance(inputs, list):
        return [_item(v, kind, repo, f"inputs[{i}]") for i, v in enumerate(inputs)]
    return _item(inputs, kind, repo, "inputs")


def _item(value: Any, kind: str, repo: Any, where: str) -> Any:
    if isinstance(value, dict):
        field = "image" if kind == "image" else "array" if "array" in value else "audio"
        if kind == "audio" and field == "array":
            return _samples(value, repo, where)
        if field not in value:
            raise ApiError(400, f"'{where}' has no {field!r}", param="inputs")
        return {**value, field: _item(value[field], kind, repo, f"{where}.{field}")}
    if not isinstance(value, str):
        raise ApiError(400, f"'{where}': an {'image' if kind == 'image' else 'audio clip'} is a "
                       "base64 string or a data URL", param="inputs")  # fmt: skip
    data = _bytes(value, where)
    if kind == "image":
        return _image(data, where)
    samples, rate = read_wav(data)
    return {"array": samples, "sampling_rate": rate}


def _bytes(value: str, where: str) -> bytes:
    if value.startswith("data:"):
        header, _, value = value.partition(",")
        if not header.endswith(";base64"):
            raise ApiError(400, f"'{where}': a data URL must be base64 (data:...;base64,...)",
                           param="inputs")  # fmt: skip
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"'{where}' is not base64 (images and audio are sent as base64 or "
                       "data URLs, never as paths)", param="inputs") from None  # fmt: skip


def _image(data: bytes, where: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:
            raise ApiError(413, f"'{where}' is {width}x{height}; this server takes images of at "
                           f"most {MAX_IMAGE_PIXELS} pixels", param="inputs")  # fmt: skip
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise ApiError(400, f"'{where}' is not an image Pillow reads: {error}",
                       param="inputs") from None  # fmt: skip
    return image


def _samples(value: dict, repo: Any, where: str) -> dict:
    rate = value.get("sampling_rate")
    try:
        array = np.asarray(value["array"], np.float32)
    except (TypeError, ValueError):
        raise ApiError(400, f"'{where}.array' must be a list of numbers",
                       param="inputs") from None  # fmt: skip
    if array.ndim != 1 or not array.size or not np.isfinite(array).all():
        raise ApiError(400, f"'{where}.array' must be a non-empty list of finite numbers",
                       param="inputs")  # fmt: skip
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
        raise ApiError(400, f"'{where}.sampling_rate' must be a positive integer",
                       param="inputs")  # fmt: skip
    return {"array": array, "sampling_rate": rate}
