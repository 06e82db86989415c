"""The object-detection task: images in, [{"score", "label", "box"}] out per image, as
transformers' object-detection pipeline returns them (boxes in pixels of the original image,
truncated to ints as it truncates them), for DETR, YOLOS and RT-DETR exports.

Each family's image processor, from preprocessor_config.json:
- DETR: resize the shortest edge to `shortest_edge` unless that takes the longest past
  `longest_edge` (images.py's `resized_size`), rescale, normalize; the export's pixel_mask is all
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
from transmuter.pipelines.base import id2label
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.processors import load_image, preprocess, resized_size

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
# model_type -> (processor, scoring).
FAMILIES = {
    "detr": ("detr", "softmax"),
    "yolos": ("yolos", "softmax"),
    "rt_detr": ("rt_detr", "sigmoid"),
}
# The processors' defaults, for keys a preprocessor_config.json omits.
DETR_DEFAULTS = {
    "image_mean": IMAGENET_MEAN,
    "image_std": IMAGENET_STD,
    "resample": 2,
    "size": {"shortest_edge": 800, "longest_edge": 1333},
}
PROCESSOR_DEFAULTS = {
    "detr": DETR_DEFAULTS,
    "yolos": DETR_DEFAULTS,
    "rt_detr": {"do_normalize": False, "size": {"height": 640, "width": 640}, "resample": 2},
    "mask2former": {**DETR_DEFAULTS, "size_divisor": 32},
}


class DetrFamilyModel:
    """A DETR-family export and its family's image processor (preprocessor_config.json over the
    processors' defaults), run one image at a time at its resized size (padded as
    `padded_size` says): pixel_values (and pixel_mask where the export takes it) in, the
    `outputs` named out; a program per input size, the `cache_size` most recent kept.
    `processors` maps the model_types supported to their processor (PROCESSOR_DEFAULTS' keys).
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
        if cache_size < 1:
            raise InputError(f"cache_size must be at least 1; got {cache_size}")
        self.repo, self.cache_size = repo, cache_size
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
        if pad_to_multiple_of is not None and (pad_to_multiple_of < 1 or not self.masked):
            raise InputError(
                "pad_to_multiple_of needs an export taking pixel_mask (so that the padding is "
                f"masked) and a multiple of at least 1; got {pad_to_multiple_of} for inputs "
                f"{inputs}"
            )
        self.multiple = pad_to_multiple_of
        self.config = {**PROCESSOR_DEFAULTS[self.processor], **repo.preprocessor_config}
        self._compiled = None

    def pixels(self, image: Any) -> np.ndarray:
        """The family's processor: float32 [3, height, width] for one image."""
        image = load_image(image)
        config = dict(self.config)
        if config.get("do_resize", True):
            wanted = config["size"]
            if self.processor != "rt_detr":
                wanted = _detr_size(wanted, config.get("max_size", 1333))
            resize = _yolos_resized if self.processor == "yolos" else resized_size
            width, height = resize(image.size, wanted)
            if self.processor == "mask2former":
                # Mask2FormerImageProcessor resizes to sides rounded up to a multiple (older
                # configs call it size_divisibility).
                divisor = int(config.get("size_divisibility", config["size_divisor"]) or 0)
                if divisor:
                    width, height = (-(-n // divisor) * divisor for n in (width, height))
            config["size"] = {"height": height, "width": width}
        return preprocess(image, config)

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


def padded_size(
    config: Mapping[str, Any], multiple: int | None, height: int, width: int
) -> tuple[int, int]:
    """The input size an image resized to (height, width) runs at: the processor's `pad_size`
    where its config sets one (transformers pads every image to it), else rounded up to
    `multiple` (pad_to_multiple_of), else its own."""
    pad_size = config.get("pad_size")
    if pad_size and config.get("do_pad", True):
        if pad_size["height"] < height or pad_size["width"] < width:
            raise InputError(
                f"an image resized to {height} x {width} is larger than the processor's "
                f"pad_size {pad_size['height']} x {pad_size['width']}"
            )
        return pad_size["height"], pad_size["width"]
    if multiple:
        return -(-height // multiple) * multiple, -(-width // multiple) * multiple
    return height, width


class ObjectDetection(DetrFamilyModel):
    """Detect objects in images (numpy HWC arrays, Pillow images or paths; one or a list):
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
        self.threshold = threshold
        self.top_k = _top_k(top_k)
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

    def __call__(
        self, inputs: Any, *, threshold: float | None = None, top_k: int | None = None
    ) -> Any:
        single = not isinstance(inputs, (list, tuple))
        images = [inputs] if single else list(inputs)
        if not images:
            raise InputError("give an image or a non-empty list of them")
        threshold = self.threshold if threshold is None else threshold
        top_k = self.top_k if top_k is None else _top_k(top_k)
        results = []
        for image in images:
            image = load_image(image)
            found = self.run(self.pixels(image))
            results.append(
                self._detections(found["logits"], found["pred_boxes"], image.size, threshold, top_k)
            )
        return results[0] if single else results

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


def _top_k(top_k: int | None) -> int | None:
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise InputError(f"top_k must be a whole number of at least 1; got {top_k!r}")
    return top_k


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


def _detr_size(size: Any, max_size: int) -> dict[str, int]:
    """DETR's and YOLOS's `size` as their processors read it: an int (older configs, as
    facebook/detr-resnet-50's `"size": 800, "max_size": 1333`) is the shortest edge, capped by
    `max_size`; a dict gives shortest and longest edges, or a height and width."""
    if isinstance(size, int):
        return {"shortest_edge": size, "longest_edge": int(max_size)}
    if {"shortest_edge", "longest_edge"} <= set(size) or {"height", "width"} <= set(size):
        return size
    raise ModelLoadError(
        f"preprocessor_config.json: a DETR or YOLOS size of {dict(size)} is not supported (give "
        "shortest_edge and longest_edge, or height and width)"
    )


def _yolos_resized(size: tuple[int, int], wanted: Mapping[str, Any]) -> tuple[int, int]:
    """(width, height) after YOLOS's resize: DETR's shortest / longest edge rule, except that
    a portrait image always scales (the check for an unchanged size comes second), and each
    side floored to a multiple of 16."""
    if not ("shortest_edge" in wanted and "longest_edge" in wanted):
        return resized_size(size, wanted)
    width, height = size
    shortest, longest = int(wanted["shortest_edge"]), int(wanted["longest_edge"])
    short, long = float(min(width, height)), float(max(width, height))
    exact = None
    if long / short * shortest > longest:
        exact = longest * short / long
        shortest = int(round(exact))
    scale = exact if exact is not None else shortest
    if width < height:
        new_width, new_height = shortest, int(scale * height / width)
    elif min(width, height) == shortest:
        new_width, new_height = width, height
    else:
        new_width, new_height = int(scale * width / height), shortest
    return new_width - new_width % 16, new_height - new_height % 16
