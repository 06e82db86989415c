"""The zero-shot-classification task (an NLI model: a sequence-classification export, Optimum's
model.onnx -> logits, whose config.json labels one class "entailment"), as transformers'
pipeline: each candidate label becomes the hypothesis `hypothesis_template.format(label)`, paired
with the sequence as its premise, and the entailment logits rank the labels.

Every (sequence, label) pair of a call runs through encoders.py's `Encoder`: batched, the batch
padded to a power of two and the sequence to a multiple of 16 (the bucketed dims), so label
counts and text lengths reuse a few programs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.encoders import Encoder, _as_list
from transmuter.pipelines.repo import Repo


class ZeroShotClassification:
    """Sequence(s) and `candidate_labels` (a list, or a comma-separated string) ->
    {"sequence", "labels", "scores"} per sequence, the labels sorted by score, highest first.
    Without `multi_label`, a softmax of the labels' entailment logits (scores add up to 1);
    with it, or with one label, each label's entailment against contradiction on its own.
    candidate_labels, hypothesis_template ("This example is {}.") and multi_label are options
    here and per call."""

    def __init__(
        self,
        repo: Repo,
        *,
        candidate_labels: str | Sequence[str] | None = None,
        hypothesis_template: str = "This example is {}.",
        multi_label: bool = False,
        batch_size: int = 8,
    ):
        self.encoder = Encoder(repo, "zero-shot-classification", batch_size)
        self.entailment = _entailment_id(repo)
        # The other class of multi-label scores: transformers takes the first, or the last
        # where the first is entailment.
        self.contradiction = -1 if self.entailment == 0 else 0
        # A copy that truncates only the premise, as transformers does, so that every label's
        # hypothesis is read whole.
        shared = self.encoder.tokenizer
        self.tokenizer = type(shared).from_str(shared.to_str())
        if self.encoder.limit:
            self.tokenizer.enable_truncation(self.encoder.limit, strategy="only_first")
        self.defaults = {
            "candidate_labels": candidate_labels,
            "hypothesis_template": hypothesis_template,
            "multi_label": multi_label,
        }

    def __call__(
        self,
        sequences: str | Sequence[str],
        candidate_labels: str | Sequence[str] | None = None,
        *,
        hypothesis_template: str | None = None,
        multi_label: bool | None = None,
    ) -> Any:
        given = {
            "candidate_labels": candidate_labels,
            "hypothesis_template": hypothesis_template,
            "multi_label": multi_label,
        }
        given = {k: self.defaults[k] if v is None else v for k, v in given.items()}
        labels = _labels(given["candidate_labels"])
        template = given["hypothesis_template"]
        hypotheses = _hypotheses(template, labels)
        texts, single = _as_list(sequences)
        if not all(isinstance(t, str) for t in texts):
            raise InputError(f"the sequences must be strings; got {sequences!r}")
        pairs = [(text, hypothesis) for text in texts for hypothesis in hypotheses]
        try:
            encodings = self.tokenizer.encode_batch(pairs)
        except Exception as exc:  # tokenizers' own Exception: no room left for the premise
            raise InputError(f"the hypotheses leave no room for the sequence: {exc}") from None
        logits = np.stack(self.encoder.run(encodings, "logits")).astype(np.float32)
        logits = logits.reshape(len(texts), len(labels), -1)
        results = [
            self._ranked(text, labels, rows, bool(given["multi_label"]))
            for text, rows in zip(texts, logits)
        ]
        return results[0] if single else results

    def _ranked(self, text: str, labels: list[str], logits: np.ndarray, multi: bool) -> dict:
        if multi or len(labels) == 1:
            pair = logits[:, [self.contradiction, self.entailment]]
            scores = (np.exp(pair) / np.exp(pair).sum(-1, keepdims=True))[:, 1]
        else:
            entailed = logits[:, self.entailment]
            scores = np.exp(entailed) / np.exp(entailed).sum()
        # transformers' order: numpy's argsort reversed (ties as that leaves them).
        order = np.argsort(scores)[::-1]
        return {
            "sequence": text,
            "labels": [labels[i] for i in order],
            "scores": [float(scores[i]) for i in order],
        }


def _entailment_id(repo: Repo) -> int:
    """The class whose label starts with "entail" (any case), from config.json's label2id (or
    id2label)."""
    config = repo.config
    label2id = config.get("label2id") or {
        name: int(i) for i, name in (config.get("id2label") or {}).items()
    }
    for label, index in label2id.items():
        if str(label).lower().startswith("entail"):
            return int(index)
    raise ModelLoadError(
        f"{repo.source}: zero-shot-classification needs an NLI model whose config.json labels "
        f'a class "entailment"; its labels are {sorted(label2id)}'
    )


def _labels(candidates: Any) -> list[str]:
    """The candidate labels: a list of strings, or a string of them separated by commas."""
    if isinstance(candidates, str):
        candidates = [label.strip() for label in candidates.split(",") if label.strip()]
    if (
        not isinstance(candidates, Sequence)
        or not candidates
        or not all(isinstance(c, str) for c in candidates)
    ):
        raise InputError(
            "candidate_labels must be a non-empty list of strings or a comma-separated string; "
            f"got {candidates!r}"
        )
    return list(candidates)


def _hypotheses(template: Any, labels: list[str]) -> list[str]:
    if not isinstance(template, str) or template.format(labels[0]) == template:
        raise InputError(
            f"hypothesis_template must be a string with a {{}} where the label goes; got "
            f"{template!r}"
        )
    return [template.format(label) for label in labels]
