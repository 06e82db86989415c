"""The HTTP server of `transmuter serve`: a pipeline behind `Serving`, on Starlette.

Routes by task (`ROUTES`): OpenAI's `POST /v1/embeddings`, `/v1/completions` and
`/v1/chat/completions` (completions.py) and `/v1/audio/transcriptions` (audio.py);
text-embeddings-inference's `POST /embed`, `/predict`, `/rerank` and `/tokenize`; for every
task `GET /v1/models`, `/health` (200 once warmed up, 503 before) and `/metrics` (Prometheus'
text format). Errors use OpenAI's
shape `{"error": {"message", "type", "param", "code"}}`: 400 for bad requests naming the field,
404 for an unknown model, 413 past `max_client_batch_size`, 429 with Retry-After when the queue
is full, 503 with Retry-After while closing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from transmuter import telemetry
from transmuter.errors import InputError, Overloaded, ServingClosed
from transmuter.pipelines import Repo, pipeline
from transmuter.pipelines.generation.continuous import ContinuousGeneration
from transmuter.pipelines.text.encoders import sentence_embedding
from transmuter.serving.api import ApiError, flag, json_body
from transmuter.serving.audio import transcriptions
from transmuter.serving.batching import Serving
from transmuter.serving.completions import chat_completions, completions


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
    in "model" (the CLI's default: the repo folder's name)."""

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
    ):
        if task not in ROUTES:
            raise InputError(f"transmuter serve runs {', '.join(ROUTES)}; got task {task!r}")
        if decoding is not None and task != "automatic-speech-recognition":
            raise InputError(f"decoding is automatic-speech-recognition's; got task {task!r}")
        self.task, self.model_id, self.repo = task, model_id, repo
        # Embeddings pool as the repo's sentence-transformers config says; normalizing is the
        # routes' (the repo's choice for OpenAI's, the request's for TEI's /embed).
        self.embedding = sentence_embedding(repo) if task == "feature-extraction" else {}
        options = {**TASK_OPTIONS.get(task, {}), **self.embedding}
        if task == "feature-extraction":
            options["normalize"] = False
        generating = task == "text-generation"
        if task in ("feature-extraction", "text-classification"):
            options["batch_size"] = batch_size  # the pipeline's chunks as large as the batches
        if decoding is not None:
            options["decoding"] = decoding
        self.pipeline = pipeline(task, repo, **options)
        self.tokenizer = repo.tokenizer
        self.max_client_batch_size = max_client_batch_size
        # Generation batches continuously: a decode batch of batch_size slots that requests
        # join and leave between steps. The other tasks batch concurrent requests by Serving.
        if generating:
            self.engine = ContinuousGeneration(self.pipeline, slots=batch_size, max_queue=max_queue)
            self.serving = None
        else:
            self.serving = Serving(self.pipeline, batch_size=batch_size,
                                   batch_timeout_ms=batch_timeout_ms, max_queue=max_queue)  # fmt: skip
        self.ready = False  # after warmup(): /health is 200
        self.metrics = Metrics(lambda: (self.serving or self.engine).queued)
        self.created = int(time.time())

    def warmup(self) -> None:
        """Compile before traffic (the batch sizes of a short text; generation's steps for
        every count of running requests and short prompts' prefill); /health is 200 after."""
        if self.serving is None:
            self.engine.warmup(self.tokenizer.encode("warm up").ids)
        else:
            self.serving.warmup(["warm up"])
        self.ready = True

    def generate(self, prompt: list[int], **options: Any) -> Future:
        """A generation's Future (its new token ids) from the continuous batch; refusals as
        ApiErrors. Finished generations count their tokens in the metrics."""
        try:
            future = self.engine.submit(prompt, **options)
        except (InputError, Overloaded, ServingClosed) as error:
            raise self.error(error) from None
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

    def texts(self, body: dict, field: str) -> tuple[list[str], bool]:
        """The body's `field`: a string or a non-empty list of at most max_client_batch_size
        strings; and whether it was one string."""
        value = body.get(field)
        if isinstance(value, str):
            return [value], True
        if not isinstance(value, list) or not value:
            raise ApiError(400, f"'{field}' must be a string or a non-empty list of strings",
                           param=field)  # fmt: skip
        if not all(isinstance(v, str) for v in value):
            raise ApiError(400, f"'{field}' must hold strings only (token arrays are not "
                           "accepted)", param=field)  # fmt: skip
        if len(value) > self.max_client_batch_size:
            raise ApiError(
                413, f"'{field}' has {len(value)} items; this server takes at most "
                f"{self.max_client_batch_size} (--max-client-batch-size)", param=field,
                code="batch_too_large",
            )  # fmt: skip
        return value, False

    def check_model(self, body: dict) -> None:
        """OpenAI's routes name the model: it must be this server's."""
        model = body.get("model")
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

    async def infer(self, items: list, **options: Any) -> Any:
        """The pipeline's rows for `items`, batched with other requests by `Serving`."""
        try:
            return await self.serving.infer(items, **options)
        except (InputError, Overloaded, ServingClosed) as error:
            raise self.error(error) from None

    @staticmethod
    def error(error: Exception) -> ApiError:
        """The HTTP answer to an error of Serving or of a pipeline."""
        if isinstance(error, Overloaded):
            return ApiError(429, str(error), code="queue_full", kind="server_error",
                            headers={"Retry-After": "1"})  # fmt: skip
        if isinstance(error, ServingClosed):
            return ApiError(503, str(error), code="shutting_down", kind="server_error",
                            headers={"Retry-After": "5"})  # fmt: skip
        if isinstance(error, InputError):
            return ApiError(400, str(error))
        return ApiError(500, f"{type(error).__name__}: {error}", kind="server_error")


# -- routes -------------------------------------------------------------------------------------


async def openai_embeddings(server: Server, request: Request) -> JSONResponse:
    body = await json_body(request)
    server.check_model(body)
    texts, _ = server.texts(body, "input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise ApiError(400, "'encoding_format' must be 'float' or 'base64'",
                       param="encoding_format")  # fmt: skip
    if "dimensions" in body:
        raise ApiError(400, "'dimensions' is not supported: the model's size is fixed",
                       param="dimensions")  # fmt: skip
    counts = server.token_counts(texts, flag(body, "truncate", False), "input")
    vectors = np.asarray(await server.infer(texts), np.float32)
    vectors = server.normalized(vectors, server.embedding["normalize"])
    data = [
        {"object": "embedding", "index": i,
         "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
         if encoding == "base64" else v.tolist()}
        for i, v in enumerate(vectors)
    ]  # fmt: skip
    usage = {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}
    return JSONResponse({"object": "list", "data": data, "model": server.model_id, "usage": usage})


async def tei_embed(server: Server, request: Request) -> JSONResponse:
    body = await json_body(request)
    texts, _ = server.texts(body, "inputs")
    server.token_counts(texts, flag(body, "truncate", False), "inputs")
    vectors = np.asarray(await server.infer(texts), np.float32)
    return JSONResponse(server.normalized(vectors, flag(body, "normalize", True)).tolist())


async def tei_predict(server: Server, request: Request) -> JSONResponse:
    body = await json_body(request)
    texts, single = server.texts(body, "inputs")
    server.token_counts(texts, flag(body, "truncate", False), "inputs")
    ranked = await server.infer(texts)  # every label, best first (top_k=None)
    return JSONResponse(ranked[0] if single else ranked)


async def tei_rerank(server: Server, request: Request) -> JSONResponse:
    """TEI's /rerank: a one-label cross-encoder's score of (query, text) for each text, best
    first; the sigmoid of its logit, or the logit itself with raw_scores."""
    body = await json_body(request)
    query = body.get("query")
    if not isinstance(query, str):
        raise ApiError(400, "'query' must be a string", param="query")
    texts, _ = server.texts(body, "texts")
    labels = len(server.repo.config.get("id2label") or {})
    if labels != 1:
        raise ApiError(400, f"/rerank needs a cross-encoder with one label; this model has "
                       f"{labels}", code="not_a_reranker")  # fmt: skip
    server.token_counts([(query, t) for t in texts], flag(body, "truncate", False), "texts")
    apply = "none" if flag(body, "raw_scores", False) else "sigmoid"
    pairs = [{"text": query, "text_pair": t} for t in texts]
    ranked = await server.infer(pairs, function_to_apply=apply)
    scores = np.array([row[0]["score"] for row in ranked])
    with_text = flag(body, "return_text", False)
    results = [{"index": int(i), "score": float(scores[i]), **({"text": texts[i]} if with_text
                else {})} for i in np.argsort(-scores, kind="stable")]  # fmt: skip
    return JSONResponse(results)


async def tei_tokenize(server: Server, request: Request) -> JSONResponse:
    body = await json_body(request)
    texts, _ = server.texts(body, "inputs")
    special = flag(body, "add_special_tokens", True)
    rows = []
    for encoding in server.tokenizer.encode_batch(texts, add_special_tokens=special):
        rows.append([
            {"id": i, "text": token, "special": bool(s), "start": start, "stop": stop}
            for i, token, s, (start, stop) in zip(
                encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets
            )
        ])  # fmt: skip
    return JSONResponse(rows)


async def models(server: Server, request: Request) -> JSONResponse:
    card = {"id": server.model_id, "object": "model", "created": server.created,
            "owned_by": "transmuter", "task": server.task, **server.embedding}  # fmt: skip
    return JSONResponse({"object": "list", "data": [card]})


async def health(server: Server, request: Request) -> JSONResponse:
    if not server.ready:
        return JSONResponse({"status": "warming up"}, 503, headers={"Retry-After": "5"})
    return JSONResponse({"status": "ok"})


async def metrics(server: Server, request: Request) -> Response:
    return server.metrics.exposition()


Handler = Callable[[Server, Request], Any]
COMMON: dict[tuple[str, str], Handler] = {
    ("GET", "/v1/models"): models,
    ("GET", "/health"): health,
    ("GET", "/metrics"): metrics,
}
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
    },
    "text-generation": {
        ("POST", "/v1/completions"): completions,
        ("POST", "/v1/chat/completions"): chat_completions,
        ("POST", "/tokenize"): tei_tokenize,
    },
}
# The pipeline options a task is served with (text-classification: every label, as TEI).
TASK_OPTIONS = {"text-classification": {"top_k": None}}


def app(server: Server, *, warmup: bool = True) -> Starlette:
    """The Starlette application serving `server`; warms up (then /health is 200) at startup
    and closes the Serving, finishing what is queued, at shutdown."""

    def endpoint(path: str, handler: Handler):
        async def call(request: Request) -> Response:
            start = time.monotonic()
            try:
                response = await handler(server, request)
            except ApiError as error:
                response = error.response()
            server.metrics.observe(path, response.status_code, time.monotonic() - start)
            return response

        return call

    routes = [
        Route(path, endpoint(path, handler), methods=[method])
        for (method, path), handler in itertools.chain(ROUTES[server.task].items(),
                                                       COMMON.items())
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

    return Starlette(routes=routes, lifespan=lifespan)
