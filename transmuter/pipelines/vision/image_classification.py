"""The image-classification task: images in, [{"label", "score"}] out per image, as
transformers' pipeline returns them, with processors.py's preprocessing. Every image is resized
to the processor's one size, so only the batch dim varies: bucketed to powers of two up to
`batch_size`."""

from __future__ import annotations

from typing import Any

import numpy as np

from transmuter.pipelines.base import SCORES, choice, id2label, ranked
from transmuter.pipelines.base import top_k as top_k_option
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.image_tasks import ImageTask, PixelModel
from transmuter.pipelines.vision.processors import preprocess


class ImageClassification(ImageTask):
    """Classify images (paths, Pillow images or numpy arrays of height, width, channels: uint8,
    or floats in [0, 1]): per image the `top_k` (default 5) best labels of config.json's
    id2label, best first. `function_to_apply` ("softmax", "sigmoid" or "none") defaults as
    transformers chooses it: a sigmoid for multi-label configs or a single label, else a
    softmax. Both also per call."""

    def __init__(
        self,
        repo: Repo,
        *,
        top_k: int | None = 5,
        function_to_apply: str | None = None,
        batch_size: int = 8,
    ):
        self.repo = repo
        self.model = PixelModel(repo, "model", "image-classification", batch_size)
        self.batch_size = self.model.batch_size
        self.config = repo.preprocessor_config
        self.top_k = 5 if top_k is None else top_k_option(top_k)  # transformers' None: 5
        labels = repo.config.get("num_labels") or len(repo.config.get("id2label") or {})
        multi = repo.config.get("problem_type") == "multi_label_classification"
        self.function = "sigmoid" if multi or labels == 1 else "softmax"
        if function_to_apply is not None:
            self.function = choice(function_to_apply, "function_to_apply", SCORES)

    @property
    def _compiled(self) -> Any:
        return self.model._compiled

    def run_items(
        self, items: list, *, top_k: int | None = None, function_to_apply: str | None = None
    ) -> list:
        top_k = self.top_k if top_k is None else top_k_option(top_k)
        function = self.function
        if function_to_apply is not None:
            function = choice(function_to_apply, "function_to_apply", SCORES)
        rows = self.model.run([preprocess(image, self.config) for image in items])
        results = []
        for row in rows:
            scores = SCORES[function](np.asarray(row["logits"], np.float32))
            results.append(ranked(scores, id2label(self.repo.config, len(scores)), top_k))
        return results
