"""Faults injected into a running server, each bounded in time, all on 127.0.0.1: a pipeline
that raises (its batch-mates answered, the next request served); 100 MB bodies, declared and
chunked (413 while reading, memory flat); malformed UTF-8, JSON and nesting; clients that leave
mid-batch and mid-stream (their slots freed); 10,000 distinct sampling settings (no new
programs); SIGTERM under load (every request answered or refused, a clean exit); budgets
refused at start; hypothesis-generated bodies to every route (never a 500, never a hang); and,
marked slow, 64 clients for 60 s over mixed routes (nothing lost or mixed, RSS flat)."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from test_http import Running

import transmuter
from transmuter.errors import NodeError
from transmuter.serving import Serving, http

REPOS = Path(__file__).resolve().parents[1] / "fixtures" / "pipelines"


def rss(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def normalized(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def embeddings():
    return transmuter.pipeline("feature-extraction", REPOS / "bert", pooling="mean")


@pytest.fixture(scope="module")
def embedder():
    server = Running(REPOS / "bert", "feature-extraction", "--batch-timeout-ms", "20")
    yield server
    assert server.stop()


# -- a pipeline that raises ---------------------------------------------------------------------


class Raising:
    """The server's embedding pipeline, raising `error` for the text "boom"."""

    def __init__(self, pipeline, error: BaseException):
        self.pipeline, self.error = pipeline, error
        self.batch_key = pipeline.batch_key

    def run_items(self, items):
        if "boom" in items:
            raise self.error
        return self.pipeline.run_items(items)


@pytest.mark.parametrize(
    "error, code",
    [
        (RuntimeError("a bug"), "internal_error"),
        (MemoryError("no room"), "out_of_memory"),
        (NodeError("node 'MatMul_3' failed"), "internal_error"),
    ],  # fmt: skip
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v,
)
def test_a_raising_pipeline_fails_its_request_alone(embeddings, error, code):
    server = http.Server(transmuter.load_repo(REPOS / "bert"), "feature-extraction",
                         model_id="bert", batch_timeout_ms=200)  # fmt: skip
    server.serving.close()
    server.serving = Serving(Raising(server.pipeline, error), batch_timeout_ms=200)
    texts = ["a sentence", "boom", "another one"]
    with TestClient(http.app(server, warmup=False)) as client:
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda t: client.post("/embed", json={"inputs": t}), texts))
        for text, answer in zip(texts, answers):
            if text == "boom":
                assert answer.status_code == 500
                assert answer.json() == {"error": answer.json()["error"], "error_type": "Backend"}
                assert (
                    type(error).__name__ in answer.json()["error"]
                    or "out of memory" in (answer.json()["error"])
                )
            else:
                assert answer.status_code == 200
                np.testing.assert_allclose(answer.json()[0], normalized(embeddings(text)),
                                           atol=1e-6)  # fmt: skip
        openai = client.post("/v1/embeddings", json={"model": "bert", "input": "boom"})
        assert openai.status_code == 500 and openai.json()["error"]["code"] == code
        assert client.post("/embed", json={"inputs": "next"}).status_code == 200
        metrics = client.get("/metrics").text
        assert 'transmuter_requests_total{route="/embed",status="500"} 1.0' in metrics


def test_inference_routes_answer_503_while_warming_up():
    server = http.Server(transmuter.load_repo(REPOS / "bert"), "feature-extraction",
                         model_id="bert")  # fmt: skip
    gate, warm = threading.Event(), server.warmup
    server.warmup = lambda: (gate.wait(30), warm())
    with TestClient(http.app(server)) as client:
        early = client.post("/embed", json={"inputs": "too soon"})
        assert early.status_code == 503 and early.headers["retry-after"] == "5"
        assert early.json()["error_type"] == "Unhealthy"
        openai = client.post("/v1/embeddings", json={"model": "bert", "input": "too soon"})
        assert openai.status_code == 503 and openai.json()["error"]["code"] == "warming_up"
        assert client.get("/health").status_code == 503
        assert client.get("/metrics").status_code == 200  # not an inference route
        gate.set()
        assert wait_for(lambda: client.get("/health").status_code == 200, 60)
        assert client.post("/embed", json={"inputs": "now"}).status_code == 200


# -- bodies --------------------------------------------------------------------------------------


def post_raw(port: int, head: bytes, chunks, timeout: float = 30) -> bytes:
    """Send `head` then `chunks` until the server answers; the answer's bytes (b"" if the
    connection closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(head)
        answer = b""
        try:
            for chunk in chunks:
                if select.select([connection], [], [], 0)[0]:
                    break  # the server has answered before the end of the body
                connection.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        end = time.monotonic() + timeout
        while time.monotonic() < end and b"\r\n\r\n" not in answer:
            try:
                data = connection.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            answer += data
        try:
            while b"}" not in answer.partition(b"\r\n\r\n")[2]:
                data = connection.recv(65536)
                if not data:
                    break
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
        return answer


def test_hundred_megabyte_bodies_are_refused_while_read(embedder):
    before = rss(embedder.process.pid)
    size = 100 * 2**20
    megabyte = b"[" + b'"a",' * (2**18 - 1) + b'"a"]'[:3]
    declared = (f"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {size}\r\n\r\n").encode()  # fmt: skip
    answer = post_raw(embedder.port, declared, (megabyte for _ in range(100)))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body["error_type"] == "Validation" and "--max-request-bytes" in body["error"]
    chunked = (b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    framed = b"%x\r\n%s\r\n" % (len(megabyte), megabyte)
    answer = post_raw(embedder.port, chunked, (framed for _ in range(100)))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert rss(embedder.process.pid) - before < 50 * 2**20
    assert embedder.http.post("/embed", json={"inputs": "still here"}).status_code == 200
    assert embedder.metric("transmuter_requests_total", route="/embed", status="413") == 2


@pytest.mark.parametrize(
    "body",
    [b'{"inputs": "\xff\xfe"}', b'{"inputs": "\\ud800"}', b'{"inputs": "a"', b"[" * 100_000,
     b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", b"\x00\x01", b"", b"null"],
    ids=["bad-utf8", "lone-surrogate", "truncated", "deep-open", "deep-closed", "binary",
         "empty", "null"],
)  # fmt: skip
def test_malformed_bodies_are_400s(embedder, body):
    for route in ("/embed", "/v1/embeddings", "/tokenize"):
        answer = embedder.http.post(route, content=body)
        assert answer.status_code == 400, (route, answer.text)
        assert answer.json()  # JSON, in the route's shape
    assert embedder.http.post("/embed", json={"inputs": "fine"}).status_code == 200


# -- generation: clients that leave, sampling settings, budgets ---------------------------------


@pytest.fixture(scope="module")
def generator():
    server = Running(REPOS / "gpt2", "text-generation", "--max-model-len", "128",
                     "--batch-size", "4")  # fmt: skip
    yield server
    assert server.stop()


def wait_for(condition, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_client_that_leaves_mid_batch_frees_its_slot(generator):
    body = {"model": "gpt2", "prompt": "Once upon", "max_tokens": 120, "temperature": 0}
    before = generator.metric("transmuter_generated_tokens_total")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up while its tokens decode
        httpx.post(generator.url + "/v1/completions", json=body, timeout=0.3)
    assert wait_for(lambda: generator.metric("transmuter_generation_active") == 0)
    assert generator.metric("transmuter_generated_tokens_total") == before  # never finished
    assert wait_for(lambda: generator.metric("transmuter_requests_total",
                                             route="/v1/completions", status="499") == 1)  # fmt: skip
    short = generator.http.post("/v1/completions", json={**body, "max_tokens": 2})
    assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 2


def test_a_client_that_leaves_mid_stream_frees_its_slot(generator):
    body = {"model": "gpt2", "prompt": "Once", "max_tokens": 120, "temperature": 0,
            "stream": True}  # fmt: skip
    with httpx.Client(base_url=generator.url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as answer:
            first = next(answer.iter_lines())
            assert first.startswith("data: {")
    assert wait_for(lambda: generator.metric("transmuter_generation_active") == 0)
    assert generator.http.get("/health").status_code == 200


def test_max_tokens_is_checked_against_the_room_left(generator):
    answer = generator.http.post("/v1/completions", json={"model": "gpt2", "prompt": "Hello",
                                                          "max_tokens": 127})  # fmt: skip
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["code"] == "context_length_exceeded"
    assert error["param"] == "max_tokens" and "this server's context is 128" in error["message"]
    long = generator.http.post("/v1/completions", json={"model": "gpt2",
                                                        "prompt": "word " * 200})  # fmt: skip
    assert long.status_code == 400 and long.json()["error"]["param"] == "prompt"


def test_distinct_sampling_settings_compile_nothing_new(generator):
    def ask(i):
        body = {"model": "gpt2", "prompt": "Hi", "max_tokens": 1, "temperature": 0.05 + i / 250,
                "top_p": 0.5 + i / 500, "seed": i}  # fmt: skip
        return generator.http.post("/v1/completions", json=body).status_code

    ask(0)
    programs = generator.metric("transmuter_generation_programs")
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(ask, range(1, 201))) == {200}
    assert generator.metric("transmuter_generation_programs") == programs


def test_ten_thousand_sampling_settings_through_the_engine():
    from transmuter.pipelines.generation.continuous import ContinuousGeneration

    pipeline = transmuter.pipeline("text-generation", REPOS / "gpt2")
    engine = ContinuousGeneration(pipeline, slots=8, max_len=64, max_queue=10_000)
    try:
        engine.warmup([1, 2, 3, 4])
        programs = engine.programs
        rng = np.random.default_rng(0)
        futures = [
            engine.submit(
                [1, 2, 3, 4],
                max_new_tokens=1,
                do_sample=True,
                temperature=float(rng.uniform(0.1, 2)),
                top_p=float(rng.uniform(0.1, 1)),
                top_k=int(rng.integers(0, 50)),
                seed=i,
            )  # fmt: skip
            for i in range(10_000)
        ]
        assert all(len(f.result(120)) == 1 for f in futures)
        assert engine.programs - programs <= 2  # at most a window or two more: not per setting
    finally:
        engine.close()


def test_budgets_that_do_not_fit_are_refused_at_start(capsys):
    from transmuter.cli import main

    gpt2 = str(REPOS / "gpt2")
    assert main(["serve", gpt2, "--task", "text-generation", "--kv-memory", "1KiB"]) == 1
    assert "does not fit --kv-memory" in capsys.readouterr().err
    assert main(["serve", gpt2, "--task", "text-generation", "--max-model-len", "64",
                 "--kv-memory", "64KiB"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "1 slot of 64 positions need" in err or "8 slots of 64 positions need" in err
    assert main(["serve", gpt2, "--task", "text-generation", "--max-model-len", "99999"]) == 1
    assert "--max-model-len must be between 2 and the model's" in capsys.readouterr().err


def test_the_default_model_length_is_capped_to_fit_the_budget():
    repo = transmuter.load_repo(REPOS / "gpt2")
    pipeline = transmuter.pipeline("text-generation", repo)
    positions = repo.config.get("n_positions") or repo.config["max_position_embeddings"]
    full = http.model_length(pipeline, 8, None, 1 << 40)
    assert full == positions
    per_slot = sum(h * w * np.dtype(d).itemsize for _, ((h, w), d) in pipeline.decoder.shapes())
    budget = 8 * 64 * (per_slot + 8)  # 8 slots of a 64-position buffer: 32 positions each
    assert http.model_length(pipeline, 8, None, budget) == 32


# -- SIGTERM under load -------------------------------------------------------------------------


def test_sigterm_under_load_answers_or_refuses_every_request(embeddings):
    server = Running(REPOS / "bert", "feature-extraction", "--no-warmup")
    outcomes: list = []
    stop = threading.Event()

    def client(i):
        with httpx.Client(base_url=server.url, timeout=30) as http_client:
            for j in range(200):
                if stop.is_set():
                    return
                text = f"client {i} request {j}"
                try:
                    answer = http_client.post("/embed", json={"inputs": text})
                except httpx.TransportError:
                    outcomes.append(("gone", text, None))
                    return
                outcomes.append((answer.status_code, text, answer.json()))

    try:
        with ThreadPoolExecutor(16) as pool:
            running = [pool.submit(client, i) for i in range(16)]
            assert wait_for(lambda: len(outcomes) >= 32, 60)
            drained = server.stop()
            stop.set()
            for future in running:
                future.result(60)  # no client hangs
        assert drained, server.log[-2000:]
        answered = [(text, body) for status, text, body in outcomes if status == 200]
        assert len(answered) >= 32
        for text, body in answered[:: max(1, len(answered) // 20)]:  # each its own answer
            np.testing.assert_allclose(body[0], normalized(embeddings(text)), atol=1e-6)
        assert {s for s, _, _ in outcomes} <= {200, 503, "gone"}
    finally:
        server.process.kill()


# -- hypothesis: every route, any body ----------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
FIELDS = ["model", "input", "inputs", "prompt", "messages", "query", "texts", "parameters",
          "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "normalize",
          "truncate", "encoding_format", "raw_scores", "return_text", "n", "top_k"]  # fmt: skip
TEXTY = st.text(max_size=30) | st.lists(st.text(max_size=30), min_size=1, max_size=3)
BODIES = st.one_of(
    st.binary(max_size=64),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(FIELDS), JSON | TEXTY, max_size=6).map(
        lambda v: json.dumps(v).encode()
    ),
    st.fixed_dictionaries(
        {"model": st.sampled_from(["m", "x"]), "max_tokens": st.integers(1, 4)},
        optional={"prompt": TEXTY, "input": TEXTY, "inputs": TEXTY, "query": st.text(max_size=9),
                  "texts": TEXTY, "temperature": st.floats(0, 2), "stream": st.booleans(),
                  "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(
                      ["user", "assistant"]), "content": st.text(max_size=20)}), max_size=3)},
    ).map(lambda v: json.dumps(v).encode()),
)  # fmt: skip
SERVERS = {
    "feature-extraction": "bert",
    "text-classification": "bert-sst",
    "question-answering": "bert-qa",
    "text-generation": "gpt2",
    "automatic-speech-recognition": "whisper",
}


@pytest.fixture(scope="module")
def clients():
    """An in-process app of each kind, model id "m"; all closed at the end."""
    opened = {}
    for task, repo in SERVERS.items():
        options = {"max_model_len": 64} if task == "text-generation" else {}
        server = http.Server(transmuter.load_repo(REPOS / repo), task, model_id="m",
                             batch_timeout_ms=1, **options)  # fmt: skip
        client = TestClient(http.app(server, warmup=False))
        opened[task] = client.__enter__()
    yield opened
    for client in opened.values():
        client.__exit__(None, None, None)


def routes():
    return [(task, path) for task in SERVERS
            for (method, path) in http.routes_for(task) if method == "POST"]  # fmt: skip


@pytest.mark.parametrize("task, path", routes())
def test_any_body_to_any_route_is_answered_without_a_500(clients, task, path):
    client = clients[task]

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(body=BODIES)
    def post(body):
        answer = client.post(path, content=body, headers={"content-type": "application/json"})
        assert answer.status_code < 500, (body, answer.text)
        if answer.headers["content-type"].startswith("application/json"):
            answer.json()

    post()
    assert client.get("/health").status_code == 200


# -- soak ------------------------------------------------------------------------------------------


@pytest.mark.slow  # 60 s of 64 clients, plus the servers' start
def test_sixty_four_clients_for_a_minute_over_mixed_routes(embeddings):
    server = Running(REPOS / "bert", "feature-extraction", "--max-client-batch-size", "8")
    pool = ThreadPoolExecutor(64)
    try:
        texts = [f"soak text {i} " + "word " * (i % 9) for i in range(64)]
        want = {t: normalized(embeddings(t)) for t in texts}

        def one(i, j):
            text = texts[(i + j) % len(texts)]
            route = ("/embed", "/v1/embeddings", "/tokenize", "/nothing")[j % 4]
            body = ({"model": "bert", "input": text} if route == "/v1/embeddings"
                    else {"inputs": text})  # fmt: skip
            return route, text, http_clients[i].post(route, json=body)

        http_clients = [httpx.Client(base_url=server.url, timeout=60) for _ in range(64)]

        def client(i, seconds):
            end, seen = time.monotonic() + seconds, 0
            while time.monotonic() < end:
                route, text, answer = one(i, seen)
                seen += 1
                if route == "/nothing":
                    assert answer.status_code == 404 and answer.json()["error_type"]
                    continue
                assert answer.status_code == 200, answer.text
                if route == "/embed":
                    np.testing.assert_allclose(answer.json()[0], want[text], atol=1e-6)
                elif route == "/v1/embeddings":
                    np.testing.assert_allclose(answer.json()["data"][0]["embedding"], want[text],
                                               atol=1e-6)  # fmt: skip
            return seen

        list(pool.map(client, range(64), [5] * 64))  # warm-up: every bucket compiled
        warm = rss(server.process.pid)
        counts = list(pool.map(client, range(64), [60] * 64))
        assert rss(server.process.pid) - warm < 50 * 2**20
        assert sum(counts) > 64 and server.http.get("/health").status_code == 200
        assert server.metric("transmuter_queue_depth") == 0
        for client_ in http_clients:
            client_.close()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        assert server.stop()
