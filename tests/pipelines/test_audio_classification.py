"""audio-classification against transformers' pipeline (make_audio_classification.py's tiny AST
and wav2vec2), and AST's Kaldi filter banks against its feature extractor."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import REPOS, expected
from frontend.test_hub import hub  # noqa: F401  (the loopback Hub fixture)
from test_repo_loading import publish

import transmuter
from transmuter.errors import InputError, ModelLoadError

sys.path.insert(0, str(REPOS.parent))
from waveforms import clips  # noqa: E402  (the clips the fixture was recorded on)


@pytest.fixture(scope="module")
def ast():
    return transmuter.pipeline("audio-classification", REPOS / "ast")


def check(got: list, wanted: list) -> None:
    assert [list(r) for r in got] == [["score", "label"]] * len(got)
    assert [r["label"] for r in got] == [w["label"] for w in wanted]
    np.testing.assert_allclose([r["score"] for r in got], [w["score"] for w in wanted], atol=1e-4)


def test_ast_features_are_the_feature_extractors(ast):
    features = ast._spectrogram(clips()[0])
    np.testing.assert_allclose(features, expected("ast")["features"], atol=2e-5)


def test_ast_labels_and_scores_are_transformers(ast):
    got = ast(clips())  # shorter and longer than AST's 64 frames: one program, one batch
    for row, wanted in zip(got, expected("ast")["results"]):
        check(row, wanted)
    one = ast({"array": clips()[2], "sampling_rate": 16000}, top_k=2)
    check(one, expected("ast")["results"][2][:2])
    raw = ast(clips()[1], function_to_apply="none")
    assert len(raw) == 4 and any(r["score"] > 1 or r["score"] < 0 for r in raw)


def test_a_generator_of_clips_gives_a_generator_of_results(ast):
    # transformers' call forms: a generator of clips streams one result per clip.
    out = ast(clip for clip in clips())
    assert not isinstance(out, list)
    for row, wanted in zip(list(out), expected("ast")["results"], strict=True):
        check(row, wanted)
    with pytest.raises(InputError, match="decode files first"):
        ast("speech.wav")
    with pytest.raises(InputError, match="batch_size must be an integer of at least 1"):
        transmuter.pipeline("audio-classification", REPOS / "ast", batch_size=0)


def test_wav2vec2_runs_each_clip_at_its_length():
    classify = transmuter.pipeline("audio-classification", REPOS / "wav2vec2", top_k=3)
    for row, wanted in zip(classify(clips()), expected("wav2vec2")["results"]):
        check(row, wanted)


def test_bad_waveforms_and_options(ast):
    with pytest.raises(InputError, match="1-D float"):
        ast(np.zeros((2, 800), np.float32))
    with pytest.raises(InputError, match="1-D float"):
        ast(np.zeros(800, np.int16))
    with pytest.raises(InputError, match="resample"):
        ast({"array": clips()[0], "sampling_rate": 8000})
    with pytest.raises(InputError, match="sampling_rate"):
        ast({"array": clips()[0]})
    with pytest.raises(InputError, match="function_to_apply"):
        ast(clips()[0], function_to_apply="relu")
    with pytest.raises(InputError, match="top_k"):
        ast(clips()[0], top_k=0)


def test_an_unknown_feature_extractor_is_named(tmp_path):
    for name in ("config.json", "model.onnx"):
        (tmp_path / name).write_bytes((REPOS / "ast" / name).read_bytes())
    (tmp_path / "preprocessor_config.json").write_text(
        '{"feature_extractor_type": "WhisperFeatureExtractor"}'
    )
    with pytest.raises(ModelLoadError, match="WhisperFeatureExtractor.*ASTFeatureExtractor"):
        transmuter.pipeline("audio-classification", tmp_path)


def test_from_the_hub(hub):  # noqa: F811
    commit = publish(hub, "org/ast", REPOS / "ast")
    classify = transmuter.pipeline("audio-classification", f"hf://org/ast@{commit}", top_k=1)
    check(classify(clips()[3]), expected("ast")["results"][3][:1])


def test_batch_size_per_call_as_transformers_takes_it(ast):
    # transformers' pipelines take batch_size on each call too; the answers do not change.
    batched = ast(clips(), batch_size=3)
    for row, wanted in zip(batched, expected("ast")["results"], strict=True):
        check(row, wanted)
    with pytest.raises(InputError, match="batch_size"):
        ast(clips(), batch_size=0)
