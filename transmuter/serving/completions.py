"""OpenAI's `POST /v1/completions` and `/v1/chat/completions` on a text-generation pipeline.

Every prompt is a request of the server's continuous batch (`ContinuousGeneration`): it
joins the running decode at the next step and leaves when done, with its own sampling options;
a streamed one sends server-sent events as its text grows and stops generating when its client
goes away. `temperature` 0 is greedy;
`max_tokens` (checked against the room the prompt leaves in --max-model-len), `top_p`, `stop`
(cut before, as OpenAI does), `seed` and `n` 1 are taken (protocol.py's schemas).
Part of `transmuter serve`: `pip install transmuter[serve]`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from transmuter.serving.api import ApiError, error_for, read_body
from transmuter.serving.chat import StopStream, cut_at_stop, render_chat
from transmuter.serving.protocol import (
    ChatChoice,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    Chunk,
    ChunkChoice,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Delta,
    PydanticResponse,
    Sampling,
    Usage,
    sse,
)

if TYPE_CHECKING:
    from transmuter.serving.http import Server


class ClientGone(Exception):
    """Raised inside a streamed generation whose client disconnected: it stops decoding."""


def _options(server: Server, body: Sampling, prompt_tokens: int, max_tokens: int | None,
             field: str) -> dict:  # fmt: skip
    """The pipeline's options for `body`'s sampling fields; the prompt and `max_tokens`
    (default: the room left) checked against the positions this server gives a request
    (--max-model-len)."""
    limit = server.engine.positions
    room = limit - prompt_tokens
    if room < 1:
        raise ApiError(400, f"the prompt has {prompt_tokens} tokens; this server's context is "
                       f"{limit} (--max-model-len)", param=field,
                       code="context_length_exceeded")  # fmt: skip
    max_tokens = room if max_tokens is None else max_tokens
    if max_tokens > room:
        raise ApiError(400, f"the prompt's {prompt_tokens} tokens and max_tokens={max_tokens} "
                       f"need {prompt_tokens + max_tokens} positions; this server's context is "
                       f"{limit}: ask for at most {room}", param="max_tokens",
                       code="context_length_exceeded")  # fmt: skip
    temperature = 1.0 if body.temperature is None else body.temperature
    stop = body.stop
    options = {
        "max_new_tokens": max_tokens,
        "do_sample": temperature > 0,
        "temperature": temperature or 1.0,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_k": 0,  # OpenAI's sampling has no top-k
        "stop": () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop),
    }
    if body.seed is not None:
        options["seed"] = body.seed
    return options


def _finish(server: Server, tokens: list[int], options: dict) -> tuple[str, str]:
    """A row's text (cut before a stop string) and OpenAI's finish_reason."""
    text, stopped = cut_at_stop(server.decode(tokens), options["stop"])
    if stopped or (tokens and tokens[-1] in server.engine.eos):
        return text, "stop"
    return text, "length"


async def completions(server: Server, request: Request) -> Any:
    body = await read_body(request, CompletionRequest)
    server.check_model(body.model)
    prompts, _ = server.texts(body.prompt, "prompt")
    if body.stream and len(prompts) > 1:
        raise ApiError(400, "stream takes one prompt", param="prompt")
    ids = [server.tokenizer.encode(p).ids for p in prompts]
    max_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's default
    options = _options(server, body, max(map(len, ids)), max_tokens, "prompt")
    if body.stream:
        return _stream(server, ids[0], options, _Chunks(server, chat=False))
    rows = await _generated(server, request, ids, options)
    choices = []
    for i, row in enumerate(rows):
        text, reason = _finish(server, row, options)
        choices.append(CompletionChoice(text=text, index=i, finish_reason=reason))
    return PydanticResponse(CompletionResponse(
        id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=server.model_id,
        choices=choices, usage=_usage(ids, rows),
    ))  # fmt: skip


async def chat_completions(server: Server, request: Request) -> Any:
    body = await read_body(request, ChatRequest)
    server.check_model(body.model)
    messages = [m.model_dump() for m in body.messages]
    prompt = render_chat(server.repo.tokenizer_config, messages)
    # The template writes the special tokens itself, as transformers' apply_chat_template.
    ids = server.tokenizer.encode(prompt, add_special_tokens=False).ids
    max_tokens = body.max_completion_tokens or body.max_tokens
    options = _options(server, body, len(ids), max_tokens, "messages")
    if body.stream:
        return _stream(server, ids, options, _Chunks(server, chat=True))
    (row,) = await _generated(server, request, [ids], options)
    text, reason = _finish(server, row, options)
    return PydanticResponse(ChatResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=server.model_id,
        choices=[ChatChoice(index=0, message=ChatMessage(content=text), finish_reason=reason)],
        usage=_usage([ids], [row]),
    ))  # fmt: skip


async def _generated(
    server: Server, request: Request, prompts: list[list[int]], options: dict
) -> list:
    """Each prompt's new token ids, every prompt a request of the continuous batch. A client
    that disconnects meanwhile frees its requests' slots at the next step."""
    futures = [server.generate(ids, **options) for ids in prompts]
    answers = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({answers, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not answers.done():  # the client left (or this handler was cancelled)
            for future in futures:
                server.engine.abandon(future)
            answers.cancel()
        gone.cancel()
    if not answers.done() or answers.cancelled():
        raise ApiError(499, "the client closed the request", code="client_closed")
    try:
        return answers.result()
    except Exception as error:
        raise error_for(error) from None


async def _disconnected(request: Request) -> None:
    """Returns once the client has disconnected (the body is read by then)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _usage(prompts: list[list[int]], rows: list[list[int]]) -> Usage:
    prompt, completion = sum(map(len, prompts)), sum(map(len, rows))
    return Usage(prompt_tokens=prompt, completion_tokens=completion,
                 total_tokens=prompt + completion)  # fmt: skip


class _Chunks:
    """The streamed chunks of one answer, in OpenAI's shape for completions or chat."""

    def __init__(self, server: Server, chat: bool):
        self.chat, self.model = chat, server.model_id
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def opening(self) -> Chunk | None:
        """Chat's first chunk, which says the role; none for completions."""
        if not self.chat:
            return None
        return self._chunk(ChunkChoice(delta=Delta(role="assistant", content="")))

    def __call__(self, text: str | None, reason: str | None) -> Chunk:
        if self.chat:
            return self._chunk(ChunkChoice(delta=Delta(content=text), finish_reason=reason))
        return self._chunk(ChunkChoice(text=text or "", finish_reason=reason))

    def _chunk(self, choice: ChunkChoice) -> Chunk:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return Chunk(id=self.id, object=kind, created=self.created, model=self.model,
                     choices=[choice])  # fmt: skip


_DONE = object()


def _stream(server: Server, ids: list[int], options: dict, chunk: _Chunks) -> StreamingResponse:
    """Server-sent events of one generation: a chunk per piece of text that no stop string can
    still claim, a last chunk with the finish reason, then [DONE]. A client that goes away
    cancels the request if it still waits, or frees its slot at the next step."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()

    def on_token(row: int, piece: str) -> None:
        if gone.is_set():
            raise ClientGone("the client disconnected")
        loop.call_soon_threadsafe(pieces.put_nowait, piece)

    future = server.generate(ids, on_token=on_token, **options)  # a full queue: 503 here
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, _DONE))

    async def events():
        stop = StopStream(options["stop"])
        try:
            if (opening := chunk.opening()) is not None:
                yield sse(opening)
            while (piece := await pieces.get()) is not _DONE:
                if text := stop.feed(piece):
                    yield sse(chunk(text, None))
            try:
                row = future.result()
            except Exception as error:  # the generation failed after the stream began
                yield sse(error_for(error).openai())
                return
            if text := stop.finish():
                yield sse(chunk(text, None))
            yield sse(chunk(None, "stop" if stop.stopped else _finish(server, row, options)[1]))
            yield sse("[DONE]")
        finally:
            if not future.done():
                gone.set()
                server.engine.abandon(future)

    return StreamingResponse(events(), media_type="text/event-stream")
