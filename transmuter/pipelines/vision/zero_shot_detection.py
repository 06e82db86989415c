"""The zero-shot-object-detection task: an image and candidate labels in, [{"score", "label",
"box"}] out (best first), as transformers' pipeline returns them, for OWL-ViT and OWLv2 exports
in Optimum's single-graph layout (model.onnx: input_ids, pixel_values, attention_mask ->
logits, pred_boxes, text_embeds, image_embeds), and Grounding DINO (grounding_dino.py: a
forward per label, labels batched as rows).

transformers' pipeline runs the model once per label; each label's logits depend on that label
alone (the class head scores each query against the image's patches on its own), so one call
with every label gives the same scores, and the image tower runs once per image. The single
graph runs both towers on every call: the image half is not reused across calls with other
labels (that needs the towers exported apart).

Processors (preprocessor_config.json; processors.py's `owl_pixels`): OWL-ViT resizes to
{"height", "width"} (bicubic), rescales and normalizes; OWLv2 rescales, pads to a square at the
bottom and right with zeros, resizes with its Gaussian anti-aliasing and linear zoom (in numpy,
as transformers does with scipy.ndimage) and normalizes. Post-processing: a sigmoid of each label's logit per box,
kept above `threshold`; boxes from relative (center, size) to corners, scaled by the image's
width and height (OWL-ViT) or by its longer side (OWLv2: boxes are relative to the padded
square).

Buckets: labels are tokenized alone (as the pipeline tokenizes each) and padded to a multiple
of 16 tokens with attention_mask 0 (the text tower is causal and pools at the end token, so
padding after it changes nothing); the label count is padded to a power of two by repeating
the last label, whose extra rows are dropped. The padding is done here, not by `compile`'s
buckets: the label count is input_ids' rows but the logits' last axis, under another name,
which those cannot slice back. Every image is resized to one size, so a program per
label-count bucket (1, 2, 4, 8, ... labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import candidate_labels as candidate_labels_option
from transmuter.pipelines.base import is_labels, per_item, positive_int
from transmuter.pipelines.base import threshold as threshold_option
from transmuter.pipelines.base import top_k as top_k_option
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.detection import box_dict, corners_scaled
from transmuter.pipelines.vision.grounding_dino import GroundingDino
from transmuter.pipelines.vision.image_tasks import ImageTask, call_arguments
from transmuter.pipelines.vision.processors import (
    OWL_DEFAULTS,
    is_image,
    load_image,
    owl_box_frame,
    owl_pixels,
)

FAMILIES = (*OWL_DEFAULTS, "grounding-dino")
INPUTS = ("input_ids", "pixel_values", "attention_mask")


class ZeroShotObjectDetection(ImageTask):
    """Find `candidate_labels` (a list, or one comma-separated string) in images, as
    transformers' pipeline takes them: an image with `candidate_labels=` (or second
    positionally; `text_queries=` as an older name), a list of images with one set of labels
    for all or a list of label lists, one per image (zipped, as transformers zips them), a
    {"image", "candidate_labels"} dict or a list or generator of them. Per image the detections
    scoring above `threshold` (default 0.1) for any label, best first, the `top_k` best where
    given. `batch_size`: Grounding DINO's labels per forward (OWL-ViT and OWLv2 take every label
    in one); `pad_to_multiple_of`: Grounding DINO's image buckets (grounding_dino.py; OWL
    resizes every image to one size)."""

    def __init__(
        self,
        repo: Repo,
        *,
        threshold: float = 0.1,
        top_k: int | None = None,
        batch_size: int = 4,
        pad_to_multiple_of: int | None = None,
        cache_size: int = 8,
    ):
        self.repo, self.threshold = repo, threshold_option(threshold)
        self.top_k = top_k_option(top_k, none=True)
        self.cache_size = positive_int(cache_size, "cache_size")
        self.family = repo.config.get("model_type")
        if self.family not in FAMILIES:
            raise ModelLoadError(
                f"{repo.source}: config.json's model_type is {self.family!r}; zero-shot object "
                f"detection supports {', '.join(FAMILIES)}"
            )
        self.grounding = None
        if self.family == "grounding-dino":
            self.grounding = GroundingDino(
                repo,
                batch_size=batch_size,
                pad_to_multiple_of=pad_to_multiple_of,
                cache_size=cache_size,
            )
            return
        if pad_to_multiple_of is not None:
            raise InputError(
                f"pad_to_multiple_of is Grounding DINO's: {self.family} resizes every image to "
                "one size"
            )
        self.tokenizer = repo.require_tokenizer("zero-shot-object-detection")
        self.model = repo.model("model")
        if sorted(self.model.inputs) != sorted(INPUTS) or not {"logits", "pred_boxes"} <= set(
            self.model.outputs
        ):
            raise ModelLoadError(
                f"{repo.source}: zero-shot object detection feeds {', '.join(INPUTS)} and reads "
                f"logits and pred_boxes; the model takes {self.model.inputs} and gives "
                f"{self.model.outputs}"
            )
        if not repo.preprocessor_config:
            raise ModelLoadError(
                f"{repo.source}: zero-shot object detection needs preprocessor_config.json (the "
                f"image processor's size and normalization); found {repo.found}"
            )
        self.config = {**OWL_DEFAULTS[self.family], **repo.preprocessor_config}
        text = repo.config.get("text_config") or {}
        self.positions = int(text.get("max_position_embeddings", 16))
        self._compiled = None

    def is_item(self, value: Any) -> bool:
        return is_image(value) or isinstance(value, Mapping)

    def describe_items(self) -> str:
        return (
            'give an image (a path, a Pillow image or a numpy array), an {"image", '
            '"candidate_labels"} dict, a non-empty list of either or a generator of them'
        )

    def __call__(self, inputs: Any = None, *args: Any, **options: Any) -> Any:
        inputs, options = call_arguments(
            self, inputs, args, options, "candidate_labels", {"text_queries": "candidate_labels"}
        )
        return super().__call__(inputs, **options)

    def run_items(
        self,
        items: list,
        *,
        candidate_labels: Any = None,
        threshold: float | None = None,
        top_k: int | None = None,
    ) -> list:
        threshold = self.threshold if threshold is None else threshold_option(threshold)
        top_k = self.top_k if top_k is None else top_k_option(top_k)
        results = []
        for image, labels in _requests(items, candidate_labels):
            if self.grounding is not None:
                results.append(self.grounding.detect(image, labels, threshold, top_k))
                continue
            image = load_image(image)
            logits, boxes = self._run(self.pixels(image), labels)
            results.append(self._detections(logits, boxes, labels, image.size, threshold, top_k))
        return results

    def pixels(self, image: Any) -> np.ndarray:
        """The family's processor: float32 [3, height, width] for one image."""
        if self.grounding is not None:
            return self.grounding.pixels(image)
        return owl_pixels(image, self.family, self.config)

    def _run(self, pixels: np.ndarray, labels: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tokenizer.encode_batch(labels)
        longest = max(len(e.ids) for e in encodings)
        if longest > self.positions:
            raise InputError(
                f"a label is {longest} tokens; the text model takes {self.positions} at most"
            )
        rows = 1 << (len(labels) - 1).bit_length()
        width = min(-(-longest // 16) * 16, self.positions)
        ids = np.zeros((rows, width), np.int64)  # 0 below the end token: see the docstring
        mask = np.zeros((rows, width), np.int64)
        for row in range(rows):
            encoding = encodings[min(row, len(encodings) - 1)]
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        inputs = {"input_ids": ids, "pixel_values": pixels[None], "attention_mask": mask}
        if self._compiled is None:
            self._compiled = transmuter.compile(self.model, inputs, cache_size=self.cache_size)
        outputs = self._compiled(inputs)
        logits = np.asarray(outputs["logits"], np.float32)[0, :, : len(labels)]
        return logits, np.asarray(outputs["pred_boxes"], np.float32)[0]

    def _detections(self, logits, boxes, labels, size, threshold, top_k) -> list[dict]:
        scores = (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
        corners = corners_scaled(boxes, owl_box_frame(self.family, size))
        found = [
            {"score": float(scores[i, j]), "label": label, "box": box_dict(corners[i])}
            for j, label in enumerate(labels)
            for i in np.flatnonzero(scores[:, j] > threshold)
        ]
        found.sort(key=lambda d: d["score"], reverse=True)  # stable, as the pipeline's sort
        return found[:top_k] if top_k else found


def _requests(items: list, labels: Any) -> list[tuple[Any, list[str]]]:
    """(image, labels) per item: a dict's own "image" and "candidate_labels" (the call's where
    it has none), else the item with the call's labels (one set for all items, or one per
    item)."""
    shared = None if labels is None else per_item(labels, items, "candidate_labels", is_labels)
    requests = []
    for index, item in enumerate(items):
        if isinstance(item, Mapping):
            image = item.get("image")
            given = item.get("candidate_labels", item.get("text_queries"))
            if image is None or not is_image(image):
                raise InputError(
                    'a request dict has "image" (a path, a Pillow image or a numpy array) and '
                    f'"candidate_labels"; got keys {sorted(map(str, item))}'
                )
        else:
            image, given = item, None
        if given is None:
            given = None if shared is None else shared[index]
        if given is None:
            raise InputError(
                "zero-shot-object-detection needs candidate_labels: give them as an option "
                'or in each {"image", "candidate_labels"} dict'
            )
        requests.append((image, _labels(given)))
    return requests


def _labels(value: Any) -> list[str]:
    """A label list; one string split at its commas as transformers' zero-shot-object-detection
    splits it, nothing stripped ("cat, couch" is "cat" and " couch": the label keeps its space,
    and so does its prompt), where zero-shot classification strips them."""
    if isinstance(value, str):
        value = value.split(",")
    return candidate_labels_option(value)
