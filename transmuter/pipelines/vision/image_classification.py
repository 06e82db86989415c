"""The image-classification task: images in, [{"label", "score"}] out, as transformers'
pipeline returns them, with processors.py's preprocessing."""

from __future__ import annotations

from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import id2label, sigmoid, softmax
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.processors import preprocess


class ImageClassification:
    """Classify images: numpy arrays (height, width, channels; uint8, or floats in [0, 1])
    or Pillow images, one or a list. The `top_k` best labels of config.json's id2label with
    softmax scores (a sigmoid for multi-label configs), as a list per image."""

    def __init__(self, repo: Repo, *, top_k: int = 5, batch_size: int = 8):
        if batch_size < 1 or top_k < 1:
            raise InputError(f"top_k and batch_size must be at least 1; got {top_k}, {batch_size}")
        self.repo, self.top_k, self.batch_size = repo, top_k, batch_size
        self.model = repo.model("model")
        if "pixel_values" not in self.model.inputs or len(self.model.inputs) != 1:
            raise ModelLoadError(
                f"{repo.source}: image classification feeds pixel_values; the model takes "
                f"{self.model.inputs}"
            )
        self.config = repo.preprocessor_config
        self.sigmoid = repo.config.get("problem_type") == "multi_label_classification"
        self._compiled = None

    def __call__(self, inputs: Any, *, top_k: int | None = None) -> Any:
        single = not isinstance(inputs, (list, tuple))
        images = [inputs] if single else list(inputs)
        if not images:
            raise InputError("give an image or a non-empty list of them")
        pixels = np.stack([preprocess(image, self.config) for image in images])
        results = []
        for start in range(0, len(pixels), self.batch_size):
            chunk = {"pixel_values": pixels[start : start + self.batch_size]}
            if self._compiled is None:
                self._compiled = transmuter.compile(self.model, chunk)
            logits = np.asarray(self._compiled(chunk)["logits"], np.float32)
            for row in logits:
                scores = sigmoid(row) if self.sigmoid else softmax(row)
                labels = id2label(self.repo.config, len(scores))
                order = np.argsort(-scores, kind="stable")[: top_k or self.top_k]
                results.append([{"label": labels[i], "score": float(scores[i])} for i in order])
        return results[0] if single else results
