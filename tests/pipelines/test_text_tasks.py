"""fill-mask, question-answering, zero-shot-classification, summarization and translation against
transformers' pipelines' outputs recorded by tests/fixtures/make_text_tasks.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import REPOS, expected
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)
from test_repo_loading import publish

import transmuter
from transmuter.errors import InputError, ModelLoadError


def check(got, want) -> None:
    """Equal structure, keys in order and values; scores within 1e-4."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), (got, want)
        for key, value in want.items():
            if key in ("score", "scores"):
                np.testing.assert_allclose(got[key], value, atol=1e-4)
            else:
                assert got[key] == value, (key, got, want)
    else:
        assert isinstance(got, list) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            check(g, w)


@pytest.fixture(scope="module")
def fill():
    return transmuter.pipeline("fill-mask", REPOS / "bert-mlm")


@pytest.fixture(scope="module")
def answer():
    return transmuter.pipeline("question-answering", REPOS / "bert-qa")


@pytest.fixture(scope="module")
def zero_shot():
    return transmuter.pipeline("zero-shot-classification", REPOS / "bert-nli")


def test_fill_mask_one_and_several_masks(fill):
    want = expected("bert-mlm")
    check(fill(want["texts"]), want["default"])  # the second text has two masks
    check(fill(want["texts"], top_k=2), want["top_2"])
    check(fill(want["texts"][0]), want["default"][0])
    check(fill(want["texts"][1:2]), want["default"][1])  # a list of one: as transformers


def test_fill_mask_targets_outside_the_vocabulary_stand_for_their_first_token(fill):
    want = expected("bert-mlm")
    check(fill(want["texts"][:2], targets=want["targets"], top_k=3), want["targeted"])
    # Given when making the pipeline: the same ids ("cats and dogs" and "cats" are one).
    fixed = transmuter.pipeline("fill-mask", REPOS / "bert-mlm", targets=want["targets"], top_k=3)
    assert fixed.top_k == 3
    assert fixed.target_ids.tolist() == fill._target_ids(want["targets"]).tolist()
    assert len(fill._target_ids(["cats and dogs", "cats"])) == 1


def test_fill_mask_bad_inputs(fill):
    with pytest.raises(InputError, match=r"needs a mask token \(\[MASK\]\) in each text"):
        fill(["Paris is the capital of [MASK].", "no mask here"])
    with pytest.raises(InputError, match="none of the targets"):
        fill("Hello [MASK]!", targets=[" "])
    with pytest.raises(InputError, match="top_k must be an integer of at least 1"):
        fill("Hello [MASK]!", top_k=0)


def test_question_answering_short_context(answer):
    want = expected("bert-qa")
    question, context = want["question"], want["context"]
    check(answer(question=question, context=context), want["short"])
    check(answer(question, context), want["short"])
    check(answer({"question": question, "context": context}), want["short"])
    check(answer(question=question, context=context, top_k=3, max_answer_len=3), want["top_3"])
    impossible = answer(
        [{"question": question, "context": context}], top_k=2, handle_impossible_answer=True
    )
    check(impossible, want["impossible"])


def test_question_answering_long_context_in_windows(answer):
    want = expected("bert-qa")
    context = want["long_context"]
    assert want["long_tokens"] > 64  # past max_seq_len: windows of 64 tokens, stride 32
    assert len(answer._windows(want["question"], context, answer.defaults)) > 1
    check(answer(question=want["long_questions"], context=context, top_k=2), want["long"])
    strided = answer(
        question=want["question"], context=context, top_k=3, max_seq_len=40, doc_stride=10
    )
    check(strided, want["long_strided"])


def test_question_answering_align_to_words_false_answers_the_tokens_own_characters(answer):
    want = expected("bert-qa")
    question, context = want["question"], want["context"]
    # "United" is u ##n ##i ##t ##e ##d: aligned, a span inside it widens to the whole word
    # (and such spans add up); unaligned, each span is its tokens' characters.
    aligned = answer(question=question, context=context, top_k=4)
    assert [(a["answer"], a["start"], a["end"]) for a in aligned] == [
        ("United", 45, 51),
        ("United Nations", 45, 59),
        ("the United", 41, 51),
        ("in London and works for the United", 17, 51),
    ]
    unaligned = answer(question=question, context=context, top_k=4, align_to_words=False)
    assert [(a["answer"], a["start"], a["end"]) for a in unaligned] == [
        ("Un", 45, 47),
        ("Unit", 45, 49),
        ("United Nations", 45, 59),
        ("United", 45, 51),
    ]
    assert [a["score"] for a in unaligned] == pytest.approx(
        [0.041781, 0.014017, 0.008228, 0.008027], abs=1e-5
    )
    # One answer: the best span (transformers' argmax), no candidates to merge.
    best = answer(question=question, context=context, align_to_words=False)
    assert (best["answer"], best["score"]) == ("Un", pytest.approx(0.041781, abs=1e-5))
    with pytest.raises(InputError, match="align_to_words must be True or False"):
        answer(question=question, context=context, align_to_words="no")


def test_question_answering_bad_inputs(answer):
    with pytest.raises(InputError, match=r'\{"question", "context"\} dict'):
        answer({"question": "Where?"})
    with pytest.raises(InputError, match="context must be a non-empty string"):
        answer(question="Where?", context="")
    with pytest.raises(InputError, match="2 questions and 1 contexts"):
        answer(question=["Where?", "Who?"], context=["Here."])
    with pytest.raises(InputError, match=r"doc_stride \(50\) is larger than max_seq_len \(40\)"):
        answer(question="Where?", context="Here.", max_seq_len=40, doc_stride=50)
    with pytest.raises(InputError, match="past the model's 64 positions"):
        answer(question="Where?", context="Here.", max_seq_len=128)
    with pytest.raises(InputError, match="do not fit"):
        answer(question="where " * 40, context="Here.")
    with pytest.raises(InputError, match=r"has no option \['beams'\]"):
        answer(question="Where?", context="Here.", beams=2)


def test_zero_shot_single_and_multi_label(zero_shot):
    want = expected("bert-nli")
    check(zero_shot(want["texts"], candidate_labels=want["labels"]), want["single"])
    check(zero_shot(want["texts"], want["labels"], multi_label=True), want["multi"])
    check(zero_shot(want["texts"][0], ["travel"]), want["one_label"])
    comma_separated = zero_shot(
        want["texts"][1], "cats, dogs ,robots", hypothesis_template="The topic is {}."
    )
    check(comma_separated, want["comma_separated"])


def test_zero_shot_bad_inputs(zero_shot):
    with pytest.raises(InputError, match="needs candidate_labels"):
        zero_shot("Hello world!")
    with pytest.raises(InputError, match="candidate_labels is empty"):
        zero_shot("Hello world!", " , ")
    with pytest.raises(InputError, match="candidate_labels must be a string or a list"):
        zero_shot("Hello world!", [1, 2])
    with pytest.raises(InputError, match="hypothesis_template must be a string with a"):
        zero_shot("Hello world!", ["a"], hypothesis_template="No slot.")
    # An explicit None is not "unset", and an empty sequence is no premise (transformers
    # refuses both: AttributeError, ValueError), in a list as alone.
    with pytest.raises(InputError, match="hypothesis_template must be a string with a"):
        zero_shot("Hello world!", ["a"], hypothesis_template=None)
    for empty in ("", ["Hello", ""]):
        with pytest.raises(InputError, match="non-empty strings"):
            zero_shot(empty, ["a"])
    with pytest.raises(ModelLoadError, match='labels a class "entailment"'):
        transmuter.pipeline("zero-shot-classification", REPOS / "bert-sst")


@pytest.fixture(scope="module")
def summarize():
    # Recorded greedily (num_beams=1), as the pipelines' own 4 beams are tested elsewhere.
    return transmuter.pipeline("summarization", REPOS / "t5-tasks", decoding="padded", num_beams=1)


def test_summarization_uses_the_task_prefix(summarize):
    want = expected("t5-tasks")
    n = want["max_new_tokens"]
    assert summarize.prefix == "summarize: "
    # Each task's single case is its batch's first text (the batch checks both).
    for task in ("summarization", "translation_en_to_de", "translation_en_to_fr"):
        assert want[task]["single"] == want[task]["batch"][:1]
    assert summarize(want["texts"], max_new_tokens=n) == want["summarization"]["batch"]
    # A text alone answers a list of one, as transformers.
    assert summarize(want["texts"][0], max_new_tokens=n) == want["summarization"]["single"]


def test_translation_task_names():
    want = expected("t5-tasks")
    n = want["max_new_tokens"]
    greedy = {"decoding": "padded", "num_beams": 1}  # as recorded
    german = transmuter.pipeline("translation_en_to_de", REPOS / "t5-tasks", **greedy)
    assert german.prefix == "translate English to German: "
    assert german(want["texts"], max_new_tokens=n) == want["translation_en_to_de"]["batch"]
    # decoding="past" on T5 is test_seq2seq.py's: the tasks add their prefix and settings.
    # "translation" alone: the first translation task of task_specific_params, as transformers.
    first = transmuter.pipeline("translation", REPOS / "t5-tasks")
    assert (first.task, first.prefix) == ("translation_en_to_de", german.prefix)
    assert want["translation"] == want["translation_en_to_de"]
    french = transmuter.pipeline("translation_en_to_fr", REPOS / "t5-tasks", **greedy)
    assert french.prefix == "translate English to French: "
    assert french(want["texts"], max_new_tokens=n) == want["translation_en_to_fr"]["batch"]
    with pytest.raises(InputError, match="has no translation_en_to_es"):
        transmuter.pipeline("translation_en_to_es", REPOS / "t5-tasks")
    with pytest.raises(InputError, match="'translation' or 'translation_xx_to_yy'"):
        transmuter.pipeline("translation_english", REPOS / "t5-tasks")


def test_task_settings_that_are_options_become_defaults_and_others_warn(tmp_path):
    repo = tmp_path / "t5"
    shutil.copytree(REPOS / "t5-tasks", repo)
    config = json.loads((repo / "config.json").read_text())
    config["task_specific_params"]["summarization"].update(
        num_beams=2, length_penalty=2.0, min_new_tokens=3, num_beam_groups=2
    )
    (repo / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"\['num_beam_groups'\] are not applied"):
        summarize = transmuter.pipeline("summarization", repo, max_new_tokens=5)
    assert summarize.defaults["min_new_tokens"] == 3  # the task's
    assert summarize.defaults["max_new_tokens"] == 5  # the caller's
    assert (summarize.defaults["num_beams"], summarize.defaults["length_penalty"]) == (2, 2.0)
    # Without a setting anywhere, transformers' text2text pipelines' 4 beams; the repo's win.
    assert transmuter.pipeline("text2text-generation", repo).defaults["num_beams"] == 4
    generation = json.loads((repo / "generation_config.json").read_text())
    (repo / "generation_config.json").write_text(json.dumps({**generation, "num_beams": 3}))
    assert transmuter.pipeline("text2text-generation", repo).defaults["num_beams"] == 3


def test_question_answering_from_the_hub(hub):  # noqa: F811
    commit = publish(hub, "org/bert-qa", REPOS / "bert-qa")
    want = expected("bert-qa")
    answer = transmuter.pipeline("question-answering", f"hf://org/bert-qa@{commit}")
    check(answer(question=want["question"], context=want["context"]), want["short"])
