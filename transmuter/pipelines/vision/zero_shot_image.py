"""The zero-shot-image-classification task for CLIP and SigLIP: images and candidate labels in,
[{"score", "label"}] per image out, best first, as transformers' pipeline returns them.

Each label becomes `hypothesis_template.format(label)` ("This is a photo of {}." by default),
tokenized with tokenizer.json: CLIP's texts padded to the longest (a mask hides the padding),
SigLIP's to 64 tokens (truncated there), as the pipeline pads them (SigLIP pools the last
position, so its length is fixed). The scores are a softmax over the labels of
logits_per_image for CLIP, a sigmoid of each for SigLIP (the pipeline's choice by model_type).

The model is Optimum's single model.onnx (input_ids, pixel_values and, for CLIP,
attention_mask -> logits_per_image ...), also transformers.js's onnx/model.onnx. Their split
towers (text_model.onnx, vision_model.onnx) are not used: they leave out the trained
logit_scale (and SigLIP's logit_bias) that turn the embeddings' similarities into scores.

Bucketed dims: the label count (powers of two), CLIP's text length (multiples of 16, the mask
hiding the padding) and the image batch (powers of two up to `batch_size`); every image is
resized to the processor's one size."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import (
    candidate_labels as candidate_labels_option,
)
from transmuter.pipelines.base import (
    hypothesis_template as hypothesis_template_option,
)
from transmuter.pipelines.base import (
    is_labels,
    per_item,
    positive_int,
    ranked,
    sigmoid,
    softmax,
)
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.image_tasks import ImageTask, call_arguments, dim_names
from transmuter.pipelines.vision.processors import preprocess

TASK = "zero-shot-image-classification"
TEMPLATE = "This is a photo of {}."
SIGLIP_LENGTH = 64  # transformers' pipeline pads SigLIP's texts to this length
# Compiled programs kept: the most recently used (label count, text length, image batch)
# buckets; label counts have no bound, so neither has the set traffic can reach.
PROGRAMS = 32
_INPUTS = ("input_ids", "attention_mask", "pixel_values")


class ZeroShotImageClassification(ImageTask):
    """Score `candidate_labels` (a list, or one comma-separated string; once for the call or a
    list of them, one per image) for images (paths, Pillow images or numpy arrays; one, a list
    or a generator): per image a list of {"score", "label"}, best first, one result per image.
    `candidate_labels` may come second positionally (or `images=` first, as transformers
    takes it); it and `hypothesis_template` ("This is a photo of {}.") are options here and
    per call."""

    def __init__(
        self,
        repo: Repo,
        *,
        candidate_labels: Any = None,
        hypothesis_template: str = TEMPLATE,
        batch_size: int = 8,
    ):
        self.batch_size = positive_int(batch_size, "batch_size")
        if "model" not in repo.onnx:
            raise ModelLoadError(
                f"{repo.source}: {TASK} runs model.onnx, the whole model; the towers "
                "(text_model.onnx, vision_model.onnx) leave out the logit scale and bias that "
                f"score labels; found {repo.found}"
            )
        self.model = repo.model("model")
        inputs = self.model.inputs
        if not {"input_ids", "pixel_values"} <= set(inputs) or set(inputs) - set(_INPUTS):
            raise ModelLoadError(
                f"{repo.source}: {TASK} feeds {', '.join(_INPUTS)}; the model takes {inputs}"
            )
        if "logits_per_image" not in self.model.outputs:
            raise ModelLoadError(f"{repo.source}: the model has no output 'logits_per_image'")
        self.repo = repo
        self.template = hypothesis_template_option(hypothesis_template)
        if candidate_labels is not None and is_labels(candidate_labels):
            candidate_labels_option(candidate_labels)
        self.labels = candidate_labels
        self.images = repo.preprocessor_config
        self.tokenizer = repo.require_tokenizer(TASK)
        self.siglip = "siglip" in str(repo.config.get("model_type", ""))
        if self.siglip:
            self.tokenizer.enable_truncation(SIGLIP_LENGTH)
        self.pad_id = _pad_id(repo, self.tokenizer)
        text = repo.config.get("text_config") or {}
        self.limit = text.get("max_position_embeddings")
        self._compiled = None

    def __call__(self, inputs: Any = None, *args: Any, **options: Any) -> Any:
        inputs, options = call_arguments(
            self, inputs, args, options, "candidate_labels", {"images": "inputs"}
        )
        return super().__call__(inputs, **options)

    def run_items(
        self,
        items: list,
        *,
        candidate_labels: Any = None,
        hypothesis_template: str | None = None,
    ) -> list:
        given = self.labels if candidate_labels is None else candidate_labels
        if given is None:
            raise InputError(f"{TASK} needs candidate_labels")
        template = self.template
        if hypothesis_template is not None:
            template = hypothesis_template_option(hypothesis_template)
        per_image = per_item(given, items, "candidate_labels", is_labels)
        label_sets = [tuple(candidate_labels_option(labels)) for labels in per_image]
        # Images with the same labels run together: one text batch, the images as rows.
        groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for index, labels in enumerate(label_sets):
            groups[labels].append(index)
        results: list[Any] = [None] * len(items)
        for labels, indices in groups.items():
            text = self._texts([template.format(label) for label in labels])
            pixels = [preprocess(items[i], self.images) for i in indices]
            for start in range(0, len(indices), self.batch_size):
                chunk = np.stack(pixels[start : start + self.batch_size])
                found = self._call({**text, "pixel_values": chunk})["logits_per_image"]
                # The compiled program's buckets pad the images and the labels; logits_per_image
                # names its dims apart from the inputs', so the padding is cut here.
                logits = np.asarray(found, np.float64)[: len(chunk), : len(labels)]
                for index, row in zip(indices[start : start + len(chunk)], logits):
                    scores = sigmoid(row) if self.siglip else softmax(row)
                    results[index] = [
                        {"score": r["score"], "label": r["label"]}
                        for r in ranked(scores, list(labels), None)
                    ]
        return results

    def _texts(self, texts: list[str]) -> dict[str, np.ndarray]:
        """input_ids (and attention_mask where the model takes one) of the label texts."""
        encodings = self.tokenizer.encode_batch(texts)
        longest = max(len(e.ids) for e in encodings)
        if self.limit and longest > self.limit:
            raise InputError(
                f"a label's text is {longest} tokens; the model takes at most {self.limit}"
            )
        width = SIGLIP_LENGTH if self.siglip else longest
        ids = np.full((len(texts), width), self.pad_id, np.int64)
        mask = np.zeros((len(texts), width), np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)], mask[row, : len(encoding.ids)] = encoding.ids, 1
        given = {"input_ids": ids, "attention_mask": mask}
        return {name: given[name] for name in self.model.inputs if name in given}

    def _call(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        if self._compiled is None:
            buckets = self._buckets()
            self._compiled = transmuter.compile(
                self.model,
                inputs,
                buckets=buckets or None,
                pad_values={"input_ids": self.pad_id} if buckets else None,
                cache_size=PROGRAMS,
            )
        return self._compiled(inputs)

    def _buckets(self) -> dict[str, Any]:
        """The label count and image batch by powers of two, CLIP's text length by 16 (a mask
        hides it), by the names the file gives them; fixed dims are left alone."""
        labels, length = (dim_names(self.model, "input_ids") + [None, None])[:2]
        batch = (dim_names(self.model, "pixel_values") or [None])[0]
        rules = {labels: "pow2", batch: ("pow2", self.batch_size)}
        if "attention_mask" in self.model.inputs and not self.siglip:
            rules[length] = ("multiple", 16)
        return {name: rule for name, rule in rules.items() if name is not None}


def _pad_id(repo: Repo, tokenizer: Any) -> int:
    """The tokenizer's pad token (tokenizer_config.json), which the pipeline pads with."""
    pad = repo.tokenizer_config.get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    found = tokenizer.token_to_id(pad) if isinstance(pad, str) else None
    if found is None:
        raise ModelLoadError(
            f"{repo.source}: tokenizer_config.json names no pad token in the vocabulary "
            f"(pad_token {pad!r}); {TASK} pads label texts with it"
        )
    return found
