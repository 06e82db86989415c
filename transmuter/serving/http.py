"""The HTTP server of `transmuter serve`: a pipeline behind `Serving`, on Starlette.

Routes by task: OpenAI's `POST /v1/embeddings`, `/v1/completions` and `/v1/chat/completions`
(completions.py) and `/v1/audio/transcriptions` (audio.py); text-embeddings-inference's
`POST /embed`, `/predict`, `/rerank` and `/tokenize`; every other task of the registry
(pipelines/registry.py) `POST /predict` in the Hugging Face Inference API's shape (inference.py).
For every task `GET /v1/models`, `/health` (200 once warmed up, 503 before) and `/metrics`
(Prometheus' text format, every answer counted by route and status).

Every failure is a JSON answer in its route's shape (protocol.py): OpenAI's under /v1, TEI's
elsewhere. Bodies past `max_request_bytes` are refused (413) as they are read; inference
routes answer 503 with Retry-After until the warm-up is done.
Part of `transmuter serve`: `pip install transmuter[serve]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from transmuter import telemetry
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines import Repo, pipeline
from transmuter.pipelines.generation.continuous import ContinuousGeneration
from transmuter.pipelines.registry import entry
from transmuter.pipelines.text.encoders import sentence_embedding
from transmuter.serving import inference
from transmuter.serving.api import ApiError, BodyLimit, error_for, read_body
from transmuter.serving.audio import transcriptions
from transmuter.serving.batching import Serving
from transmuter.serving.completions import chat_completions, completions
from transmuter.serving.protocol import (
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingUsage,
    EmbedRequest,
    ModelCard,
    ModelList,
    PredictRequest,
    PydanticResponse,
    Rank,
    RerankRequest,
    Token,
    TokenizeRequest,
)

_log = logging.getLogger("transmuter.serving")
MB = 1 << 20


class Metrics:
    """The server's Prometheus metrics, fed by its routes and by Transmuter's telemetry."""

    def __init__(self, queued: Callable[[], int]):
        self.registry = CollectorRegistry()
        labels = ("route", "status")
        self.requests = Counter(
            "transmuter_requests", "HTTP requests", labels, registry=self.registry
        )
        self.latency = Histogram(
            "transmuter_request_duration_seconds", "HTTP request latency", labels,
            registry=self.registry,
        )  # fmt: skip
        self.queue = Gauge(
            "transmuter_queue_depth", "requests waiting for a batch", registry=self.registry
        )
        self.queue.set_function(queued)
        self.batch = Histogram(
            "transmuter_batch_size", "items per pipeline call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=self.registry,
        )  # fmt: skip
        self.tokens = Counter(
            "transmuter_prompt_tokens", "tokens of the requests' inputs", registry=self.registry
        )
        self.generated = Counter(
            "transmuter_generated_tokens", "tokens generated", registry=self.registry
        )
        # The continuous batch compiles its own programs (transmuter.jit, not transmuter.compile).
        self.generation_programs = Gauge(
            "transmuter_generation_programs", "programs the continuous batch compiled",
            registry=self.registry,
        )  # fmt: skip
        self.generation_active = Gauge(
            "transmuter_generation_active", "requests holding a slot of the continuous batch",
            registry=self.registry,
        )  # fmt: skip
        self.events = {
            "transmuter.compile.stop": Counter(
                "transmuter_compiles", "programs compiled", registry=self.registry
            ),
            "transmuter.cache.hit": Counter(
                "transmuter_cache_hits", "compiled-program cache hits", registry=self.registry
            ),
            "transmuter.cache.miss": Counter(
                "transmuter_cache_misses", "compiled-program cache misses", registry=self.registry
            ),
            "transmuter.cache.evict": Counter(
                "transmuter_cache_evictions", "programs evicted", registry=self.registry
            ),
        }
        self._handler_id = ("transmuter.serving.metrics", id(self))
        telemetry.attach(
            self._handler_id, [*self.events, "transmuter.serving.batch"], self._on_event
        )

    def _on_event(self, event: str, measurements: dict, metadata: dict) -> None:
        if event == "transmuter.serving.batch":
            self.batch.observe(measurements["items"])
        else:
            self.events[event].inc()

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route, str(status)).observe(seconds)

    def close(self) -> None:
        telemetry.detach(self._handler_id)

    def exposition(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class Server:
    """A repository's pipeline for `task`, its requests batched by `Serving` (generation's by
    `ContinuousGeneration`), with the state the routes share. `model_id` is what clients name
    in "model" (the CLI's default: the repo folder's name).

    Budgets, checked here, before traffic: `max_request_bytes` (default 2 MB as
    text-embeddings-inference, 25 MB for tasks taking images or audio, OpenAI's upload limit);
    for text generation `max_model_len` positions per request (default: the model's, capped
    so that the slots' past fits `kv_memory` bytes, by default half the memory of the device,
    or of the host on the CPU)."""

    def __init__(
        self,
        repo: Repo,
        task: str,
        *,
        model_id: str,
        batch_size: int = 8,
        batch_timeout_ms: float = 5.0,
        max_queue: int = 1024,
        max_client_batch_size: int = 32,
        decoding: str | None = None,
        max_request_bytes: int | None = None,
        max_model_len: int | None = None,
        kv_memory: int | None = None,
    ):
        self.routes = routes_for(task)
        if decoding is not None and task != "automatic-speech-recognition":
            raise InputError(f"decoding is automatic-speech-recognition's; got task {task!r}")
        self.task, self.model_id, self.repo = task, model_id, repo
        self.kind = inference.input_kind(task)
        if max_request_bytes is None:
            max_request_bytes = 2 * MB if self.kind == "text" else 25 * MB
        if max_request_bytes < 1:
            raise InputError(f"max_request_bytes must be at least 1; got {max_request_bytes}")
        self.max_request_bytes = max_request_bytes
        # Embeddings pool as the repo's sentence-transformers config says; normalizing is the
        # routes' (the repo's choice for OpenAI's, the request's for TEI's /embed).
        self.embedding = sentence_embedding(repo) if task == "feature-extraction" else {}
        options = {**TASK_OPTIONS.get(task, {}), **self.embedding}
        if task == "feature-extraction":
            options["normalize"] = False
        generating = task == "text-generation"
        factory = entry(task).factory()
        if not generating and "batch_size" in inspect.signature(factory).parameters:
            options["batch_size"] = batch_size  # the pipeline's chunks as large as the batches
        if decoding is not None:
            options["decoding"] = decoding
        self.pipeline = pipeline(task, repo, **options)
        # The encoder's own tokenizer (it truncates at the model's positions, so a longer text
        # shows as overflowing); generation's is the repo's, its lengths checked by the routes.
        encoder = getattr(self.pipeline, "encoder", None)
        self.tokenizer = getattr(encoder, "tokenizer", None) or (
            repo.tokenizer if self.kind == "text" else None
        )
        self.max_client_batch_size = max_client_batch_size
        # Generation batches continuously: a decode batch of batch_size slots that requests
        # join and leave between steps. The other tasks batch concurrent requests by Serving.
        if generating:
            length = model_length(self.pipeline, batch_size, max_model_len, kv_memory)
            self.engine = ContinuousGeneration(
                self.pipeline, slots=batch_size, max_queue=max_queue, max_len=length
            )
            self.serving = None
        else:
            self.serving = Serving(self.pipeline, batch_size=batch_size,
                                   batch_timeout_ms=batch_timeout_ms, max_queue=max_queue)  # fmt: skip
        self.ready = False  # after warmup(): /health is 200
        self.metrics = Metrics(lambda: (self.serving or self.engine).queued)
        if generating:
            self.metrics.generation_programs.set_function(lambda: self.engine.programs)
            self.metrics.generation_active.set_function(lambda: self.engine.active)
        self.parameters = inference.parameter_names(self.pipeline)
        self.created = int(time.time())

    def warmup(self) -> None:
        """Compile before traffic (the batch sizes of a short example where the task has
        one; generation's steps for every count of running requests and short prompts'
        prefill); /health is 200 after. A failed warm-up is logged: requests then compile as
        they come, and fail with their cause."""
        try:
            if self.serving is None:
                self.engine.warmup(self.tokenizer.encode("warm up").ids)
            elif (example := inference.warmup_example(self.task, self.repo)) is not None:
                self.serving.warmup([example])
        except Exception:
            _log.exception("the warm-up failed; serving without it")
        self.ready = True

    def generate(self, prompt: list[int], **options: Any) -> Future:
        """A generation's Future (its new token ids) from the continuous batch; refusals as
        ApiErrors. Finished generations count their tokens in the metrics."""
        try:
            future = self.engine.submit(prompt, **options)
        except Exception as error:
            raise error_for(error) from None
        future.add_done_callback(self._count)
        return future

    def _count(self, future: Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self.metrics.generated.inc(len(future.result()))

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def close(self) -> None:
        (self.serving or self.engine).close()
        self.metrics.close()

    # -- request checks shared by the routes --------------------------------------------------

    def texts(self, value: str | list[str], field: str) -> tuple[list[str], bool]:
        """A validated text field as a list of at most max_client_batch_size texts, and
        whether it was one text."""
        if isinstance(value, str):
            return [value], True
        self.check_count(len(value), field)
        return value, False

    def check_count(self, count: int, field: str) -> None:
        if count > self.max_client_batch_size:
            raise ApiError(
                413, f"'{field}' has {count} items; this server takes at most "
                f"{self.max_client_batch_size} (--max-client-batch-size)", param=field,
                code="batch_too_large",
            )  # fmt: skip

    def check_model(self, model: str | None) -> None:
        """OpenAI's routes name the model: it must be this server's."""
        if model != self.model_id:
            raise ApiError(404, f"the model {model!r} does not exist; this server has "
                           f"{self.model_id!r}", param="model", code="model_not_found")  # fmt: skip

    def token_counts(self, texts: list, truncate: bool, field: str) -> list[int]:
        """Tokens per text or (query, passage) pair, special tokens included; one past the
        model's positions is a 400 unless `truncate`, as text-embeddings-inference has it."""
        counts = []
        for i, encoding in enumerate(self.tokenizer.encode_batch(texts)):
            if encoding.overflowing and not truncate:
                limit = self.repo.config.get("max_position_embeddings")
                raise ApiError(
                    400, f"'{field}'[{i}] has more tokens than the model's {limit} positions; "
                    "shorten it or ask for truncate: true", param=field,
                    code="context_length_exceeded",
                )  # fmt: skip
            counts.append(len(encoding.ids))
        self.metrics.tokens.inc(sum(counts))
        return counts

    def normalized(self, vectors: np.ndarray, normalize: bool) -> np.ndarray:
        if not normalize:
            return vectors
        return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)

    async def infer(self, inputs: Any, **options: Any) -> Any:
        """The pipeline's answer for `inputs`, batched with other requests by `Serving`."""
        try:
            return await self.serving.infer(inputs, **options)
        except Exception as error:
            raise error_for(error) from None


def model_length(
    generation: Any, slots: int, max_model_len: int | None, kv_memory: int | None
) -> int:
    """The positions a request may use, within the model's and so that `slots` pasts of
    twice that (continuous.py's buffers, rounded up to a power of two) fit `kv_memory` bytes
    (default: half the device's memory). Refuses what does not fit, naming the flags."""
    config = generation.repo.config
    positions = config.get("max_position_embeddings", config.get("n_positions"))
    if not isinstance(positions, int):
        raise ModelLoadError(f"{generation.repo.source}: config.json gives no "
                             "max_position_embeddings or n_positions")  # fmt: skip
    per_position = 8 + sum(  # the int64 mask and every past's heads x head size
        heads * width * np.dtype(dtype).itemsize
        for _, ((heads, width), dtype) in generation.decoder.shapes()
    )
    budget = kv_memory if kv_memory is not None else device_memory() // 2
    flag = "--kv-memory" if kv_memory is not None else "--kv-memory (default: half the memory)"

    def need(length: int, count: int) -> int:
        return count * (1 << max(0, (2 * length - 1).bit_length())) * per_position

    if max_model_len is not None:
        if max_model_len < 2 or max_model_len > positions:
            raise InputError(f"--max-model-len must be between 2 and the model's {positions} "
                             f"positions; got {max_model_len}")  # fmt: skip
        for count in (1, slots):
            if need(max_model_len, count) > budget:
                raise InputError(
                    f"{count} slot{'s' if count > 1 else ''} of {max_model_len} positions need "
                    f"{need(max_model_len, count) / MB:.0f} MiB of past; {flag} is "
                    f"{budget / MB:.0f} MiB: lower --max-model-len"
                    + (" or --batch-size" if count > 1 else "") + f" or raise {flag.split()[0]}"
                )  # fmt: skip
        return max_model_len
    length = positions
    while length > 2 and need(length, slots) > budget:
        length = min(length - 1, 1 << ((2 * length - 1).bit_length() - 2))
    if need(length, 1) > budget or length < 16:
        raise InputError(f"one slot of the model's past does not fit {flag} "
                         f"({budget / MB:.0f} MiB): raise it")  # fmt: skip
    if length < positions:
        _log.warning("--max-model-len %d (the model has %d positions): %d slots' past fit %s",
                     length, positions, slots, flag.split()[0])  # fmt: skip
    return length


def device_memory() -> int:
    """Bytes of memory of the first device (its allocator's limit), or the host's on a CPU."""
    import jax

    stats = getattr(jax.devices()[0], "memory_stats", lambda: None)() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# -- routes -------------------------------------------------------------------------------------


async def openai_embeddings(server: Server, request: Request) -> Response:
    body = await read_body(request, EmbeddingsRequest)
    server.check_model(body.model)
    texts, _ = server.texts(body.input, "input")
    if body.dimensions is not None:
        raise ApiError(400, "'dimensions' is not supported: the model's size is fixed",
                       param="dimensions")  # fmt: skip
    counts = server.token_counts(texts, body.truncate, "input")
    vectors = np.asarray(await server.infer(texts), np.float32)
    vectors = server.normalized(vectors, server.embedding["normalize"])
    if body.encoding_format == "base64":
        import base64

        values = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    else:
        values = vectors.tolist()
    data = [Embedding.model_construct(object="embedding", index=i, embedding=v)
            for i, v in enumerate(values)]  # fmt: skip
    usage = EmbeddingUsage(prompt_tokens=sum(counts), total_tokens=sum(counts))
    return PydanticResponse(
        EmbeddingsResponse.model_construct(
            object="list", data=data, model=server.model_id, usage=usage
        )  # fmt: skip
    )


async def tei_embed(server: Server, request: Request) -> Response:
    body = await read_body(request, EmbedRequest)
    texts, _ = server.texts(body.inputs, "inputs")
    server.token_counts(texts, body.truncate, "inputs")
    vectors = np.asarray(await server.infer(texts), np.float32)
    return PydanticResponse(server.normalized(vectors, body.normalize).tolist())


async def tei_predict(server: Server, request: Request) -> Response:
    body = await read_body(request, PredictRequest)
    texts, single = server.texts(body.inputs, "inputs")
    server.token_counts(texts, body.truncate, "inputs")
    options = {"function_to_apply": "none"} if body.raw_scores else {}
    ranked = await server.infer(texts, **options)  # every label, best first (top_k=None)
    return PydanticResponse(ranked[0] if single else ranked)


async def tei_rerank(server: Server, request: Request) -> Response:
    """TEI's /rerank: a one-label cross-encoder's score of (query, text) for each text, best
    first; the sigmoid of its logit, or the logit itself with raw_scores."""
    body = await read_body(request, RerankRequest)
    texts, _ = server.texts(body.texts, "texts")
    labels = len(server.repo.config.get("id2label") or {})
    if labels != 1:
        raise ApiError(400, f"/rerank needs a cross-encoder with one label; this model has "
                       f"{labels}", code="not_a_reranker")  # fmt: skip
    server.token_counts([(body.query, t) for t in texts], body.truncate, "texts")
    apply = "none" if body.raw_scores else "sigmoid"
    pairs = [{"text": body.query, "text_pair": t} for t in texts]
    ranked = await server.infer(pairs, function_to_apply=apply)
    scores = np.array([row[0]["score"] for row in ranked])
    results = [Rank(index=int(i), score=float(scores[i]),
                    text=texts[i] if body.return_text else None).model_dump(exclude_none=True)
               for i in np.argsort(-scores, kind="stable")]  # fmt: skip
    return PydanticResponse(results)


async def tei_tokenize(server: Server, request: Request) -> Response:
    body = await read_body(request, TokenizeRequest)
    texts, _ = server.texts(body.inputs, "inputs")
    rows = []
    for encoding in server.tokenizer.encode_batch(
        texts, add_special_tokens=body.add_special_tokens
    ):
        rows.append([
            Token(id=i, text=token, special=bool(s), start=start, stop=stop)
            for i, token, s, (start, stop) in zip(
                encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets
            )
        ])  # fmt: skip
    return PydanticResponse(rows)


async def predict(server: Server, request: Request) -> Response:
    """The Hugging Face Inference API's {"inputs", "parameters"} for any other task."""
    return PydanticResponse(await inference.predict(server, request))


async def models(server: Server, request: Request) -> Response:
    card = ModelCard(id=server.model_id, created=server.created, task=server.task,
                     **server.embedding)  # fmt: skip
    return PydanticResponse(ModelList(data=[card]))


async def health(server: Server, request: Request) -> Response:
    if not server.ready:
        return PydanticResponse({"status": "warming up"}, 503, headers={"Retry-After": "5"})
    return PydanticResponse({"status": "ok"})


async def metrics(server: Server, request: Request) -> Response:
    return server.metrics.exposition()


Handler = Callable[[Server, Request], Any]
COMMON: dict[tuple[str, str], Handler] = {
    ("GET", "/v1/models"): models,
    ("GET", "/health"): health,
    ("GET", "/metrics"): metrics,
}
# The tasks with OpenAI's or TEI's routes; every other task of the registry gets GENERIC.
ROUTES: dict[str, dict[tuple[str, str], Handler]] = {
    "feature-extraction": {
        ("POST", "/v1/embeddings"): openai_embeddings,
        ("POST", "/embed"): tei_embed,
        ("POST", "/tokenize"): tei_tokenize,
    },
    "text-classification": {
        ("POST", "/predict"): tei_predict,
        ("POST", "/rerank"): tei_rerank,
        ("POST", "/tokenize"): tei_tokenize,
    },
    "automatic-speech-recognition": {
        ("POST", "/v1/audio/transcriptions"): transcriptions,
        ("POST", "/predict"): predict,
    },
    "text-generation": {
        ("POST", "/v1/completions"): completions,
        ("POST", "/v1/chat/completions"): chat_completions,
        ("POST", "/tokenize"): tei_tokenize,
    },
}
GENERIC: dict[tuple[str, str], Handler] = {("POST", "/predict"): predict}
# The pipeline options a task is served with (text-classification: every label, as TEI).
TASK_OPTIONS = {"text-classification": {"top_k": None}}


def routes_for(task: str) -> dict[tuple[str, str], Handler]:
    """The routes serving `task` (an InputError listing the tasks for an unknown one)."""
    entry(task)
    return ROUTES.get(task, GENERIC)


def shape(path: str) -> str:
    """The error shape of a route: OpenAI's under /v1, text-embeddings-inference's elsewhere."""
    return "openai" if path.startswith("/v1/") else "tei"


def app(server: Server, *, warmup: bool = True) -> Starlette:
    """The Starlette application serving `server`; warms up (then /health is 200) at startup
    and closes the Serving, finishing what is queued, at shutdown."""

    def endpoint(path: str, handler: Handler, inferring: bool):
        async def call(request: Request) -> Response:
            start, response = time.monotonic(), None
            try:
                if inferring and not server.ready:
                    raise ApiError(503, "the server is warming up; retry shortly",
                                   code="warming_up", headers={"Retry-After": "5"})  # fmt: skip
                response = await handler(server, request)
            except Exception as error:
                response = error_for(error).response(shape(path))
            finally:  # 499: the client went away while its request ran (nginx's status)
                status = 499 if response is None else response.status_code
                server.metrics.observe(path, status, time.monotonic() - start)
            return response

        return call

    known = {path for _, path in itertools.chain(server.routes, COMMON)}

    async def http_error(request: Request, error: Exception) -> Response:
        """Starlette's own refusals (404 no such route, 405 wrong method) as JSON, counted."""
        status = getattr(error, "status_code", 500)
        path = request.url.path
        message = (f"no route {path}; this server's are {', '.join(sorted(known))}"
                   if status == 404 else getattr(error, "detail", None) or str(error))  # fmt: skip
        answer = error_for(error) if status == 500 else ApiError(status, message)
        server.metrics.observe(path if path in known else "unmatched", answer.status, 0.0)
        return answer.response(shape(path))

    routes = [
        Route(path, endpoint(path, handler, inferring=(method, path) in server.routes),
              methods=[method])
        for (method, path), handler in itertools.chain(server.routes.items(), COMMON.items())
    ]  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        # Warm up beside the first requests, so that /health answers 503 meanwhile.
        loop = asyncio.get_running_loop()
        server.ready = not warmup
        warming = loop.run_in_executor(None, server.warmup) if warmup else None
        yield
        if warming is not None:
            await warming
        await loop.run_in_executor(None, server.close)

    starlette = Starlette(
        routes=routes, lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: http_error},
    )  # fmt: skip
    return BodyLimit(starlette, server.max_request_bytes)
