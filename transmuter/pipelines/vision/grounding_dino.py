"""Grounding DINO for zero-shot-object-detection (zero_shot_detection.py's task dispatches
here on config.json's model_type "grounding-dino"): exports of GroundingDinoForObjectDetection
as one graph (model.onnx: input_ids, token_type_ids, attention_mask, pixel_values, pixel_mask
-> logits [batch, queries, max_text_len], pred_boxes [batch, queries, 4]), in Optimum's layout
or transformers.js's (onnx/model.onnx).

What transformers' pipeline does, and so this: each label is a prompt of its own (the tokenizer
on the bare label: [CLS] label [SEP], no lower-casing or "." beyond the tokenizer's own), one
forward per label with the image; a query's score is the sigmoid of its largest logit over the
prompt's tokens ([CLS] and [SEP] included, the padding at -inf), kept above `threshold`; boxes
from relative (center, size) to corners in pixels of the original image, unclamped; every
label's detections in label order, then sorted by score (stably), the `top_k` best.
The image processor is DETR's (processors.py): resize the shortest edge to `shortest_edge` unless
that takes the longest past `longest_edge`, rescale, normalize; an image alone is not padded
(pixel_mask all ones) unless preprocessor_config.json sets a `pad_size`.

One forward per label does not mean one label per row: labels are rows of one batch (up to
`batch_size`; the row count padded to a power of two, at most `batch_size`, by repeating the
last label, whose rows are dropped). Rows do not mix, except that the fusion layers subtract
one maximum over the whole batch from the attention logits before a softmax, which the softmax
cancels (up to rounding; not where logits spread more than the layer's clamp of 5e4).

Buckets: text is left-padded to a multiple of 16 tokens (capped at config.json's max_text_len)
with [CLS] ids and attention_mask 0. That is exact, where right padding is not: the model
builds each token's attention and position from the delimiters around it ([CLS], [SEP], ".",
"?": transformers' ids 101, 102, 1012, 1029) and treats a phrase ending at the last position
apart, so padding after [SEP] would change the label's own tokens; padding before [CLS] with
delimiters leaves every real token its attention and positions, and attention_mask hides the
padding from the fusion layers, the decoder and the logits (on make_grounding_dino.py's model
in torch, each query's best logit: left padding to 16 moves it by 5e-7, right padding by up to
3.5, padding a 64 x 85 image to 96 x 96 with pixel_mask 0 by up to 3). Where the tokenizer's
[CLS] is not one of those ids, labels run at their own token count. Labels are grouped by their
text bucket, so a long label does not widen the others. Images run at their resized size (or
`pad_size`): padding them, even masked, changes the answer (the Swin backbone sees the padded
pixels). So a program per (resized height and width, row bucket 1/2/4/... up to `batch_size`,
text bucket 16/32/...). `pad_to_multiple_of=m` pads height and width up to multiples of m
(pixel_mask 0 there), as object-detection's DETR does: one program per size bucket, and each
answer is then transformers' for the image padded to that size (its processor's `pad_size`),
not alone. The image half is not reused: the single graph runs the backbone and
the encoder's image side for every row, so each label pays for the image again (that needs the
image encoder exported apart).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import positive_int
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.detection import box_dict, corners_scaled
from transmuter.pipelines.vision.processors import (
    DETR_FAMILY_DEFAULTS,
    detr_family_pixels,
    load_image,
    padded_size,
)

# transformers' SPECIAL_TOKENS in modeling_grounding_dino: bert-base-uncased's [CLS], [SEP],
# "." and "?", the phrase delimiters the model's text masks are built from.
DELIMITERS = (101, 102, 1012, 1029)
TEXT_MULTIPLE = 16
NEEDED = ("input_ids", "attention_mask", "pixel_values")
OPTIONAL = ("token_type_ids", "pixel_mask")


class GroundingDino:
    """A Grounding DINO export with its tokenizer and image processor: `detect(image, labels,
    threshold, top_k)` gives transformers' pipeline's detections for one image."""

    def __init__(
        self,
        repo: Repo,
        *,
        batch_size: int = 4,
        pad_to_multiple_of: int | None = None,
        cache_size: int = 8,
    ):
        batch_size = positive_int(batch_size, "batch_size")
        cache_size = positive_int(cache_size, "cache_size")
        self.repo, self.batch_size, self.cache_size = repo, batch_size, cache_size
        self.model = repo.model("model")
        inputs, outputs = set(self.model.inputs), set(self.model.outputs)
        takes = set(NEEDED) <= inputs <= {*NEEDED, *OPTIONAL}
        if not takes or not {"logits", "pred_boxes"} <= outputs:
            raise ModelLoadError(
                f"{repo.source}: Grounding DINO feeds {', '.join(NEEDED)} (and "
                f"{', '.join(OPTIONAL)}) and reads logits and pred_boxes; the model takes "
                f"{self.model.inputs} and gives {self.model.outputs}"
            )
        if pad_to_multiple_of is not None:
            pad_to_multiple_of = positive_int(pad_to_multiple_of, "pad_to_multiple_of")
        if pad_to_multiple_of is not None and "pixel_mask" not in self.model.inputs:
            raise InputError(
                "pad_to_multiple_of needs an export taking pixel_mask (so that the padding is "
                f"masked) and a multiple of at least 1; got {pad_to_multiple_of} for inputs "
                f"{self.model.inputs}"
            )
        self.multiple = pad_to_multiple_of
        self.tokenizer = repo.require_tokenizer("zero-shot-object-detection")
        if not repo.preprocessor_config:
            raise ModelLoadError(
                f"{repo.source}: zero-shot object detection needs preprocessor_config.json (the "
                f"image processor's size and normalization); found {repo.found}"
            )
        self.config = {**DETR_FAMILY_DEFAULTS["grounding-dino"], **repo.preprocessor_config}
        self.max_text_len = int(repo.config.get("max_text_len", 256))
        cls = self.tokenizer.token_to_id("[CLS]")
        self.pad_id = cls if cls in DELIMITERS else None  # None: no text buckets
        self._compiled = None

    def pixels(self, image: Any) -> np.ndarray:
        """The image processor's pixel_values: float32 [3, height, width] for one image."""
        return detr_family_pixels(image, "grounding-dino", self.config)

    def detect(
        self, image: Any, labels: list[str], threshold: float, top_k: int | None
    ) -> list[dict[str, Any]]:
        """Per label and query above `threshold`, {"score", "label", "box"}, best first."""
        image = load_image(image)
        scores, boxes = self.scored(self.pixels(image), labels)
        corners = corners_scaled(boxes, image.size)
        found = [
            {"score": float(scores[j, i]), "label": label, "box": box_dict(corners[j, i])}
            for j, label in enumerate(labels)
            for i in np.flatnonzero(scores[j] > threshold)
        ]
        found.sort(key=lambda d: d["score"], reverse=True)  # stable, as the pipeline's sort
        return found[:top_k] if top_k else found

    def scored(self, pixels: np.ndarray, labels: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each label's query scores [labels, queries] and relative boxes [labels, queries, 4]
        for one image's pixel values."""
        encodings = self.tokenizer.encode_batch(labels)
        longest = max(len(e.ids) for e in encodings)
        if longest > self.max_text_len:
            raise InputError(
                f"a label is {longest} tokens; the model takes {self.max_text_len} at most "
                "(config.json's max_text_len)"
            )
        groups: dict[int, list[int]] = {}
        for index, encoding in enumerate(encodings):
            groups.setdefault(self._width(len(encoding.ids)), []).append(index)
        scores: list[Any] = [None] * len(labels)
        boxes: list[Any] = [None] * len(labels)
        image = self._image_inputs(pixels)
        for width, members in groups.items():
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                logits, found = self._run([encodings[i] for i in chunk], width, image)
                for row, index in enumerate(chunk):
                    scores[index], boxes[index] = _sigmoid(logits[row].max(-1)), found[row]
        return np.stack(scores), np.stack(boxes)

    def _width(self, tokens: int) -> int:
        if self.pad_id is None:
            return tokens
        return min(-(-tokens // TEXT_MULTIPLE) * TEXT_MULTIPLE, self.max_text_len)

    def _image_inputs(self, pixels: np.ndarray) -> dict[str, np.ndarray]:
        height, width = pixels.shape[1:]
        padded = padded_size(self.config, self.multiple, height, width)
        pad = ((0, 0), (0, padded[0] - height), (0, padded[1] - width))
        mask = np.zeros((1, *padded), np.int64)
        mask[:, :height, :width] = 1
        if "pixel_mask" not in self.model.inputs and not mask.all():
            raise ModelLoadError(
                f"{self.repo.source}: preprocessor_config.json's pad_size pads images, and the "
                "export takes no pixel_mask to hide the padding"
            )
        return {"pixel_values": np.pad(pixels, pad)[None], "pixel_mask": mask}

    def _run(
        self, encodings: list[Any], width: int, image: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """logits and pred_boxes of labels as rows (padded to a power of two, at most
        `batch_size`) at `width` tokens, left-padded."""
        rows = min(1 << (len(encodings) - 1).bit_length(), self.batch_size)
        ids = np.full((rows, width), self.pad_id or 0, np.int64)
        types = np.zeros((rows, width), np.int64)
        mask = np.zeros((rows, width), np.int64)
        for row in range(rows):
            encoding = encodings[min(row, len(encodings) - 1)]
            start = width - len(encoding.ids)
            ids[row, start:] = encoding.ids
            types[row, start:] = encoding.type_ids
            mask[row, start:] = 1
        inputs = {
            "input_ids": ids,
            "token_type_ids": types,
            "attention_mask": mask,
            "pixel_values": np.repeat(image["pixel_values"], rows, 0),
            "pixel_mask": np.repeat(image["pixel_mask"], rows, 0),
        }
        inputs = {name: inputs[name] for name in self.model.inputs}
        if self._compiled is None:
            self._compiled = transmuter.compile(self.model, inputs, cache_size=self.cache_size)
        outputs = self._compiled(inputs)
        logits = np.asarray(outputs["logits"], np.float32)[: len(encodings)]
        return logits, np.asarray(outputs["pred_boxes"], np.float32)[: len(encodings)]


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # -inf logits (every token masked) score 0
        return (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
