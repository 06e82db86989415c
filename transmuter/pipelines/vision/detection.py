"""The object-detection task: images in, [{"score", "label", "box"}] out per image, as
transformers' object-detection pipeline returns them (boxes in pixels of the original image,
truncated to ints as it truncates them), for DETR, YOLOS and RT-DETR exports.

Each family's image processor (processors.py's `detr_family_pixels`), from
preprocessor_config.json:
- DETR: resize the shortest edge to `shortest_edge` unless that takes the longest past
  `longest_edge` (processors.py's `resized_size`), rescale, normalize; the export's pixel_mask is all
  ones (an image alone fills its input).
- YOLOS: the same resize, each side then floored to a multiple of 16 (its processor's rule).
- RT-DETR: resize to {"height", "width"}, rescale (normalization off in its configs).
- Mask2Former (image-segmentation only): DETR's resize, each side then rounded up to a
  multiple of `size_divisor` (32).

And its post-processing (transformers' `post_process_object_detection`): DETR and YOLOS take
the softmax without the last (no-object) class and keep the queries whose best class scores
above `threshold`, in query order; RT-DETR scores every (query, class) pair with a sigmoid
(focal loss), keeps the `num_queries` best pairs, best first, then the threshold. Boxes come as
relative (center x, center y, width, height) and are turned to corners scaled to the image.

Shapes: each image runs alone, as transformers' pipeline runs it, at its resized size; a
program per (height, width) (the `cache_size` most recent kept). RT-DETR's fixed 640 x 640 is
one program. DETR's and YOLOS's resized sizes vary with the aspect ratio, and padding them
would change the answer: the convolutional backbone (DETR) and the ViT's interpolated position
embeddings and attention (YOLOS, which takes no mask) see the padded pixels; DETR's pixel_mask
hides them only from its transformer. `pad_to_multiple_of=m` pads height and width up to
multiples of m (pixel_mask 0 there) where the export takes pixel_mask: one program per bucket,
each image's result then equals transformers' for that image in a batch padded to that size
(the processor's `pad_size`), not alone. A `pad_size` in preprocessor_config.json pads every
image to it, as transformers does: one program.

`DetrFamilyModel` (the processor and the model run per image) is what image-segmentation's
DETR and Mask2Former share.

RF-DETR's own export (input "input", outputs "dets" and "labels") is refused: it has no
preprocessor_config.json or id2label to read the preprocessing and labels from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import id2label, positive_int
from transmuter.pipelines.base import threshold as threshold_option
from transmuter.pipelines.base import top_k as top_k_option
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.image_tasks import ImageTask, call_arguments
from transmuter.pipelines.vision.processors import (
    DETR_FAMILY_DEFAULTS,
    detr_family_pixels,
    load_image,
    padded_size,
)

# model_type -> (processor, scoring).
FAMILIES = {
    "detr": ("detr", "softmax"),
    "yolos": ("yolos", "softmax"),
    "rt_detr": ("rt_detr", "sigmoid"),
}

ALIASES = {"images": "inputs"}


class DetrFamilyModel:
    """A DETR-family export and its family's image processor (preprocessor_config.json over the
    processors' defaults), run one image at a time at its resized size (padded as
    `padded_size` says): pixel_values (and pixel_mask where the export takes it) in, the
    `outputs` named out; a program per input size, the `cache_size` most recent kept.
    `processors` maps the model_types supported to their processor (processors.py's DETR_FAMILY_DEFAULTS' keys).
    What object-detection and image-segmentation (DETR, Mask2Former) share."""

    def __init__(
        self,
        repo: Repo,
        task: str,
        processors: Mapping[str, str],
        outputs: tuple[str, ...],
        *,
        pad_to_multiple_of: int | None = None,
        cache_size: int = 8,
    ):
        self.repo, self.cache_size = repo, positive_int(cache_size, "cache_size")
        self.model = repo.model("model")
        inputs, found = self.model.inputs, self.model.outputs
        if inputs == ["input"] and {"dets", "labels"} <= set(found):
            raise ModelLoadError(
                f"{repo.source}: this is RF-DETR's own export (input 'input', outputs 'dets' "
                "and 'labels'); Transmuter runs transformers' detection exports (pixel_values "
                "in, logits and pred_boxes out) with the repo's preprocessor_config.json"
            )
        model_type = repo.config.get("model_type")
        if model_type not in processors:
            raise ModelLoadError(
                f"{repo.source}: config.json's model_type is {model_type!r}; {task} "
                f"supports {', '.join(processors)}"
            )
        self.processor = processors[model_type]
        if not repo.preprocessor_config:
            raise ModelLoadError(
                f"{repo.source}: {task} needs preprocessor_config.json (the image "
                f"processor's sizes and normalization); found {repo.found}"
            )
        if "pixel_values" not in inputs or not set(inputs) <= {"pixel_values", "pixel_mask"}:
            raise ModelLoadError(
                f"{repo.source}: {task} feeds pixel_values (and pixel_mask); the model takes "
                f"{inputs}"
            )
        if not set(outputs) <= set(found):
            raise ModelLoadError(
                f"{repo.source}: {task} reads {' and '.join(outputs)}; the model gives {found}"
            )
        self.outputs = outputs
        self.masked = "pixel_mask" in inputs
        if pad_to_multiple_of is not None:
            pad_to_multiple_of = positive_int(pad_to_multiple_of, "pad_to_multiple_of")
        if pad_to_multiple_of is not None and not self.masked:
            raise InputError(
                "pad_to_multiple_of needs an export taking pixel_mask (so that the padding is "
                f"masked) and a multiple of at least 1; got {pad_to_multiple_of} for inputs "
                f"{inputs}"
            )
        self.multiple = pad_to_multiple_of
        self.config = {**DETR_FAMILY_DEFAULTS[self.processor], **repo.preprocessor_config}
        self._compiled = None

    def pixels(self, image: Any) -> np.ndarray:
        """The family's processor: float32 [3, height, width] for one image."""
        return detr_family_pixels(image, self.processor, self.config)

    def run(self, pixels: np.ndarray) -> dict[str, np.ndarray]:
        """The outputs named in `outputs` for one image's pixels, without the batch dim."""
        height, width = pixels.shape[1:]
        padded = padded_size(self.config, self.multiple, height, width)
        pad = ((0, 0), (0, padded[0] - height), (0, padded[1] - width))
        inputs = {"pixel_values": np.pad(pixels, pad)[None]}
        if self.masked:
            inputs["pixel_mask"] = np.zeros((1, *padded), np.int64)
            inputs["pixel_mask"][:, :height, :width] = 1
        if self._compiled is None:
            self._compiled = transmuter.compile(self.model, inputs, cache_size=self.cache_size)
        found = self._compiled(inputs)
        return {name: np.asarray(found[name], np.float32)[0] for name in self.outputs}


class ObjectDetection(DetrFamilyModel, ImageTask):
    """Detect objects in images (paths, Pillow images or numpy arrays; one, a list or a
    generator):
    per image, [{"score", "label", "box": {"xmin", "ymin", "xmax", "ymax"}}] for the
    detections scoring above `threshold` (transformers' default 0.5), in the family's order as
    transformers lists them; with `top_k`, the `top_k` best of those, best first. Both also per
    call."""

    def __init__(
        self,
        repo: Repo,
        *,
        threshold: float = 0.5,
        top_k: int | None = None,
        pad_to_multiple_of: int | None = None,
        cache_size: int = 8,
    ):
        self.threshold = threshold_option(threshold)
        self.top_k = top_k_option(top_k, none=True)
        super().__init__(
            repo,
            "object detection",
            {model_type: processor for model_type, (processor, _) in FAMILIES.items()},
            ("logits", "pred_boxes"),
            pad_to_multiple_of=pad_to_multiple_of,
            cache_size=cache_size,
        )
        self.scoring = FAMILIES[repo.config["model_type"]][1]
        if not repo.config.get("use_focal_loss", True):
            # RT-DETR trained without focal loss: softmax scores without the last class, the
            # best class per query (its post-processor's top-k then keeps every query).
            self.scoring = "softmax"

    def __call__(self, inputs: Any = None, **options: Any) -> Any:
        # transformers' pipeline takes the images as images= too (its older keyword).
        inputs, options = call_arguments(self, inputs, (), options, "threshold", ALIASES)
        return super().__call__(inputs, **options)

    def run_items(
        self, items: list, *, threshold: float | None = None, top_k: int | None = None
    ) -> list:
        threshold = self.threshold if threshold is None else threshold_option(threshold)
        top_k = self.top_k if top_k is None else top_k_option(top_k)
        results = []
        for image in items:
            image = load_image(image)
            found = self.run(self.pixels(image))
            results.append(
                self._detections(found["logits"], found["pred_boxes"], image.size, threshold, top_k)
            )
        return results

    def _detections(
        self,
        logits: np.ndarray,
        boxes: np.ndarray,
        size: tuple[int, int],
        threshold: float,
        top_k: int | None,
    ) -> list[dict[str, Any]]:
        scores, classes, corners = self.scored(logits, boxes, size)
        labels = id2label(self.repo.config, logits.shape[-1])
        keep = np.flatnonzero(scores > threshold)
        if top_k is not None:
            keep = keep[np.argsort(-scores[keep], kind="stable")[:top_k]]
        return [
            {"score": float(s), "label": labels[c], "box": box_dict(b)}
            for s, c, b in zip(scores[keep], classes[keep], corners[keep])
        ]

    def scored(
        self, logits: np.ndarray, boxes: np.ndarray, size: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every candidate's score, class and corner box in pixels of an image of `size`
        (width, height), in the order the family's post-processor lists them."""
        corners = corners_scaled(boxes, size)
        if self.scoring == "softmax":
            shifted = np.exp(logits - logits.max(-1, keepdims=True))
            probabilities = shifted / shifted.sum(-1, keepdims=True)
            real = probabilities[:, :-1]  # the last class is "no object"
            return real.max(-1), real.argmax(-1), corners
        queries, classes = logits.shape
        scores = (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32).ravel()
        best = np.argsort(-scores, kind="stable")[:queries]
        return scores[best], best % classes, corners[best // classes]


def corners_scaled(boxes: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Relative (cx, cy, w, h) boxes as (x0, y0, x1, y1) in pixels of a (width, height)
    image, in float32 as transformers computes them (its ints truncate these)."""
    cx, cy, w, h = (boxes[..., i] for i in range(4))
    half = np.float32(0.5)
    corners = np.stack([cx - half * w, cy - half * h, cx + half * w, cy + half * h], -1)
    width, height = size
    return corners * np.asarray([width, height, width, height], np.float32)


def box_dict(corners: np.ndarray) -> dict[str, int]:
    xmin, ymin, xmax, ymax = (int(v) for v in np.trunc(corners))
    return {"xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax}
