"""`transmuter serve` for real: the server in a subprocess on a free loopback port, talked to
with httpx and with the official openai client. Embeddings equal the pipeline's, TEI's routes
answer as TEI does, bad requests get OpenAI's error shape with a 4xx naming the field, a full
queue a 503 with Retry-After, and under 64 concurrent clients every response is its own
request's while the metrics add up. SIGTERM answers what is queued, then exits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

import transmuter

REPOS = Path(__file__).resolve().parents[1] / "fixtures" / "pipelines"
SERVE = "from transmuter.cli import main; raise SystemExit(main())"


class Running:
    """A `transmuter serve` process and an httpx client for it."""

    def __init__(
        self, repo: Path, task: str, *options: str, ready: bool = True, env: dict | None = None
    ):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-c", SERVE, "serve", str(repo), "--task", task,
                   "--port", str(self.port), *options]  # fmt: skip
        environment = None if env is None else {**os.environ, **env}
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment)
        self.http = httpx.Client(base_url=self.url, timeout=120)
        self.wait(200 if ready else None)

    def wait(self, status: int | None, timeout: float = 180) -> None:
        """Until /health answers (`status` None: anything), or fail with the server's stderr."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                pytest.fail(f"the server exited: {self.process.stderr.read()[-3000:]}")
            try:
                answer = self.http.get("/health")
                if status is None or answer.status_code == status:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        pytest.fail("the server did not become ready")

    def metric(self, name: str, **labels: str) -> float:
        """A sample's value from /metrics (0 when absent)."""
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                       if labels else "")  # fmt: skip
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def stop(self) -> bool:
        """SIGTERM; whether the server drained and exited by it (uvicorn re-raises the signal
        after its graceful shutdown, so the exit status is the signal's)."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        self.http.close()
        self.log = self.process.stderr.read()  # what the server printed
        return code in (0, -signal.SIGTERM) and "Traceback" not in self.log


@pytest.fixture(scope="module")
def embedder():
    server = Running(REPOS / "bert", "feature-extraction", "--max-client-batch-size", "4")
    yield server
    assert server.stop()  # SIGTERM drains and exits cleanly


@pytest.fixture(scope="module")
def pipelines():
    return {
        "mean": transmuter.pipeline("feature-extraction", REPOS / "bert", pooling="mean"),
        "predict": transmuter.pipeline("text-classification", REPOS / "bert-sst", top_k=None),
    }


def normalized(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


TEXTS = ["the quick brown fox", "jumps over", "the lazy dog and the cat"]


def test_openai_client_embeddings_are_the_pipelines(embedder, pipelines):
    client = openai.OpenAI(base_url=embedder.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["bert"]
    answer = client.embeddings.create(model="bert", input=TEXTS)  # base64, the client's default
    got = np.array([d.embedding for d in answer.data])
    np.testing.assert_allclose(got, normalized(pipelines["mean"](TEXTS)), atol=1e-6)
    tokenizer = pipelines["mean"].encoder.tokenizer
    assert answer.usage.prompt_tokens == sum(len(tokenizer.encode(t).ids) for t in TEXTS)
    floats = embedder.http.post(
        "/v1/embeddings", json={"model": "bert", "input": TEXTS[0], "encoding_format": "float"}
    ).json()
    np.testing.assert_allclose(floats["data"][0]["embedding"], got[0], atol=1e-6)
    assert floats["object"] == "list" and floats["data"][0]["index"] == 0


def test_tei_routes(embedder, pipelines):
    embed = embedder.http.post("/embed", json={"inputs": TEXTS}).json()
    np.testing.assert_allclose(embed, normalized(pipelines["mean"](TEXTS)), atol=1e-6)
    raw = embedder.http.post("/embed", json={"inputs": TEXTS[1], "normalize": False}).json()
    np.testing.assert_allclose(raw, [pipelines["mean"](TEXTS[1])], atol=1e-6)
    tokens = embedder.http.post("/tokenize", json={"inputs": TEXTS[:2]}).json()
    encoding = pipelines["mean"].encoder.tokenizer.encode(TEXTS[0])
    assert [t["id"] for t in tokens[0]] == encoding.ids and len(tokens) == 2
    assert tokens[0][0]["special"] and tokens[0][1]["text"] == encoding.tokens[1]
    assert (tokens[0][1]["start"], tokens[0][1]["stop"]) == encoding.offsets[1]


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        (b"{not json", 400, None, "invalid_json"),
        (b'{"model": "bert", "input": "\\ud800"}', 400, None, "invalid_json"),
        (b'{"model": "bert", "input": "\xff"}', 400, None, "invalid_json"),
        (b"[" * 100_000, 400, None, "invalid_json"),
        ({"model": "bert", "input": []}, 400, "input", None),
        ({"model": "gpt-4", "input": "x"}, 404, "model", "model_not_found"),
        ({"input": "x"}, 404, "model", "model_not_found"),
        ({"model": "bert", "input": 5}, 400, "input", None),
        ({"model": "bert", "input": [[1, 2]]}, 400, "input", None),
        ({"model": "bert", "input": ["a"] * 5}, 413, "input", "batch_too_large"),
        ({"model": "bert", "input": "word " * 80}, 400, "input", "context_length_exceeded"),
        ({"model": "bert", "input": "x", "encoding_format": "hex"}, 400, "encoding_format", None),
        ({"model": "bert", "input": "x", "dimensions": 8}, 400, "dimensions", None),
    ],
)
def test_bad_requests_get_openais_error_shape(embedder, body, status, param, code):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = embedder.http.post("/v1/embeddings", content=content)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code)


def test_truncate_true_takes_a_long_input(embedder):
    body = {"model": "bert", "input": "word " * 80, "truncate": True}
    answer = embedder.http.post("/v1/embeddings", json=body)
    assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == 64


@pytest.mark.slow  # 128 requests from 64 clients: about 10 s on 2 cores
def test_sixty_four_clients_each_get_their_own_answer(embedder, pipelines):
    texts = [f"request {i} " + "word " * (i % 7) for i in range(128)]
    want = normalized(pipelines["mean"](texts))
    before = embedder.metric("transmuter_requests_total", route="/embed", status="200")
    batches = embedder.metric("transmuter_batch_size_count")

    def ask(i):
        with httpx.Client(base_url=embedder.url, timeout=120) as http:
            return i, http.post("/embed", json={"inputs": texts[i]})

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(ask, range(len(texts))))
    assert all(a.status_code == 200 for _, a in answers)
    for i, answer in answers:
        np.testing.assert_allclose(answer.json()[0], want[i], atol=1e-6)
    after = embedder.metric("transmuter_requests_total", route="/embed", status="200")
    assert after - before == len(texts)
    calls = embedder.metric("transmuter_batch_size_count") - batches
    assert 0 < calls < len(texts)  # batched: fewer calls than requests
    assert embedder.metric("transmuter_queue_depth") == 0


def test_health_and_metrics_exposition(embedder):
    assert embedder.http.get("/health").json() == {"status": "ok"}
    text = embedder.http.get("/metrics").text
    assert "# TYPE transmuter_request_duration_seconds histogram" in text
    assert embedder.metric("transmuter_compiles_total") >= 1
    assert embedder.metric("transmuter_requests_total", route="/health", status="200") >= 1


def same_ranking(got: list[dict], want: list[dict]) -> None:
    assert [g["label"] for g in got] == [w["label"] for w in want]
    np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], rtol=1e-5)


@pytest.fixture(scope="module")
def classifier():
    server = Running(REPOS / "bert-sst", "text-classification", "--no-warmup")
    yield server
    assert server.stop()


def test_text_classification_predict(classifier, pipelines):
    one = classifier.http.post("/predict", json={"inputs": TEXTS[0]}).json()
    same_ranking(one, pipelines["predict"]([TEXTS[0]])[0])  # TEI: one text, one ranking
    many = classifier.http.post("/predict", json={"inputs": TEXTS}).json()
    for got, want in zip(many, pipelines["predict"](TEXTS), strict=True):
        same_ranking(got, want)
    assert classifier.http.post("/v1/embeddings", json={}).status_code == 404  # not this task


def test_a_full_queue_answers_503_with_retry_after():
    # One request waits out a long batch timeout in the queue; the next finds it full.
    server = Running(REPOS / "bert", "feature-extraction", "--no-warmup", "--max-queue", "1",
                     "--batch-timeout-ms", "3000")  # fmt: skip
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(server.http.post, "/embed", json={"inputs": "first"})
            while server.metric("transmuter_queue_depth") < 1:
                time.sleep(0.05)
            refused = server.http.post("/embed", json={"inputs": "second"})
            assert server.metric("transmuter_requests_total", route="/embed", status="503") == 1
            drained = server.stop()  # SIGTERM while the first request still waits
            assert first.result().status_code == 200 and drained
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert refused.json() == {"error": refused.json()["error"], "error_type": "Overloaded"}
    finally:
        server.process.kill()


def test_sentence_transformers_pooling_is_followed(tmp_path, pipelines):
    repo = tmp_path / "st-bert"
    shutil.copytree(REPOS / "bert", repo)
    (repo / "1_Pooling").mkdir()
    (repo / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 32,
                "pooling_mode_cls_token": True,
                "pooling_mode_mean_tokens": False,
            }
        )  # fmt: skip
    )
    (repo / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))  # fmt: skip
    server = Running(repo, "feature-extraction", "--no-warmup")
    try:
        card = server.http.get("/v1/models").json()["data"][0]
        assert card["id"] == "st-bert" and (card["pooling"], card["normalize"]) == ("cls", False)
        got = server.http.post("/v1/embeddings", json={"model": "st-bert", "input": TEXTS})
        cls = transmuter.pipeline("feature-extraction", repo, pooling="cls")(TEXTS)
        vectors = [d["embedding"] for d in got.json()["data"]]
        np.testing.assert_allclose(vectors, cls, atol=1e-6)  # not normalized: no Normalize module
    finally:
        assert server.stop()


def one_label_cross_encoder(folder: Path) -> Path:
    """bert-sst with its logits cut to the first label: a one-label cross-encoder's shape."""
    import onnx
    from onnx import helper

    repo = folder / "reranker"
    shutil.copytree(REPOS / "bert-sst", repo)
    model = onnx.load(repo / "model.onnx")
    graph = model.graph
    (logits,) = [o for o in graph.output if o.name == "logits"]
    for node in graph.node:
        node.output[:] = ["all_logits" if o == "logits" else o for o in node.output]
    for name, value in (("starts", 0), ("ends", 1), ("axes", 1)):
        graph.initializer.append(helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value]))
    graph.node.append(helper.make_node("Slice", ["all_logits", "starts", "ends", "axes"],
                                       ["logits"]))  # fmt: skip
    logits.type.tensor_type.shape.dim[1].dim_value = 1
    onnx.save(model, repo / "model.onnx")
    config = json.loads((repo / "config.json").read_text())
    config.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    (repo / "config.json").write_text(json.dumps(config))
    return repo


def test_rerank_scores_pairs_best_first(tmp_path, classifier):
    repo = one_label_cross_encoder(tmp_path)
    classify = transmuter.pipeline("text-classification", repo, top_k=None)
    query, texts = "a fox", ["the quick brown fox", "a lazy dog", "foxes and dogs"]
    pairs = [{"text": query, "text_pair": t} for t in texts]
    logits = [row[0]["score"] for row in classify(pairs, function_to_apply="none")]
    server = Running(repo, "text-classification", "--no-warmup")
    try:
        raw = server.http.post("/rerank", json={"query": query, "texts": texts,
                                                "raw_scores": True, "return_text": True})  # fmt: skip
        order = np.argsort(logits)[::-1]
        assert [r["index"] for r in raw.json()] == order.tolist()
        np.testing.assert_allclose([r["score"] for r in raw.json()], np.sort(logits)[::-1],
                                   rtol=1e-5)  # fmt: skip
        assert [r["text"] for r in raw.json()] == [texts[i] for i in order]
        scored = server.http.post("/rerank", json={"query": query, "texts": texts}).json()
        np.testing.assert_allclose([r["score"] for r in scored],
                                   1 / (1 + np.exp(-np.sort(logits)[::-1])), rtol=1e-5)  # fmt: skip
        assert "text" not in scored[0]
        # The pair template: [CLS] query [SEP] text [SEP], token types 0 then 1.
        ids = classify.encoder.encode(pairs[:1])[0]
        assert ids.type_ids[-1] == 1 and ids.type_ids[0] == 0
    finally:
        assert server.stop()
    refused = classifier.http.post("/rerank", json={"query": "q", "texts": ["t"]})  # 3 labels
    assert refused.status_code == 400 and "one label" in refused.json()["error"]
    assert refused.json()["error_type"] == "Validation"  # TEI's error shape


@pytest.mark.slow
def test_replicas_behind_a_balancer_answer_alike_and_one_can_drain():
    # Two replicas on one machine, as a load balancer would have them: stateless, so any
    # request gets the same answer from either; one drained (SIGTERM) leaves the other serving.
    replicas = [Running(REPOS / "bert", "feature-extraction") for _ in range(2)]
    try:
        answers = [
            replicas[i % 2].http.post("/embed", json={"inputs": TEXTS[i % 3]}).json()
            for i in range(6)
        ]
        for i in range(3):
            np.testing.assert_allclose(answers[i], answers[i + 3], atol=1e-6)  # other replica
        assert replicas[0].stop()
        assert replicas[1].http.get("/health").status_code == 200
        assert replicas[1].http.post("/embed", json={"inputs": "still here"}).status_code == 200
    finally:
        for replica in replicas:
            replica.process.kill()


def test_serve_refuses_a_task_it_does_not_know(capsys):
    from transmuter.cli import main

    assert main(["serve", str(REPOS / "bert"), "--task", "fill-masks"]) == 1
    assert "unknown task 'fill-masks'; the tasks are feature-extraction" in capsys.readouterr().err
