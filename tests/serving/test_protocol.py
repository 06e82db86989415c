"""protocol.py on its own: schemas name the failing field, the two error shapes, server-sent
event framing, and results made JSON (numpy, images, non-finite floats)."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from transmuter.serving.protocol import (
    ApiError,
    ChatRequest,
    Chunk,
    ChunkChoice,
    CompletionRequest,
    Delta,
    EmbeddingsRequest,
    InferenceRequest,
    parse,
    sse,
    to_json,
)


@pytest.mark.parametrize(
    "model, body, param, words",
    [
        (EmbeddingsRequest, {"input": []}, "input", "at least 1 item"),
        (EmbeddingsRequest, {"input": 5}, "input", "valid string or a valid"),
        (EmbeddingsRequest, {"input": "x", "truncate": "yes"}, "truncate", "valid boolean"),
        (EmbeddingsRequest, {"input": "x", "encoding_format": "hex"}, "encoding_format", "float"),
        (CompletionRequest, {"prompt": "x", "temperature": 2.5}, "temperature", "less than"),
        (CompletionRequest, {"prompt": "x", "max_tokens": 0}, "max_tokens", "greater than"),
        (CompletionRequest, {"prompt": "x", "seed": 2**40}, "seed", "less than"),
        (CompletionRequest, {"prompt": "x", "stop": [""]}, "stop", "at least 1 character"),
        (ChatRequest, {"messages": [{"role": "user"}]}, "messages", "[0].content"),
        (InferenceRequest, {"parameters": {}}, "inputs", "Field required"),
    ],
)
def test_schemas_name_the_failing_field(model, body, param, words):
    with pytest.raises(ApiError) as error:
        parse(model, json.dumps(body).encode())
    assert error.value.status == 400 and error.value.param == param
    assert words in str(error.value) and str(error.value).startswith(f"'{param}'")


@pytest.mark.parametrize(
    "raw",
    [b'{"input": "\\ud800"}', b'{"input": "\xc3\x28"}', b"[" * 10_000, b"{", b"", b"NaN"],
)
def test_malformed_bodies_are_refused_by_the_parser(raw):
    with pytest.raises(ApiError) as error:
        parse(EmbeddingsRequest, raw)
    assert error.value.status == 400 and error.value.code == "invalid_json"


def test_non_finite_numbers_are_refused_and_extras_ignored():
    with pytest.raises(ApiError, match="temperature"):
        parse(CompletionRequest, b'{"prompt": "x", "temperature": Infinity}')
    request = parse(CompletionRequest, b'{"prompt": "x", "logit_bias": {}, "user": "u"}')
    assert request.prompt == "x" and request.user == "u"


def test_error_shapes():
    error = ApiError(503, "busy", code="overloaded", headers={"Retry-After": "1"})
    assert error.openai() == {"error": {"message": "busy", "type": "server_error",
                                        "param": None, "code": "overloaded"}}  # fmt: skip
    assert error.tei() == {"error": "busy", "error_type": "Overloaded"}
    assert ApiError(503, "warming", code="warming_up").tei()["error_type"] == "Unhealthy"
    assert ApiError(400, "bad", param="x").tei()["error_type"] == "Validation"
    assert ApiError(500, "ours").tei()["error_type"] == "Backend"
    response = error.response("tei")
    assert response.status_code == 503 and response.headers["retry-after"] == "1"


def test_sse_frames_one_event_per_payload():
    chunk = Chunk(id="c", object="text_completion", created=1, model="m",
                  choices=[ChunkChoice(text="a\nb")])  # fmt: skip
    framed = sse(chunk)
    assert framed.startswith(b"data: {") and framed.endswith(b"}\n\n") and framed.count(b"\n") == 2
    assert json.loads(framed[6:])["choices"][0] == {"index": 0, "text": "a\nb", "logprobs": None,
                                                    "finish_reason": None}  # fmt: skip
    chat = Chunk(id="c", object="chat.completion.chunk", created=1, model="m",
                 choices=[ChunkChoice(delta=Delta(content="x"))])  # fmt: skip
    assert "text" not in json.loads(sse(chat)[6:])["choices"][0]
    assert sse("[DONE]") == b"data: [DONE]\n\n"
    assert sse("two\nlines") == b"data: two\ndata: lines\n\n"  # as the SSE spec reads lines
    with pytest.raises(ValueError):
        sse({"x": float("nan")})  # never unparseable JSON on the wire


def test_results_as_json():
    from PIL import Image

    image = Image.new("RGB", (2, 3), (10, 20, 30))
    value = {"a": np.arange(3, dtype=np.int64), "b": np.float32(0.5), "c": float("nan"),
             "d": [np.array([[1.5]])], "e": image}  # fmt: skip
    got = json.loads(to_json(value))
    assert got["a"] == [0, 1, 2] and got["b"] == 0.5 and got["c"] is None
    assert got["d"] == [[[1.5]]]
    header, data = got["e"].split(",")
    assert header == "data:image/png;base64"
    assert Image.open(io.BytesIO(base64.b64decode(data))).size == (2, 3)
