"""transformers' fill-mask, question-answering, zero-shot-classification, token-classification,
text-classification and feature-extraction call forms replayed on Optimum's exports of tiny BERT
and RoBERTa models (tests/fixtures/differential/make_text.py records them; question-answering's
answers are transformers 4.57.6's, as 5.x has no such pipeline)."""

from __future__ import annotations

import pytest
from replay import cases, check, check_transformers_js

REPOS = (
    "text-bert-mlm",
    "text-roberta-mlm",
    "text-bert-qa",
    "text-bert-nli",
    "text-bert-ner",
    "text-bert-sst",
    "text-bert-rerank",
    "text-roberta-features",
)

REFUSED: dict[str, str] = {
    "text-bert-ner/aggregation-average": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-average-all": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-bad": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options (so an unknown strategy per call is a TypeError, not an InputError)"
    ),
    "text-bert-ner/aggregation-call": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-first": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-first-all": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-max": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-max-all": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-none": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-none-all": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-simple": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/aggregation-simple-all": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options"
    ),
    "text-bert-ner/ignore-labels-empty": (
        "ignore_labels is a construction option only, not per call"
    ),
    "text-bert-ner/split-words": ("no is_split_into_words: pre-tokenized word lists are not taken"),
    "text-bert-ner/stride": (
        "TokenClassification has no aggregation_strategy (simple/first/average/max grouping of B-/I- tags and subwords) and no per-call options; nor stride windows over texts past model_max_length"
    ),
    "text-bert-qa/align-false": (
        "QuestionAnswering has no align_to_words option (spans always widened to whole words)"
    ),
    "text-bert-sst/long-truncation": (
        "TextClassification takes no tokenizer keywords (truncation=) per call"
    ),
    "text-roberta-features/generator": (
        "FeatureExtraction answers [tokens, hidden] per text; transformers' pipeline answers [1, tokens, hidden] (its batch of one kept)"
    ),
    "text-roberta-features/list": (
        "FeatureExtraction answers [tokens, hidden] per text; transformers' pipeline answers [1, tokens, hidden] (its batch of one kept)"
    ),
    "text-roberta-features/long-truncation": (
        "FeatureExtraction takes no tokenize_kwargs / truncation / return_tensors per call (no per-call tokenizer settings)"
    ),
    "text-roberta-features/max-length": (
        "FeatureExtraction takes no tokenize_kwargs / truncation / return_tensors per call (no per-call tokenizer settings)"
    ),
    "text-roberta-features/return-tensors": (
        "FeatureExtraction takes no tokenize_kwargs / truncation / return_tensors per call (no per-call tokenizer settings)"
    ),
    "text-roberta-features/single": (
        "FeatureExtraction answers [tokens, hidden] per text; transformers' pipeline answers [1, tokens, hidden] (its batch of one kept)"
    ),
    "text-roberta-features/truncation-outside": (
        "FeatureExtraction takes no tokenize_kwargs / truncation / return_tensors per call (no per-call tokenizer settings)"
    ),
    "text-roberta-features/truncation-padding": (
        "FeatureExtraction takes no tokenize_kwargs / truncation / return_tensors per call (no per-call tokenizer settings)"
    ),
    "text-roberta-features/truncation-twice": (
        "FeatureExtraction takes no tokenize_kwargs / truncation / return_tensors per call (no per-call tokenizer settings) (so the doubled truncation is a TypeError, not an InputError)"
    ),
    "text-roberta-mlm/truncation": (
        "FillMask takes no tokenizer_kwargs (truncation is always on at the model's positions, but the keyword is refused as unknown)"
    ),
}


@pytest.mark.parametrize("repo, call", cases(*REPOS, refused=REFUSED))
def test_call(repo, call):
    check(repo, call)


JS_REFUSED = {"text-roberta-features": REFUSED["text-roberta-features/single"]}


@pytest.mark.parametrize(
    "repo",
    [
        pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=JS_REFUSED[r]))
        if r in JS_REFUSED
        else r
        for r in REPOS
    ],
)
def test_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)
