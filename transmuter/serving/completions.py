"""OpenAI's `POST /v1/completions` and `/v1/chat/completions` on a text-generation pipeline.

Every prompt is a request of the server's continuous batch (`ContinuousGeneration`): it
joins the running decode at the next step and leaves when done, with its own sampling options;
a streamed one sends server-sent events as its text grows and stops generating when its client
goes away. `temperature` 0 is greedy;
`max_tokens`, `top_p`, `stop` (cut before, as OpenAI does), `seed` and `n` 1 are taken.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from transmuter.serving.api import ApiError, flag, json_body, number
from transmuter.serving.chat import StopStream, cut_at_stop, render_chat

if TYPE_CHECKING:
    from transmuter.serving.http import Server


class ClientGone(Exception):
    """Raised inside a streamed generation whose client disconnected: it stops decoding."""


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if (
        not isinstance(stops, (list, tuple))
        or len(stops) > 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise ApiError(400, "'stop' must be a string or a list of up to 4 non-empty strings",
                       param="stop")  # fmt: skip
    return tuple(stops)


def _options(server: Server, body: dict, prompt_tokens: int, default_max: int | None) -> dict:
    """The pipeline's options for `body`'s sampling fields, positions checked."""
    if number(body, "n", 1, 1, 1, int) != 1:
        raise ApiError(400, "'n' must be 1", param="n")
    limit = server.engine.positions
    room = limit - prompt_tokens
    if room < 1:
        raise ApiError(400, f"the prompt has {prompt_tokens} tokens; the model's context is "
                       f"{limit}", param="messages" if default_max is None else "prompt",
                       code="context_length_exceeded")  # fmt: skip
    max_tokens = number(body, "max_tokens", default_max or room, 1, 1 << 20, int)
    if max_tokens > room:
        raise ApiError(400, f"the prompt's {prompt_tokens} tokens and max_tokens={max_tokens} "
                       f"need {prompt_tokens + max_tokens} positions; the model has {limit}",
                       param="max_tokens", code="context_length_exceeded")  # fmt: skip
    temperature = number(body, "temperature", 1.0, 0.0, 2.0)
    options = {
        "max_new_tokens": max_tokens,
        "do_sample": temperature > 0,
        "temperature": temperature or 1.0,
        "top_p": number(body, "top_p", 1.0, 1e-9, 1.0),
        "top_k": 0,  # OpenAI's sampling has no top-k
        "stop": _stops(body),
    }
    seed = number(body, "seed", None, 0, (1 << 31) - 1, int)  # a 32-bit PRNG key's seed
    if seed is not None:
        options["seed"] = seed
    return options


def _finish(server: Server, tokens: list[int], options: dict) -> tuple[str, str]:
    """A row's text (cut before a stop string) and OpenAI's finish_reason."""
    text, stopped = cut_at_stop(server.decode(tokens), options["stop"])
    if stopped or (tokens and tokens[-1] in server.engine.eos):
        return text, "stop"
    return text, "length"


async def completions(server: Server, request: Request) -> Any:
    body = await json_body(request)
    server.check_model(body)
    prompts, _ = server.texts(body, "prompt")
    ids = [server.tokenizer.encode(p).ids for p in prompts]
    options = _options(server, body, max(map(len, ids)), 16)
    if flag(body, "stream", False):
        if len(ids) > 1:
            raise ApiError(400, "stream takes one prompt", param="prompt")
        return _stream(server, ids[0], options, _Chunks(server, chat=False))
    rows = await _generated(server, ids, options)
    choices = []
    for i, row in enumerate(rows):
        text, reason = _finish(server, row, options)
        choices.append({"text": text, "index": i, "logprobs": None, "finish_reason": reason})
    return JSONResponse({
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": server.model_id, "choices": choices, "usage": _usage(ids, rows),
    })  # fmt: skip


async def chat_completions(server: Server, request: Request) -> Any:
    body = await json_body(request)
    server.check_model(body)
    prompt = render_chat(server.repo.tokenizer_config, body.get("messages"))
    # The template writes the special tokens itself, as transformers' apply_chat_template.
    ids = server.tokenizer.encode(prompt, add_special_tokens=False).ids
    options = _options(server, body, len(ids), None)
    if flag(body, "stream", False):
        return _stream(server, ids, options, _Chunks(server, chat=True))
    (row,) = await _generated(server, [ids], options)
    text, reason = _finish(server, row, options)
    message = {"role": "assistant", "content": text}
    return JSONResponse({
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": server.model_id,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reason}],
        "usage": _usage([ids], [row]),
    })  # fmt: skip


async def _generated(server: Server, prompts: list[list[int]], options: dict) -> list:
    """Each prompt's new token ids, every prompt a request of the continuous batch."""
    futures = [asyncio.wrap_future(server.generate(ids, **options)) for ids in prompts]
    try:
        return await asyncio.gather(*futures)
    except Exception as error:
        raise server.error(error) from None


def _usage(prompts: list[list[int]], rows: list[list[int]]) -> dict:
    prompt, completion = sum(map(len, prompts)), sum(map(len, rows))
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip


class _Chunks:
    """The streamed chunks of one answer, in OpenAI's shape for completions or chat."""

    def __init__(self, server: Server, chat: bool):
        self.chat, self.model = chat, server.model_id
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def opening(self) -> dict | None:
        """Chat's first chunk, which says the role; none for completions."""
        return self._chunk({"delta": {"role": "assistant", "content": ""}}) if self.chat else None

    def __call__(self, text: str | None, reason: str | None) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return self._chunk({"delta": delta, "finish_reason": reason})
        return self._chunk({"text": text or "", "finish_reason": reason})

    def _chunk(self, choice: dict) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": None, **choice}
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": [choice]}  # fmt: skip


_DONE = object()


def _stream(server: Server, ids: list[int], options: dict, chunk: _Chunks) -> StreamingResponse:
    """Server-sent events of one generation: a chunk per piece of text that no stop string can
    still claim, a last chunk with the finish reason, then [DONE]. A client that goes away
    cancels the request if it still waits, or stops its decoding at the next token."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()

    def on_token(row: int, piece: str) -> None:
        if gone.is_set():
            raise ClientGone("the client disconnected")
        loop.call_soon_threadsafe(pieces.put_nowait, piece)

    future = server.generate(ids, on_token=on_token, **options)  # a full queue: 429 here
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(pieces.put_nowait, _DONE))

    def event(data: Any) -> str:
        return f"data: {json.dumps(data)}\n\n"

    async def events():
        stop = StopStream(options["stop"])
        try:
            if (opening := chunk.opening()) is not None:
                yield event(opening)
            while (piece := await pieces.get()) is not _DONE:
                if text := stop.feed(piece):
                    yield event(chunk(text, None))
            try:
                row = future.result()
            except Exception as error:  # the generation failed after the stream began
                yield event(server.error(error).body())
                return
            if text := stop.finish():
                yield event(chunk(text, None))
            yield event(chunk(None, "stop" if stop.stopped else _finish(server, row, options)[1]))
            yield "data: [DONE]\n\n"
        finally:
            if not future.done():
                gone.set()
                future.cancel()

    return StreamingResponse(events(), media_type="text/event-stream")
