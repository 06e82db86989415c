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

REFUSED: dict[str, str] = {}


@pytest.mark.parametrize("repo, call", cases(*REPOS, refused=REFUSED))
def test_call(repo, call):
    check(repo, call)


@pytest.mark.parametrize("repo", REPOS)
def test_transformers_js_layout(repo, tmp_path):
    check_transformers_js(repo, tmp_path)
