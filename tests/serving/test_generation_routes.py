"""OpenAI's /v1/completions and /v1/chat/completions through a real `transmuter serve` of the
GPT-2 fixture (a chat template added), with the official openai client: greedy answers equal
the pipeline's own generation of that request alone, token for token, batched or concurrent;
streamed chunks join to the answer; stop strings cut before themselves; a seed repeats a sample;
chat templates render as transformers' apply_chat_template (recorded by
tests/fixtures/make_chat.py); a client that leaves mid-stream stops its generation."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from test_http import Running

import transmuter
from transmuter.serving.api import ApiError
from transmuter.serving.chat import StopStream, render_chat

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CHAT = json.loads((FIXTURES / "chat" / "expected.json").read_text())


@pytest.mark.parametrize("case", CHAT["cases"], ids=lambda c: f"{c['template']}")
def test_chat_templates_render_as_transformers(case):
    config = {"chat_template": CHAT["templates"][case["template"]],
              "bos_token": {"content": CHAT["bos_token"]}, "eos_token": CHAT["eos_token"]}  # fmt: skip
    assert render_chat(config, case["messages"]) == case["rendered"]


def test_a_template_that_raises_is_a_400():
    config = {"chat_template": CHAT["templates"]["llama2"], "bos_token": "<s>", "eos_token": ""}
    with pytest.raises(ApiError, match="roles must alternate") as error:
        render_chat(config, [{"role": "assistant", "content": "first"}])
    assert error.value.status == 400 and error.value.param == "messages"


def test_stop_strings_cut_a_stream_before_themselves():
    stream = StopStream(["END", "xyz"])
    sent = [stream.feed(p) for p in ["abc E", "N", "D tail", "more"]]
    assert "".join(sent) == "abc " and stream.stopped and stream.finish() == ""
    stream = StopStream(["END"])
    assert stream.feed("abc E") == "abc " and stream.feed("x") == "Ex" and stream.finish() == ""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repos") / "gpt2-chat"
    shutil.copytree(FIXTURES / "pipelines" / "gpt2", folder)
    config = {"chat_template": CHAT["templates"]["chatml"], "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def server(repo):
    running = Running(repo, "text-generation", "--batch-timeout-ms", "50")
    yield running
    assert running.stop()


@pytest.fixture(scope="module")
def alone(repo):
    """A request's greedy new tokens generated alone by the pipeline, and their text."""
    pipeline = transmuter.pipeline("text-generation", repo)

    def generate(ids, n):
        (row,) = pipeline.generate([ids], max_new_tokens=n, do_sample=False)
        return row, pipeline.tokenizer.decode(row, skip_special_tokens=True)

    generate.tokenizer = pipeline.tokenizer
    return generate


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


PROMPTS = ["Once upon a time", "The quick brown fox", "Hello"]


def test_greedy_completions_are_the_pipelines_alone(client, alone):
    answer = client.completions.create(model="gpt2-chat", prompt=PROMPTS, max_tokens=12,
                                       temperature=0)  # fmt: skip
    for prompt, choice in zip(PROMPTS, answer.choices, strict=True):
        row, text = alone(alone.tokenizer.encode(prompt).ids, 12)
        assert choice.text == text
        assert choice.finish_reason == ("stop" if row[-1] == 0 else "length")
    prompt_tokens = sum(len(alone.tokenizer.encode(p).ids) for p in PROMPTS)
    assert answer.usage.prompt_tokens == prompt_tokens


def test_concurrent_completions_each_get_their_own(client, alone):
    prompts = [f"{p} {i}" for i in range(4) for p in PROMPTS]

    def ask(prompt):
        return client.completions.create(model="gpt2-chat", prompt=prompt, max_tokens=8,
                                         temperature=0).choices[0].text  # fmt: skip

    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(ask, prompts))
    assert got == [alone(alone.tokenizer.encode(p).ids, 8)[1] for p in prompts]


def test_streamed_chunks_join_to_the_answer_and_stop_cuts(client, alone):
    whole = client.completions.create(model="gpt2-chat", prompt=PROMPTS[0], max_tokens=16,
                                      temperature=0).choices[0].text  # fmt: skip
    stream = client.completions.create(model="gpt2-chat", prompt=PROMPTS[0], max_tokens=16,
                                       temperature=0, stream=True)  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    stop = whole[4:7]
    assert stop and stop in whole
    cut = client.completions.create(model="gpt2-chat", prompt=PROMPTS[0], max_tokens=16,
                                    temperature=0, stop=[stop])  # fmt: skip
    assert cut.choices[0].text == whole[: whole.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="gpt2-chat", prompt=PROMPTS[0], max_tokens=16,
                                         temperature=0, stop=stop, stream=True)  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == whole[: whole.index(stop)]


def test_chat_completions_render_then_generate(client, alone, repo):
    messages = [{"role": "user", "content": "Hello there"}]
    prompt = render_chat(json.loads((repo / "tokenizer_config.json").read_text()), messages)
    ids = alone.tokenizer.encode(prompt, add_special_tokens=False).ids
    _, text = alone(ids, 10)
    answer = client.chat.completions.create(model="gpt2-chat", messages=messages, max_tokens=10,
                                            temperature=0)  # fmt: skip
    assert answer.choices[0].message.content == text
    assert answer.choices[0].message.role == "assistant"
    assert answer.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model="gpt2-chat", messages=messages,
                                            max_tokens=10, temperature=0, stream=True)  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_a_seed_repeats_a_sample(client):
    def sample(seed):
        return client.completions.create(model="gpt2-chat", prompt="Hello", max_tokens=12,
                                         temperature=1.0, seed=seed).choices[0].text  # fmt: skip

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)  # the seed, not greedy decoding, decides


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"prompt": "Hi", "max_tokens": 500}, "max_tokens", "context_length_exceeded"),
        ({"prompt": "Hi", "temperature": 3}, "temperature", None),
        ({"prompt": "Hi", "n": 2}, "n", None),
        ({"prompt": "Hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", None),
        ({"prompt": ["a", "b"], "stream": True}, "prompt", None),
    ],
)
def test_bad_completions_name_the_field(server, body, param, code):
    answer = server.http.post("/v1/completions", json={"model": "gpt2-chat", **body})
    assert answer.status_code == 400
    assert (answer.json()["error"]["param"], answer.json()["error"]["code"]) == (param, code)


def test_bad_chat_messages_are_400(server):
    answer = server.http.post("/v1/chat/completions",
                              json={"model": "gpt2-chat", "messages": [{"role": "user"}]})  # fmt: skip
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages"


def test_a_client_that_leaves_mid_stream_stops_its_generation(server):
    before = server.metric("transmuter_generated_tokens_total")
    body = {"model": "gpt2-chat", "prompt": "Once", "max_tokens": 110, "temperature": 0,
            "stream": True}  # fmt: skip
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as answer:
            next(answer.iter_lines())  # the first chunk, then hang up
    time.sleep(1)
    done = server.http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2})
    assert done.status_code == 200
    # The abandoned generation counts none of its tokens: it ended with an error at the next
    # token after the disconnect; the finished request counts its own.
    assert server.metric("transmuter_generated_tokens_total") - before <= 2
