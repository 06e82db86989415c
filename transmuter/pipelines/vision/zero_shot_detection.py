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

Processors (preprocessor_config.json): OWL-ViT resizes to {"height", "width"} (bicubic),
rescales and normalizes (images.py); OWLv2 rescales, pads to a square at the bottom and right
with zeros, resizes with its Gaussian anti-aliasing and linear zoom (scipy.ndimage, as
transformers does) and normalizes. Post-processing: a sigmoid of each label's logit per box,
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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.detection import box_dict, corners_scaled
from transmuter.pipelines.vision.grounding_dino import GroundingDino
from transmuter.pipelines.vision.processors import load_image, preprocess

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
PROCESSOR_DEFAULTS = {
    "owlvit": {"image_mean": CLIP_MEAN, "image_std": CLIP_STD, "resample": 3},
    "owlv2": {"image_mean": CLIP_MEAN, "image_std": CLIP_STD},
}
DEFAULT_SIZES = {"owlvit": 768, "owlv2": 960}
FAMILIES = (*PROCESSOR_DEFAULTS, "grounding-dino")
INPUTS = ("input_ids", "pixel_values", "attention_mask")


class ZeroShotObjectDetection:
    """Find `candidate_labels` (a list, or one comma-separated string) in images: an image
    with `candidate_labels=`, a list of images sharing them, or {"image", "candidate_labels"}
    dicts. Per image the detections scoring above `threshold` (default 0.1) for any label,
    best first, the `top_k` best where given. `batch_size`: Grounding DINO's labels per forward
    (OWL-ViT and OWLv2 take every label in one); `pad_to_multiple_of`: Grounding DINO's image
    buckets (grounding_dino.py; OWL resizes every image to one size)."""

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
        if cache_size < 1 or (top_k is not None and top_k < 1):
            raise InputError(f"top_k and cache_size must be at least 1; got {top_k}, {cache_size}")
        self.repo, self.threshold, self.top_k, self.cache_size = repo, threshold, top_k, cache_size
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
        self.config = {**PROCESSOR_DEFAULTS[self.family], **repo.preprocessor_config}
        side = DEFAULT_SIZES[self.family]
        self.config.setdefault("size", {"height": side, "width": side})
        text = repo.config.get("text_config") or {}
        self.positions = int(text.get("max_position_embeddings", 16))
        self._compiled = None

    def __call__(
        self,
        inputs: Any,
        candidate_labels: str | Sequence[str] | None = None,
        *,
        threshold: float | None = None,
        top_k: int | None = None,
    ) -> Any:
        requests, single = _requests(inputs, candidate_labels)
        threshold = self.threshold if threshold is None else threshold
        if top_k is not None and top_k < 1:
            raise InputError(f"top_k must be at least 1; got {top_k}")
        top_k = top_k or self.top_k
        results = []
        for image, labels in requests:
            if self.grounding is not None:
                results.append(self.grounding.detect(image, labels, threshold, top_k))
                continue
            image = load_image(image)
            logits, boxes = self._run(self.pixels(image), labels)
            results.append(self._detections(logits, boxes, labels, image.size, threshold, top_k))
        return results[0] if single else results

    def pixels(self, image: Any) -> np.ndarray:
        """The family's processor: float32 [3, height, width] for one image."""
        if self.grounding is not None:
            return self.grounding.pixels(image)
        image = load_image(image)
        if self.family == "owlvit":
            return preprocess(image, self.config)
        return _owlv2_pixels(np.asarray(image), self.config)

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
        if self.family == "owlv2":
            side = max(size)
            size = (side, side)
        corners = corners_scaled(boxes, size)
        found = [
            {"score": float(scores[i, j]), "label": label, "box": box_dict(corners[i])}
            for j, label in enumerate(labels)
            for i in np.flatnonzero(scores[:, j] > threshold)
        ]
        found.sort(key=lambda d: d["score"], reverse=True)  # stable, as the pipeline's sort
        return found[:top_k] if top_k else found


def _requests(inputs: Any, labels: Any) -> tuple[list[tuple[Any, list[str]]], bool]:
    """(image, labels) pairs, and whether one image (not a list) was given."""
    if isinstance(inputs, Mapping):
        return [_request(inputs.get("image"), inputs.get("candidate_labels"), inputs)], True
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise InputError("give an image or a non-empty list of them")
        return [
            _request(i.get("image"), i.get("candidate_labels"), i)
            if isinstance(i, Mapping)
            else _request(i, labels)
            for i in inputs
        ], False
    return [_request(inputs, labels)], True


def _request(image: Any, labels: Any, given: Any = None) -> tuple[Any, list[str]]:
    if image is None:
        raise InputError(f'a request dict has "image" and "candidate_labels"; got {given!r}')
    if isinstance(labels, str):
        labels = labels.split(",")  # as transformers' pipeline splits one string
    if (
        not isinstance(labels, (list, tuple))
        or not labels
        or not all(isinstance(label, str) for label in labels)
    ):
        raise InputError(f"candidate_labels must be a non-empty list of strings; got {labels!r}")
    return image, list(labels)


def _owlv2_pixels(image: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """OWLv2's processor on an RGB uint8 [height, width, 3] image: float32 [3, side, side]."""
    from scipy import ndimage

    pixels = image.astype(np.float32)
    if config.get("do_rescale", True):
        scale = config.get("rescale_factor", 1 / 255)
        pixels = (image.astype(np.float64) * scale).astype(np.float32)
    if config.get("do_pad", True):
        side = max(pixels.shape[:2])
        pixels = np.pad(pixels, ((0, side - pixels.shape[0]), (0, side - pixels.shape[1]), (0, 0)))
    if config.get("do_resize", True):
        size = config["size"]
        if isinstance(size, int):
            size = {"height": size, "width": size}
        wanted = (size["height"], size["width"], pixels.shape[2])
        factors = np.divide(pixels.shape, wanted)
        # Anti-aliasing as scikit-image's resize, which OWLv2's original code uses.
        sigma = np.maximum(0, (factors - 1) / 2)
        filtered = ndimage.gaussian_filter(pixels, sigma, cval=0, mode="mirror")
        zoomed = ndimage.zoom(
            filtered, [1 / f for f in factors], order=1, mode="mirror", cval=0, grid_mode=True
        )
        pixels = np.clip(zoomed, pixels.min(), pixels.max())
    if config.get("do_normalize", True):
        mean = np.asarray(config["image_mean"], np.float32)
        std = np.asarray(config["image_std"], np.float32)
        pixels = (pixels - mean) / std
    return np.ascontiguousarray(pixels.transpose(2, 0, 1), np.float32)
