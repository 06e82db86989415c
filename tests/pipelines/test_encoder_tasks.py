"""feature-extraction, text-classification and token-classification against transformers'
outputs recorded by tests/fixtures/make_pipelines.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import REPOS, expected

import transmuter
from transmuter.errors import InputError


@pytest.fixture(scope="module")
def bert_in_twos():
    """The bert encoder in batches of 2, compiled once for the pooled tests."""
    return transmuter.pipeline("feature-extraction", REPOS / "bert", batch_size=2).encoder


@pytest.mark.parametrize(
    "pooling, normalize, key",
    [("mean", True, "mean"), ("mean", False, "mean_unnormalized"), ("cls", False, "cls")],
)
def test_pooled_embeddings_match_transformers(bert_in_twos, pooling, normalize, key):
    want = expected("bert")
    embed = transmuter.pipeline(
        "feature-extraction", REPOS / "bert", pooling=pooling, normalize=normalize, batch_size=2
    )
    # The same encoder as the one just built, with its programs: pooling and normalizing are
    # the pipeline's own, on the host.
    assert embed.encoder.batch_size == bert_in_twos.batch_size == 2
    embed.encoder = bert_in_twos
    got = embed(want["texts"])  # a batch of 2 (padded) and a batch of 1
    np.testing.assert_allclose(got, want[key], atol=1e-5)
    np.testing.assert_allclose(embed(want["texts"][1]), want[key][1], atol=1e-5)


def test_a_tokenizer_file_that_pads_gives_the_same_embeddings(tmp_path):
    """sentence-transformers' tokenizer.json files fix a padding length: the pipeline pads
    batches itself, so the file's padding must not count as text."""
    want = expected("bert")
    repo = tmp_path / "bert"
    shutil.copytree(REPOS / "bert", repo)
    tokenizer = json.loads((repo / "tokenizer.json").read_text())
    tokenizer["padding"] = {
        "strategy": {"Fixed": 24}, "direction": "Right", "pad_to_multiple_of": None,
        "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]",
    }  # fmt: skip
    (repo / "tokenizer.json").write_text(json.dumps(tokenizer))
    embed = transmuter.pipeline("feature-extraction", repo, pooling="mean", normalize=True)
    np.testing.assert_allclose(embed(want["texts"]), want["mean"], atol=1e-5)


def test_token_embeddings_come_per_text_without_padding():
    want = expected("bert")
    embed = transmuter.pipeline("feature-extraction", REPOS / "bert")
    rows = embed(want["texts"])
    lengths = [len(embed.encoder.tokenizer.encode(t).ids) for t in want["texts"]]
    # [1, tokens, hidden] per text, as transformers' pipeline keeps its batch of one.
    assert [r.shape for r in rows] == [(1, n, 32) for n in lengths]
    np.testing.assert_allclose(rows[0][0].mean(0), want["mean_unnormalized"][0], atol=1e-5)
    assert embed(want["texts"][0]).shape == rows[0].shape


@pytest.fixture(scope="module")
def ranked():
    """text-classification with every label's score (top_k=None)."""
    return transmuter.pipeline("text-classification", REPOS / "bert-sst", top_k=None)


def test_text_classification_labels_and_scores(ranked):
    want = expected("bert-sst")
    classify = transmuter.pipeline("text-classification", REPOS / "bert-sst")
    got = classify(want["texts"])
    assert [g["label"] for g in got] == want["labels"]
    np.testing.assert_allclose([g["score"] for g in got], np.max(want["scores"], 1), atol=1e-5)
    # transformers answers one string called without top_k with a list of its result.
    [every] = ranked(want["texts"][0])
    assert [r["label"] for r in every][0] == want["labels"][0]
    np.testing.assert_allclose(
        sorted(r["score"] for r in every), sorted(want["scores"][0]), atol=1e-5
    )


def test_result_shapes_follow_transformers(ranked):
    """transformers' text-classification: a string gives a list of its best dict, a pair
    the dict itself, a list a dict per item; an explicit top_k gives lists, unwrapped."""
    classify = transmuter.pipeline("text-classification", REPOS / "bert-sst")
    pair = {"text": "a question", "text_pair": "an answer"}
    [best] = classify("a text")
    assert set(best) == {"label", "score"}
    assert set(classify(pair)) == {"label", "score"}
    assert [set(r) for r in classify(["a", pair])] == [{"label", "score"}] * 2
    top = classify("a text", top_k=2)
    assert len(top) == 2 and top[0]["score"] >= top[1]["score"]
    assert [len(r) for r in classify(["a", "b"], top_k=1)] == [1, 1]
    assert list(classify(iter(["a", "b", "c"]))) == classify(["a", "b", "c"])
    with pytest.raises(InputError, match="top_k must be an integer of at least 1"):
        classify("a text", top_k=0)


def test_text_pairs_and_functions_to_apply(ranked):
    pair = {"text": "a question", "text_pair": "an answer"}
    logits = ranked(pair, function_to_apply="none")
    scores = np.array([r["score"] for r in logits])
    softmax = ranked(pair)
    np.testing.assert_allclose(
        [r["score"] for r in softmax], np.exp(scores) / np.exp(scores).sum(), rtol=1e-5
    )
    sigmoid = ranked([pair], function_to_apply="sigmoid")[0]
    np.testing.assert_allclose([r["score"] for r in sigmoid], 1 / (1 + np.exp(-scores)), rtol=1e-5)
    with pytest.raises(InputError, match="function_to_apply must be one of softmax, sigmoid"):
        ranked(pair, function_to_apply="relu")
    with pytest.raises(InputError, match="text_pair"):
        ranked({"text": "only one"})


def test_token_classification_entities():
    want = expected("bert-ner")
    tag = transmuter.pipeline("token-classification", REPOS / "bert-ner")
    got = tag(want["texts"])
    for row, wanted in zip(got, want["entities"]):
        assert [{k: v for k, v in e.items() if k != "score"} for e in row] == [
            {k: v for k, v in e.items() if k != "score"} for e in wanted
        ]
        np.testing.assert_allclose(
            [e["score"] for e in row], [e["score"] for e in wanted], atol=1e-5
        )
    alone = tag(want["texts"][1])  # unpadded: scores equal to float rounding
    assert [e["word"] for e in alone] == [e["word"] for e in got[1]]


def test_bad_inputs_are_clear_errors():
    embed = transmuter.pipeline("feature-extraction", REPOS / "bert", pooling="mean")
    with pytest.raises(InputError, match="got an empty list"):
        embed([])
    with pytest.raises(InputError, match="give a text, a list of texts or a generator"):
        embed(3)
    with pytest.raises(InputError, match="must be strings"):
        embed(["fine", 3])
    with pytest.raises(InputError, match="must be strings; got"):
        embed({"text": "a", "text_pair": "b"})  # pairs are text-classification's
    with pytest.raises(InputError, match="pooling must be"):
        transmuter.pipeline("feature-extraction", REPOS / "bert", pooling="max")


@pytest.mark.parametrize(
    "task, repo, text",
    [
        ("text-classification", "bert-sst", "i like books"),
        ("token-classification", "bert-ner", "john lives in paris"),
        ("fill-mask", "bert-mlm", "i like [MASK]"),
    ],
)
def test_batch_size_per_call_is_checked_and_changes_no_answer(task, repo, text):
    # transformers' Pipeline takes batch_size per call; it was a TypeError from run_items.
    pipe = transmuter.pipeline(task, REPOS / repo)
    texts = [text, text + " today", text]
    assert str(pipe(texts, batch_size=2)) == str(pipe(texts))
    with pytest.raises(InputError, match="batch_size must be an integer"):
        pipe(texts, batch_size=0)


def test_tokenizer_keywords_per_call_cut_where_transformers_cuts():
    # transformers' feature-extraction takes tokenize_kwargs and truncation per call; BERT's
    # fixture reads 64 positions.
    embed = transmuter.pipeline("feature-extraction", REPOS / "bert")
    text = "the quick brown fox jumps over the lazy dog"
    whole = embed(text)
    cut = embed(text, truncation=True, tokenize_kwargs={"max_length": 4})
    assert cut.shape == (1, 4, 32)  # [CLS], two tokens, [SEP]: the special tokens are kept
    assert (
        embed.encoder.tokenizer.encode(text).ids[:3]
        == embed.encoder.encode([text], {"truncation": True, "max_length": 4})[0].ids[:3]
    )
    # transformers' tokenizers default truncation on for a max_length given alone (the
    # recorded feature-extraction "max-length" call), and off beside padding.
    np.testing.assert_array_equal(embed(text, tokenize_kwargs={"max_length": 4}), cut)
    padded = {"max_length": 4, "padding": True}
    np.testing.assert_array_equal(embed(text, tokenize_kwargs=padded), whole)
    long = " ".join(["word"] * 100)
    assert embed(long, truncation=True).shape == (1, 64, 32)  # the model's positions
    with pytest.raises(InputError, match="truncation=False, and 'word word.* than the model's 64"):
        embed(long, truncation=False)
    with pytest.raises(InputError, match="truncation given twice"):
        embed(text, truncation=True, tokenize_kwargs={"truncation": True})
    with pytest.raises(InputError, match=r"tokenize_kwargs takes .*; got \['stride'\]"):
        embed(text, tokenize_kwargs={"stride": 2})
    with pytest.raises(InputError, match="'max_length' padding is not supported"):
        embed(text, tokenize_kwargs={"padding": "max_length"})
    with pytest.raises(InputError, match="truncation must be True or False"):
        embed(text, truncation="yes")


def test_every_tasks_unknown_option_is_an_input_error_naming_what_it_takes():
    # base.Task checks a call's keywords against run_items' before any item runs (they were
    # Python's TypeError from run_items, after a generator's first items had run).
    classify = transmuter.pipeline("text-classification", REPOS / "bert-sst")
    with pytest.raises(InputError, match=r"has no option \['colour'\]; it takes \['batch_size'"):
        classify("i like books", colour="red")
    with pytest.raises(InputError, match=r"has no option \['colour'\]"):
        classify(iter(["i like books"]), colour="red")
    fill = transmuter.pipeline("fill-mask", REPOS / "bert-mlm")
    with pytest.raises(InputError, match="tokenizer_kwargs must be a dict"):
        fill("i like [MASK]", tokenizer_kwargs=True)
