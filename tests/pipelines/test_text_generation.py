"""text-generation against transformers' greedy generate() (tests/fixtures/make_pipelines.py),
and the number of programs a long generation compiles."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import REPOS, expected

import transmuter
from transmuter.errors import InputError


@pytest.fixture(scope="module")
def llama():
    return transmuter.pipeline("text-generation", REPOS / "llama")


@pytest.mark.parametrize("case", ["single", "batch", "penalty"])
def test_llama_greedy_tokens_are_transformers(llama, case):
    want = expected("llama")[case]
    got = llama.generate(want["input_ids"], max_new_tokens=40, **want["options"])
    assert got == want["new_tokens"]


def gpt2_repo(tmp_path, keep: str):
    """The gpt2 fixture with one of its decoders only (and no plain decoder_model.onnx)."""
    for path in (REPOS / "gpt2").iterdir():
        if not path.name.endswith(".onnx") or path.name == keep:
            shutil.copy(path, tmp_path / path.name)
    return tmp_path


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The pipeline of each of the gpt2 fixture's decoders, built once."""
    made = {}

    def pipeline(keep: str):
        if keep not in made:
            repo = gpt2_repo(tmp_path_factory.mktemp(keep.removesuffix(".onnx")), keep)
            made[keep] = transmuter.pipeline("text-generation", repo)
        return made[keep]

    return pipeline


# Each decoder on a batch of prompts of three lengths ("single" is one of them alone); the
# repetition penalty, which the choice of tokens applies whatever the decoder, on one.
@pytest.mark.slow
@pytest.mark.parametrize(
    "keep, case",
    [
        ("decoder_model_merged.onnx", "batch"),
        ("decoder_model_merged.onnx", "penalty"),
        ("decoder_with_past_model.onnx", "batch"),
    ],
)
def test_gpt2_greedy_tokens_are_transformers(gpt2, keep, case):
    generate = gpt2(keep)
    assert generate.decoder.merged == (keep == "decoder_model_merged.onnx")
    want = expected("gpt2")[case]
    assert (
        generate.generate(want["input_ids"], max_new_tokens=40, **want["options"])
        == want["new_tokens"]
    )


def test_a_long_generation_compiles_a_handful_of_programs(llama):
    prompts = expected("llama")["batch"]["input_ids"]
    before = llama.programs
    rows = llama.generate(prompts, max_new_tokens=200, eos_token_id=None)
    assert [len(r) for r in rows] == [200] * 3
    assert llama.programs - before <= 8
    again = llama.generate(prompts, max_new_tokens=200, eos_token_id=None)
    assert again == rows and llama.programs - before <= 8  # served from the same programs


def test_end_of_sequence_and_min_new_tokens(llama):
    want = expected("llama")["single"]
    tokens = want["new_tokens"][0]
    eos = tokens[5]
    assert llama.generate(want["input_ids"], eos_token_id=[eos, 9999])[0] == tokens[:6]
    held = llama.generate(want["input_ids"], eos_token_id=eos, min_new_tokens=7, max_new_tokens=7)
    assert len(held[0]) == 7 and eos not in held[0]


def test_text_streaming_and_stop_strings(llama):
    pieces = []
    out = llama(
        "Once upon a time", max_new_tokens=12, on_token=lambda row, text: pieces.append(text)
    )
    text = out[0]["generated_text"]
    assert text.startswith("Once upon a time") and text == "Once upon a time" + "".join(pieces)
    stop = "".join(pieces)[2:4]
    cut = llama("Once upon a time", max_new_tokens=12, stop=[stop], return_full_text=False)
    assert stop in cut[0]["generated_text"] and len(cut[0]["generated_text"]) < len("".join(pieces))
    batch = llama(["Hello", "The capital of France is"], max_new_tokens=4)
    assert [len(b) for b in batch] == [1, 1] and batch[0][0]["generated_text"].startswith("Hello")


def test_sampling_is_seeded_and_top_k_1_is_greedy(llama):
    want = expected("llama")["batch"]
    options = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=16)
    key = jax.random.key(7)
    first = llama.generate(want["input_ids"], key=key, **options)
    assert llama.generate(want["input_ids"], key=key, **options) == first
    assert llama.generate(want["input_ids"], key=jax.random.key(8), **options) != first
    greedy = llama.generate(want["input_ids"], do_sample=True, top_k=1, max_new_tokens=40)
    assert greedy == want["new_tokens"]


def test_bad_generation_options(llama):
    with pytest.raises(InputError, match="max_new_tokens must be at least 1"):
        llama("Hello", max_new_tokens=0)
    with pytest.raises(InputError, match="top_p must be in"):
        llama("Hello", do_sample=True, top_p=0)
    with pytest.raises(InputError, match="prompt string"):
        llama([])


@pytest.mark.slow  # a program per token
def test_an_export_without_position_ids_generates_at_exact_shapes(tmp_path):
    """tests/fixtures/models/gpt2.onnx takes no position_ids: it counts positions from the
    past's length, so it runs unpadded, one prompt at a time; checked against the greedy
    choices of one run of the whole sequence with an empty past."""
    shutil.copy(REPOS.parent / "models" / "gpt2.onnx", tmp_path / "model.onnx")
    shutil.copy(REPOS / "gpt2" / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.warns(UserWarning, match="takes no position_ids"):
        generate = transmuter.pipeline("text-generation", tmp_path)
    prompts = [[5, 17, 99, 3], [42, 7]]
    got = generate.generate(prompts, max_new_tokens=3, eos_token_id=None)
    # The model's logits at every position (the pipeline loads it with the last one only).
    model = transmuter.load(tmp_path / "model.onnx")
    for prompt, tokens in zip(prompts, got):
        # The model is causal: the logits at each position of the whole sequence are those of
        # the sequence up to there, so one run gives the greedy choice after each prefix.
        ids = np.asarray([prompt + tokens])
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        inputs.update({n: np.zeros((1, 4, 0, 8), np.float32) for n in generate.decoder.pasts})
        logits = np.asarray(transmuter.run(model, inputs)["logits"][0])
        assert tokens == np.argmax(logits[len(prompt) - 1 : -1], axis=-1).tolist()


def test_new_sampling_values_compile_nothing(llama):
    # Temperature, top_k, top_p and the penalty are arrays with a value per row, not part of
    # a program's key: five temperatures (and sampling itself) compile what one does.
    prompts = expected("llama")["batch"]["input_ids"]
    llama.generate(prompts, do_sample=True, temperature=0.5, max_new_tokens=4)
    one = llama.programs
    for temperature in (0.6, 0.7, 0.8, 0.9, 1.3):
        llama.generate(prompts, do_sample=True, temperature=temperature, top_k=7, max_new_tokens=4)
    llama.generate(prompts, do_sample=True, top_p=0.8, max_new_tokens=4)
    llama.generate(prompts, max_new_tokens=4)  # greedy: the same programs
    assert llama.programs == one


def test_lengths_from_generation_config_and_task_specific_params(tmp_path):
    # transformers reads generation_config.json, then config.json's
    # task_specific_params["text-generation"] (GPT-2's config has {"max_length": 50}), and
    # counts max_length and min_length over the prompt.
    for path in (REPOS / "llama").iterdir():
        shutil.copy(path, tmp_path / path.name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["task_specific_params"] = {"text-generation": {"max_length": 12, "min_length": 10}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**generation, "max_length": 99}))
    generate = transmuter.pipeline("text-generation", tmp_path)
    prompt = [[1, 15, 27, 9]]
    eos = generate.defaults["eos_token_id"]
    rows = generate.generate(prompt, eos_token_id=None)
    assert len(rows[0]) == 12 - 4  # the task's max_length wins over generation_config.json's
    assert len(generate.generate(prompt, max_new_tokens=3)[0]) <= 3  # max_new_tokens wins
    assert len(generate.generate(prompt, max_length=6, eos_token_id=None)[0]) == 2
    held = generate.generate(prompt, eos_token_id=rows[0][2])[0]
    assert rows[0][2] not in held[: 10 - 4]  # min_length: no end before 10 tokens in all
    with pytest.raises(InputError, match="max_length=4 leaves no new token after 4 tokens"):
        generate.generate(prompt, max_length=4)
    assert eos is not None


def test_call_forms_as_transformers(llama):
    # A prompt gives [{"generated_text"}], a list a list of them, a generator a generator.
    one = llama("Hello", max_new_tokens=3)
    assert isinstance(one, list) and list(one[0]) == ["generated_text"]
    listed = llama(["Hello", "The capital of France is"], max_new_tokens=3)
    assert listed[0] == one and len(listed) == 2
    streamed = llama((p for p in ["Hello", "The capital of France is"]), max_new_tokens=3)
    assert not isinstance(streamed, list) and list(streamed) == listed
    # A chat renders by tokenizer_config.json's chat_template, which this repo lacks.
    with pytest.raises(InputError, match="has no chat_template"):
        llama([{"role": "user", "content": "Hi"}])


def test_stop_sequence_is_transformers_name_for_stop(llama):
    """transformers' stop_sequence (a string or a list) is the stop option; both is refused."""
    stop = llama("Hello", max_new_tokens=6, stop=["a"])
    assert llama("Hello", max_new_tokens=6, stop_sequence=["a"]) == stop
    with pytest.raises(InputError, match="stop_sequence"):
        llama("Hello", stop="a", stop_sequence="a")
