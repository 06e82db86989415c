"""The requests and responses of every route, as pydantic models, and the two error shapes.

Bodies are parsed and validated in one step (`parse`: pydantic's JSON parser on the raw bytes),
so malformed JSON, invalid UTF-8, lone surrogates (`"\\ud800"`) and nesting past the parser's
recursion limit are refusals like any other, never a crash further in. Fields are strict
(`"input": 5` is not a text; a number is never a bool) and extra fields are ignored, as
OpenAI and text-embeddings-inference ignore fields they do not know. `ApiError.from_validation`
names the first failing field.

Statuses and shapes (`ApiError.response`): OpenAI's routes answer
`{"error": {"message", "type", "param", "code"}}`; text-embeddings-inference's and the generic
/predict `{"error", "error_type"}` (TEI's `ErrorResponse`). Both use one status per failure:
400 for a bad request, 404 an unknown model, 413 a body past --max-request-bytes or more items
than --max-client-batch-size, 500 a failure of the server or the model, 503 with Retry-After
while overloaded, warming up or closing.
Part of `transmuter serve`: `pip install transmuter[serve]`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

# -- errors -------------------------------------------------------------------------------------

# TEI's error_type for a status.
_TEI_TYPES = {400: "Validation", 404: "Validation", 413: "Validation", 422: "Validation",
              429: "Overloaded", 503: "Unhealthy"}  # fmt: skip


class ApiError(Exception):
    """A failed request: its HTTP status, OpenAI's error fields (`kind` is OpenAI's "type")
    and the headers of the answer."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    @classmethod
    def from_validation(cls, error: pydantic.ValidationError) -> ApiError:
        """A 400 naming the first failing field (`'messages'[0].content`), or saying that the
        body is not JSON."""
        errors = error.errors(include_url=False, include_context=False)
        first = errors[0]
        # A union's branches each fail: say what went wrong in the branch the value was
        # meant for (a list too short, not "should be a string"), or list what it may be.
        mine = [e for e in errors if e["loc"][:1] == first["loc"][:1]]
        if len(mine) > 1:
            misfits = [e for e in mine if not e["type"].endswith("_type")]
            first = misfits[0] if misfits else {**first, "msg": " or ".join(
                dict.fromkeys(e["msg"].replace("Input should be ", "") for e in mine))}  # fmt: skip
            if not misfits:
                first["msg"] = "Input should be " + first["msg"]
        if first["type"] == "json_invalid":
            return cls(400, f"the body is not valid JSON: {first['msg']}", code="invalid_json")
        if first["type"] == "model_type" and not first["loc"]:
            return cls(400, "the body must be a JSON object", code="invalid_json")
        loc = [p for p in first["loc"] if isinstance(p, int) or p in _FIELDS]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
        param = str(loc[0]) if loc else None
        text = f"'{param}'{where}: {first['msg']}" if param else first["msg"]
        return cls(400, text, param=param)

    def openai(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}  # fmt: skip

    def tei(self) -> dict:
        kind = _TEI_TYPES.get(self.status, "Validation" if self.status < 500 else "Backend")
        if self.code == "overloaded":  # a 503 as a refusal for load, not for health
            kind = "Overloaded"
        return {"error": str(self), "error_type": kind}

    def response(self, shape: str = "openai") -> JSONResponse:
        body = self.openai() if shape == "openai" else self.tei()
        return JSONResponse(body, self.status, headers=self.headers)


# -- requests -----------------------------------------------------------------------------------


class Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


Texts = Annotated[
    str | Annotated[list[str], Field(min_length=1)], Field(union_mode="left_to_right")
]


class EmbeddingsRequest(Request):
    """OpenAI's POST /v1/embeddings (token arrays are not taken: give text)."""

    model: str | None = None
    input: Texts
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: None = Field(None, description="not supported: the model's size is fixed")
    truncate: bool = False  # TEI's OpenAI route takes it too
    user: str | None = None


class EmbedRequest(Request):
    """text-embeddings-inference's POST /embed."""

    inputs: Texts
    normalize: bool = True
    truncate: bool = False


class PredictRequest(Request):
    """text-embeddings-inference's POST /predict (a sequence classifier's every label)."""

    inputs: Texts
    truncate: bool = False
    raw_scores: bool = False


class RerankRequest(Request):
    """text-embeddings-inference's POST /rerank."""

    query: str
    texts: Annotated[list[str], Field(min_length=1)]
    truncate: bool = False
    raw_scores: bool = False
    return_text: bool = False


class TokenizeRequest(Request):
    """text-embeddings-inference's POST /tokenize."""

    inputs: Texts
    add_special_tokens: bool = True


class Sampling(Request):
    """The sampling fields OpenAI's completions and chat completions share."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Literal[1] | None = None
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)]
        | None
    ) = None
    seed: Annotated[int, Field(ge=0, le=(1 << 31) - 1)] | None = None  # a 32-bit PRNG key's
    stream: bool = False
    user: str | None = None


class CompletionRequest(Sampling):
    """OpenAI's POST /v1/completions."""

    prompt: Texts


class Message(Request):
    role: str
    content: str


class ChatRequest(Sampling):
    """OpenAI's POST /v1/chat/completions (string contents; content parts are not taken)."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None


class InferenceRequest(Request):
    """The Hugging Face Inference API's body, for the tasks that have no OpenAI or TEI route:
    `inputs` as the task's pipeline takes them (images and audio as base64 or data URLs) and
    `parameters`, the pipeline's per-call options."""

    inputs: Any
    parameters: dict[str, Any] = Field(default_factory=dict)


_FIELDS = {
    name
    for model in (EmbeddingsRequest, EmbedRequest, PredictRequest, RerankRequest,
                  TokenizeRequest, CompletionRequest, ChatRequest, Message, InferenceRequest)
    for name in model.model_fields
}  # fmt: skip


def parse(model: type[Request], raw: bytes) -> Any:
    """`raw` as a `model`, or the ApiError that names what is wrong with it."""
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as error:
        raise ApiError.from_validation(error) from None


# -- responses ----------------------------------------------------------------------------------


class Response_(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="null")


class Embedding(Response_):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 with encoding_format


class EmbeddingUsage(Response_):
    prompt_tokens: int
    total_tokens: int


class Usage(Response_):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class EmbeddingsResponse(Response_):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Rank(Response_):
    index: int
    score: float
    text: str | None = None


class Token(Response_):
    id: int
    text: str
    special: bool
    start: int
    stop: int


class CompletionChoice(Response_):
    text: str
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponse(Response_):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ChatMessage(Response_):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(Response_):
    index: int
    message: ChatMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class ChatResponse(Response_):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(Response_):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(Response_):
    index: int = 0
    text: str | None = None
    delta: Delta | None = None
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class Chunk(Response_):
    """A streamed completion's or chat completion's chunk."""

    id: str
    object: Literal["text_completion", "chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]


class ModelCard(Response_):
    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "transmuter"
    task: str


class ModelList(Response_):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class PydanticResponse(Response):
    """A response model as JSON (pydantic's serializer: non-finite floats become null, where
    Starlette's JSONResponse raises), or any value by `to_json`'s rules."""

    media_type = "application/json"

    def __init__(self, content: Any, status_code: int = 200, **kwargs: Any):
        super().__init__(content, status_code, **kwargs)

    def render(self, content: Any) -> bytes:
        if isinstance(content, BaseModel):
            return _dumped(content).encode()
        return to_json(content)


def _dumped(content: BaseModel) -> str:
    if isinstance(content, Chunk):  # a chunk leaves out what its kind lacks
        lacks = "text" if content.object == "chat.completion.chunk" else "delta"
        return content.model_dump_json(exclude={"choices": {"__all__": {lacks}}})
    return content.model_dump_json()


def to_json(value: Any) -> bytes:
    """Any result as JSON: numpy arrays and scalars as lists and numbers, Pillow images as PNG
    data URLs, non-finite floats as null."""
    import pydantic_core

    return pydantic_core.to_json(value, fallback=_jsonable, inf_nan_mode="null")


def _jsonable(value: Any) -> Any:
    import base64
    import io

    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if type(value).__module__.startswith("PIL.") and hasattr(value, "save"):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    raise TypeError(f"a result of type {type(value).__name__} has no JSON form")


def sse(data: Any) -> bytes:
    """One server-sent event carrying `data` (a model, a dict, or "[DONE]"): `data: ...` and a
    blank line. JSON has no raw newlines, so the event is one data line; a string with
    newlines would be split into data lines as the SSE spec reads them."""
    if isinstance(data, BaseModel):
        payload = _dumped(data)
    elif isinstance(data, str):
        payload = data
    else:
        payload = json.dumps(data, allow_nan=False)
    return b"".join(b"data: " + line.encode() + b"\n" for line in payload.split("\n")) + b"\n"
