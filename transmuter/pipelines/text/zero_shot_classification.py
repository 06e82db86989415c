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
from transmuter.pipelines.base import Task
from transmuter.pipelines.base import candidate_labels as candidate_labels_option
from transmuter.pipelines.base import hypothesis_template as hypothesis_template_option
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.text.encoders import Encoder

_NOT_GIVEN = object()


class ZeroShotClassification(Task):
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
        self.batch_size = self.encoder.batch_size
        self.entailment = _entailment_id(repo)
        # The other class of multi-label scores: transformers takes the first, or the last
        # where the first is entailment.
        self.contradiction = -1 if self.entailment == 0 else 0
        # A tokenizer that truncates only the premise, as transformers does, so that every
        # label's hypothesis is read whole.
        self.tokenizer = repo.require_tokenizer("zero-shot-classification")
        if self.encoder.limit:
            self.tokenizer.enable_truncation(self.encoder.limit, strategy="only_first")
        if candidate_labels is not None:
            candidate_labels_option(candidate_labels)
        hypothesis_template_option(hypothesis_template)
        self.defaults = {
            "candidate_labels": candidate_labels,
            "hypothesis_template": hypothesis_template,
            "multi_label": multi_label,
        }

    def is_item(self, value: Any) -> bool:
        return isinstance(value, str)

    def describe_items(self) -> str:
        return "give a sequence (a string), a list of them or a generator of them"

    def __call__(self, sequences: Any, *args: Any, **options: Any) -> Any:
        # transformers takes the candidate labels as the second positional argument too.
        if len(args) > 1:
            raise InputError(f"give sequences and candidate_labels; got {len(args) + 1} arguments")
        if args:
            if "candidate_labels" in options:
                raise InputError("candidate_labels given twice: positionally and by name")
            options["candidate_labels"] = args[0]
        return super().__call__(sequences, **options)

    def run_items(
        self,
        items: list,
        *,
        candidate_labels: str | Sequence[str] | None = None,
        hypothesis_template: Any = _NOT_GIVEN,
        multi_label: bool | None = None,
    ) -> list:
        given = {"candidate_labels": candidate_labels, "multi_label": multi_label}
        given = {k: self.defaults[k] if v is None else v for k, v in given.items()}
        # An explicit hypothesis_template=None is refused, as transformers refuses it.
        given["hypothesis_template"] = (
            self.defaults["hypothesis_template"]
            if hypothesis_template is _NOT_GIVEN
            else hypothesis_template
        )
        if given["candidate_labels"] is None:
            raise InputError("zero-shot-classification needs candidate_labels")
        labels = candidate_labels_option(given["candidate_labels"])
        template = hypothesis_template_option(given["hypothesis_template"])
        hypotheses = [template.format(label) for label in labels]
        if not all(isinstance(t, str) and t for t in items):
            raise InputError(f"the sequences must be non-empty strings; got {items!r}")
        pairs = [(text, hypothesis) for text in items for hypothesis in hypotheses]
        try:
            encodings = self.tokenizer.encode_batch(pairs)
        except Exception as exc:  # tokenizers' own Exception: no room left for the premise
            raise InputError(f"the hypotheses leave no room for the sequence: {exc}") from None
        logits = np.stack(self.encoder.run(encodings, "logits")).astype(np.float32)
        logits = logits.reshape(len(items), len(labels), -1)
        return [
            self._ranked(text, labels, rows, bool(given["multi_label"]))
            for text, rows in zip(items, logits)
        ]

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
