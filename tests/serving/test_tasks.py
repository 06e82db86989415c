"""Every task behind the server: the tasks without an OpenAI or TEI route answer `POST /predict`
in the Hugging Face Inference API's shape. For a task of each group (text: question-answering
and fill-mask; vision: image-classification; audio: audio-classification) requests sent alone,
concurrently and mixed (one item, lists, other parameters, all at once) each get what the
pipeline called alone returns. The app is `transmuter serve`'s, run in-process; one task also
runs through `transmuter serve` itself."""

from __future__ import annotations

import base64
import io
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient
from test_http import Running

import transmuter
from transmuter.serving import http

REPOS = Path(__file__).resolve().parents[1] / "fixtures" / "pipelines"


def serve(task: str, repo: str, **options):
    server = http.Server(transmuter.load_repo(REPOS / repo), task, model_id=repo, **options)
    return TestClient(http.app(server, warmup=False))


def close(got, want, path="answer"):
    """Equal JSON answers, floats within batching's noise (a batch pads its texts)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        for key in want:
            close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            close(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5), path
    else:
        assert got == want, path


def check(client, pipeline, requests, encode=lambda x: x):
    """Each request (inputs, parameters) sent alone, then all at once from as many threads;
    every answer is the pipeline's for that request alone."""
    want = [pipeline(inputs, **parameters) for inputs, parameters in requests]

    def ask(request):
        inputs, parameters = request
        body = {"inputs": encode(inputs), "parameters": parameters}
        answer = client.post("/predict", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    for request, w in zip(requests, want):
        close(ask(request), w)
    with ThreadPoolExecutor(len(requests)) as pool:
        for got, w in zip(pool.map(ask, requests * 2), want * 2):
            close(got, w)


QUESTIONS = [
    {"question": "who went home?", "context": "Alice went home after the party."},
    {"question": "what color?", "context": "The sky was blue and the grass green."},
    {"question": "where?", "context": "They met in Paris in spring."},
]


def test_question_answering():
    pipeline = transmuter.pipeline("question-answering", REPOS / "bert-qa")
    requests = [(QUESTIONS[0], {}), (QUESTIONS[1], {"top_k": 2}), (QUESTIONS, {}),
                (QUESTIONS[2], {"max_answer_len": 3}), (QUESTIONS[1:], {"top_k": 3})]  # fmt: skip
    with serve("question-answering", "bert-qa", batch_timeout_ms=50) as client:
        check(client, pipeline, requests)
        refused = client.post("/predict", json={"inputs": QUESTIONS[0], "parameters": {"k": 1}})
        assert refused.status_code == 400 and refused.json()["error_type"] == "Validation"
        assert "'k'" in refused.json()["error"] and "top_k" in refused.json()["error"]


def test_fill_mask():
    pipeline = transmuter.pipeline("fill-mask", REPOS / "bert-mlm")
    texts = ["Paris is the capital of [MASK].", "The [MASK] sat on the mat.", "Hello [MASK]!"]
    requests = [(texts[0], {}), (texts, {}), (texts[1], {"top_k": 2}), (texts[2], {}),
                ([texts[2], texts[0]], {"top_k": 1})]  # fmt: skip
    with serve("fill-mask", "bert-mlm", batch_timeout_ms=50) as client:
        check(client, pipeline, requests)
        refused = client.post("/predict", json={"inputs": "no mask here"})
        assert refused.status_code == 400 and "mask token" in refused.json()["error"]


def png(image: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_image_classification_takes_base64_and_data_urls():
    first = np.load(REPOS / "vit" / "images.npy")
    rng = np.random.default_rng(1)
    images = [first] + [rng.integers(0, 256, (32 + 8 * i, 40, 3), np.uint8) for i in range(3)]
    pipeline = transmuter.pipeline("image-classification", REPOS / "vit")

    def encode(inputs):
        if isinstance(inputs, list):
            return ["data:image/png;base64," + png(x) for x in inputs]
        return png(inputs)

    requests = [(images[0], {}), (images[:3], {}), (images[1], {"top_k": 2}),
                (images[2], {"function_to_apply": "none"})]  # fmt: skip
    with serve("image-classification", "vit", batch_timeout_ms=50) as client:
        check(client, pipeline, requests, encode)
        for inputs, message in [
            ("/etc/passwd", "is not base64"),  # never a path on the server
            (base64.b64encode(b"not an image").decode(), "is not an image"),
            (5, "an image is a base64 string"),
        ]:
            refused = client.post("/predict", json={"inputs": inputs})
            assert refused.status_code == 400 and message in refused.json()["error"]


def wav(samples: np.ndarray, rate: int) -> str:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes((samples * 32767).astype("<i2").tobytes())
    return base64.b64encode(buffer.getvalue()).decode()


def test_audio_classification_takes_wav_and_arrays():
    rng = np.random.default_rng(0)
    # Samples on the 16-bit grid, so that a WAV carries them exactly.
    clips = [np.round(rng.uniform(-0.5, 0.5, n) * 32767) / 32767 for n in (8000, 16000, 12000)]
    clips = [c.astype(np.float32) for c in clips]
    pipeline = transmuter.pipeline("audio-classification", REPOS / "ast")

    def encode(inputs):
        if isinstance(inputs, list):
            return [{"array": c.tolist(), "sampling_rate": 16000} for c in inputs]
        return wav(inputs, 16000)

    requests = [(clips[0], {}), (clips, {}), (clips[1], {"top_k": 1}), (clips[2], {})]
    with serve("audio-classification", "ast", batch_timeout_ms=50) as client:
        check(client, pipeline, requests, encode)
        bad = {"inputs": {"array": ["x"], "sampling_rate": 16000}}
        refused = client.post("/predict", json=bad)
        assert refused.status_code == 400 and "list of numbers" in refused.json()["error"]


def test_transmuter_serve_runs_a_task_without_openai_or_tei_routes():
    pipeline = transmuter.pipeline("fill-mask", REPOS / "bert-mlm")
    texts = ["Paris is the capital of [MASK].", "The [MASK] sat on the mat."]
    server = Running(REPOS / "bert-mlm", "fill-mask")  # warmed up: no example, ready at once
    try:
        one = server.http.post("/predict", json={"inputs": texts[0]}).json()
        close(one, pipeline(texts[0]))
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda t: server.http.post("/predict", json={"inputs": t}),
                                    texts * 2))  # fmt: skip
        for answer, text in zip(answers, texts * 2):
            close(answer.json(), pipeline(text))
        assert server.metric("transmuter_requests_total", route="/predict", status="200") == 5
    finally:
        assert server.stop()
