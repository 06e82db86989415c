"""The image-segmentation task: images in, one list of {"score", "label", "mask": Pillow "L"
image, 255 inside} per image out, as transformers' pipeline returns them, for SegFormer
(semantic), DETR (panoptic, instance, semantic) and Mask2Former (panoptic, semantic).

The subtask: the one asked for, else the first the processor's post-processing has in the
pipeline's order (panoptic, instance, semantic). Its outputs, as transformers' processors give
them (masks upsampled bilinearly to the image's size, torch's align_corners=False; Mask2Former's
mask logits first to 384 x 384, as its processor's post-processing does for every model):
- semantic: per pixel the class with the highest score (SegFormer: its logits; DETR,
  Mask2Former: per class the sum over queries of the class probability, softmax without the
  no-object class, times the mask's sigmoid), upsampled before the argmax; per class present
  in id order a mask, with "score" None.
- panoptic and instance (DETR's post_process_panoptic_segmentation and
  post_process_instance_segmentation, which the pipeline calls alike: it fuses no labels;
  Mask2Former's panoptic): each
  query's score and class from the softmax over every class, no-object included; the queries
  whose class is an object and whose score is above `threshold` (0.9), in query order, with
  their masks' sigmoids upsampled and weighted by the score; each pixel goes to the query with
  the highest weighted mask; a query is a segment where it has pixels and these are more than
  `overlap_mask_area_threshold` (0.5, the pipeline's default) of its weighted mask's pixels at
  or above `mask_threshold` (0.5). Scores are rounded to 6 digits, as transformers rounds them.
  No segment gives [].
Mask2Former's instance post-processing is not here: it lists segments in the order of torch's
unsorted top-k over (query, class) pairs, an order of torch's implementation.

Shapes: SegformerImageProcessor resizes every image to one size, so only the batch dim varies
(bucketed to powers of two up to `batch_size`). DETR and Mask2Former run each image alone at its
resized size (detection.py's `DetrFamilyModel`): a program per size, the `cache_size` most
recent kept.
The masks are Pillow images: `transmuter[image]`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import id2label
from transmuter.pipelines.base import threshold as threshold_option
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.detection import DetrFamilyModel
from transmuter.pipelines.vision.image_tasks import ImageTask, PixelModel
from transmuter.pipelines.vision.processors import load_image, preprocess, resize_maps

# The subtasks each image processor's post-processing gives, in the order the pipeline tries them.
SUBTASKS = {
    "SegformerImageProcessor": ("semantic",),
    "DetrImageProcessor": ("panoptic", "instance", "semantic"),
    "Mask2FormerImageProcessor": ("panoptic", "semantic"),
}
# Query-based models: image processor -> (model_type, class logits, mask logits, the size the
# post-processing resizes the mask logits to first).
QUERY_MODELS = {
    "DetrImageProcessor": ("detr", "logits", "pred_masks", None),
    "Mask2FormerImageProcessor": (
        "mask2former",
        "class_queries_logits",
        "masks_queries_logits",
        (384, 384),
    ),
}


class ImageSegmentation(ImageTask):
    """Segment images (paths, Pillow images or numpy arrays; one, a list or a generator): a list of
    {"score", "label", "mask"} per image. `subtask`: None (the processor's first of panoptic,
    instance, semantic) or one it has; `threshold`, `mask_threshold` and
    `overlap_mask_area_threshold` as transformers' pipeline passes them to panoptic and instance
    post-processing (semantic ignores them). All also per call."""

    def __init__(
        self,
        repo: Repo,
        *,
        subtask: str | None = None,
        threshold: float = 0.9,
        mask_threshold: float = 0.5,
        overlap_mask_area_threshold: float = 0.5,
        batch_size: int = 8,
        cache_size: int = 8,
    ):
        self.images = repo.preprocessor_config
        processor = _processor_class(self.images)
        if processor not in SUBTASKS:
            raise ModelLoadError(
                f"{repo.source}: image-segmentation supports {', '.join(SUBTASKS)} "
                f"(preprocessor_config.json); this repo has {processor!r}"
            )
        self.processor = processor
        self.subtasks = SUBTASKS[processor]
        self.subtask = self._subtask(subtask)
        self.options = _thresholds(
            {
                "threshold": threshold,
                "mask_threshold": mask_threshold,
                "overlap_mask_area_threshold": overlap_mask_area_threshold,
            }
        )
        self.repo = repo
        self.batch_size = 1
        if processor in QUERY_MODELS:
            model_type, classes, masks, self.first = QUERY_MODELS[processor]
            self.outputs = classes, masks
            self.model = DetrFamilyModel(
                repo,
                "image-segmentation",
                {model_type: model_type},
                self.outputs,
                cache_size=cache_size,
            )
            return
        self.model = PixelModel(repo, "model", "image-segmentation", batch_size)
        self.batch_size = self.model.batch_size
        if "logits" not in self.model.model.outputs:
            raise ModelLoadError(f"{repo.source}: the model has no output 'logits'")

    def _subtask(self, subtask: str | None) -> str:
        if subtask is None:
            return self.subtasks[0]
        if subtask not in self.subtasks:
            why = ""
            if subtask == "instance" and self.processor == "Mask2FormerImageProcessor":
                why = (
                    " (Mask2Former's instance post-processing orders segments as torch's "
                    "unsorted top-k leaves them, which Transmuter does not reproduce)"
                )
            raise InputError(
                f"subtask {subtask!r} is not supported for this model; it does "
                f"{', '.join(map(repr, self.subtasks))}{why}"
            )
        return subtask

    def run_items(
        self,
        items: list,
        *,
        subtask: str | None = None,
        threshold: float | None = None,
        mask_threshold: float | None = None,
        overlap_mask_area_threshold: float | None = None,
    ) -> list:
        subtask = self.subtask if subtask is None else self._subtask(subtask)
        given = {
            "threshold": threshold,
            "mask_threshold": mask_threshold,
            "overlap_mask_area_threshold": overlap_mask_area_threshold,
        }
        options = {k: self.options[k] if v is None else v for k, v in given.items()}
        options = _thresholds(options)
        images = [load_image(image) for image in items]
        if isinstance(self.model, DetrFamilyModel):
            rows = [self.model.run(self.model.pixels(image)) for image in images]
        else:
            rows = self.model.run([preprocess(image, self.images) for image in images])
        return [
            self._segments(row, (image.height, image.width), subtask, options)
            for image, row in zip(images, rows)
        ]

    def _segments(
        self,
        outputs: dict[str, np.ndarray],
        size: tuple[int, int],
        subtask: str,
        options: dict[str, float],
    ) -> list[dict[str, Any]]:
        if not isinstance(self.model, DetrFamilyModel):
            return self._semantic(outputs["logits"], size)
        logits = outputs[self.outputs[0]].astype(np.float32)  # [queries, classes + 1]
        probabilities = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        masks = outputs[self.outputs[1]]  # [queries, height, width] logits
        if subtask == "semantic":
            maps = np.einsum(
                "qc,qhw->chw", probabilities[:, :-1], self._probabilities(masks), optimize=True
            )
            return self._semantic(maps, size)
        return self._panoptic(probabilities, masks, size, **options)

    def _probabilities(self, masks: np.ndarray) -> np.ndarray:
        """Mask logits' sigmoids, after the resize the post-processor makes first."""
        if self.first is not None:
            masks = resize_maps(masks, self.first, "bilinear")
        return 1 / (1 + np.exp(-masks.astype(np.float32)))

    def _semantic(self, maps: np.ndarray, size: tuple[int, int]) -> list[dict[str, Any]]:
        classes = resize_maps(maps, size, "bilinear").argmax(0)
        labels = id2label(self.repo.config, maps.shape[0])
        return [
            {"score": None, "label": labels[found], "mask": _mask(classes == found)}
            for found in np.unique(classes)
        ]

    def _panoptic(
        self,
        probabilities: np.ndarray,
        masks: np.ndarray,
        size: tuple[int, int],
        threshold: float,
        mask_threshold: float,
        overlap_mask_area_threshold: float,
    ) -> list[dict[str, Any]]:
        nothing = probabilities.shape[-1] - 1  # the no-object class, last
        scores, classes = probabilities.max(-1), probabilities.argmax(-1)
        keep = np.flatnonzero((classes != nothing) & (scores > threshold))
        if not len(keep):
            return []
        masks = self._probabilities(masks[keep])
        weighted = resize_maps(masks, size, "bilinear") * scores[keep, None, None]
        owner = weighted.argmax(0)
        labels = id2label(self.repo.config, nothing)
        segments = []
        for k, query in enumerate(keep):
            inside = owner == k
            area, whole = inside.sum(), (weighted[k] >= mask_threshold).sum()
            if not (area and whole):
                continue
            # The ratio in float32, as torch divides the two counts (4 / 5 > 0.8 there).
            if float(np.float32(area) / np.float32(whole)) > overlap_mask_area_threshold:
                segments.append(
                    {
                        "score": round(float(scores[query]), 6),
                        "label": labels[classes[query]],
                        "mask": _mask(inside),
                    }
                )
        return segments


def _thresholds(options: dict[str, Any]) -> dict[str, float]:
    return {name: threshold_option(value, name) for name, value in options.items()}


def _mask(inside: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(inside.astype(np.uint8) * 255, mode="L")


def _processor_class(config: dict[str, Any]) -> str | None:
    """The image processor's class as the pipeline would load it: older repos
    (facebook/detr-resnet-50-panoptic) name a feature extractor, some the fast processor."""
    name = config.get("image_processor_type") or config.get("feature_extractor_type")
    if not isinstance(name, str):
        return name
    return name.removesuffix("Fast").replace("FeatureExtractor", "ImageProcessor")
