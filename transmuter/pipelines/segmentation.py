"""The image-segmentation task, semantic, for SegFormer: images in, one {"score": None,
"label", "mask"} per class present out, as transformers' pipeline returns semantic
segmentations: the logits upsampled bilinearly to the image's size (as
SegformerImageProcessor's post_process_semantic_segmentation does), the argmax per pixel, and
per class in id order a Pillow "L" mask (255 where the class won).

SegformerImageProcessor resizes every image to one size, so only the batch dim varies:
bucketed to powers of two up to `batch_size`."""

from __future__ import annotations

from typing import Any

import numpy as np

from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.encoders import _labels
from transmuter.pipelines.image_tasks import PixelModel, image_list, resize_maps
from transmuter.pipelines.images import load_image, preprocess
from transmuter.pipelines.repo import Repo

# The subtasks each image processor's post-processing gives, as the pipeline chooses them.
SUBTASKS = {"SegformerImageProcessor": ("semantic",)}


class ImageSegmentation:
    """Segment images (numpy arrays, Pillow images or paths; one or a list): a list of
    {"score", "label", "mask"} per image. `subtask` None or "semantic" (SegFormer's only)."""

    def __init__(self, repo: Repo, *, subtask: str | None = None, batch_size: int = 8):
        self.images = repo.preprocessor_config
        processor = self.images.get("image_processor_type")
        if processor not in SUBTASKS:
            raise ModelLoadError(
                f"{repo.source}: image-segmentation supports {', '.join(SUBTASKS)} "
                f"(preprocessor_config.json); this repo has {processor!r}"
            )
        self.subtasks = SUBTASKS[processor]
        self.subtask = self._subtask(subtask)
        self.model = PixelModel(repo, "model", "image-segmentation", batch_size)
        if "logits" not in self.model.model.outputs:
            raise ModelLoadError(f"{repo.source}: the model has no output 'logits'")
        self.repo = repo

    def _subtask(self, subtask: str | None) -> str:
        if subtask is None:
            return self.subtasks[0]
        if subtask not in self.subtasks:
            raise InputError(
                f"subtask {subtask!r} is not supported for this model; it does "
                f"{', '.join(map(repr, self.subtasks))}"
            )
        return subtask

    def __call__(self, inputs: Any, *, subtask: str | None = None) -> Any:
        self._subtask(subtask)
        images, single = image_list(inputs)
        images = [load_image(image) for image in images]
        rows = self.model.run([preprocess(image, self.images) for image in images])
        results = [
            self._segments(row["logits"], (image.height, image.width))
            for image, row in zip(images, rows)
        ]
        return results[0] if single else results

    def _segments(self, logits: np.ndarray, size: tuple[int, int]) -> list[dict[str, Any]]:
        from PIL import Image

        classes = resize_maps(logits, size, "bilinear").argmax(0)
        labels = _labels(self.repo, logits.shape[0])
        return [
            {
                "score": None,
                "label": labels[found],
                "mask": Image.fromarray(((classes == found) * 255).astype(np.uint8), mode="L"),
            }
            for found in np.unique(classes)
        ]
