"""The image-feature-extraction task (ViT, DINOv2, CLIP's vision tower): images in, the model's
first output (or its pooled output with `pool=True`) out per image, as transformers' pipeline
returns it: nested lists with a leading batch dim of 1, or arrays with `return_tensors=True`.

Optimum's model.onnx, or transformers.js's onnx/vision_model.onnx where a repo has the towers
(CLIP: image_embeds first). `pool=True` reads the export's pooler_output; where the export has
none, the families whose pooled output follows from last_hidden_state (processors.py's
POOLING: DINOv2's layer-normed CLS token, Swin's mean) derive it, and others are refused. The
processor resizes every image to one size, so only the batch dim varies: bucketed to powers
of two up to `batch_size`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transmuter.errors import InputError
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.image_tasks import ImageTask, PixelModel
from transmuter.pipelines.vision.processors import POOLING, pooled, preprocess

POOLED = "pooler_output"
HIDDEN = "last_hidden_state"


class ImageFeatureExtraction(ImageTask):
    """Features of images (paths, Pillow images or numpy arrays; one, a list or a generator):
    per image the model's first output as nested lists [1, ...] (`pool=True`: its pooled
    output; `return_tensors=True`: float32 arrays instead of lists). `image_processor_kwargs`
    (a dict) overrides preprocessor_config.json's settings (do_normalize, size, ...), as
    transformers hands it to the image processor. All also per call."""

    def __init__(
        self,
        repo: Repo,
        *,
        pool: bool = False,
        return_tensors: bool = False,
        image_processor_kwargs: dict | None = None,
        batch_size: int = 8,
    ):
        role = (
            "model" if "model" in repo.onnx or "vision_model" not in repo.onnx else "vision_model"
        )
        self.model = PixelModel(repo, role, "image-feature-extraction", batch_size)
        self.batch_size = self.model.batch_size
        self.family = repo.config.get("model_type")
        self.images = processor_settings(repo.preprocessor_config, image_processor_kwargs)
        self.pool, self.return_tensors = bool(pool), bool(return_tensors)
        if self.pool:
            self._check_pool()

    def _check_pool(self) -> None:
        outputs = self.model.model.outputs
        if POOLED in outputs or (self.family in POOLING and HIDDEN in outputs):
            return
        raise InputError(
            f"pool=True takes the model's {POOLED}; this export has none (its outputs are "
            f"{outputs}), and a {self.family!r} model pools with weights of its own, so it "
            f"cannot be derived from {HIDDEN} (that is done for {', '.join(POOLING)}); use "
            "pool=False"
        )

    def run_items(
        self,
        items: list,
        *,
        pool: bool | None = None,
        return_tensors: bool | None = None,
        image_processor_kwargs: dict | None = None,
    ) -> list:
        images = processor_settings(self.images, image_processor_kwargs)
        pool = self.pool if pool is None else bool(pool)
        return_tensors = self.return_tensors if return_tensors is None else bool(return_tensors)
        if pool:
            self._check_pool()
        outputs = self.model.model.outputs
        rows = self.model.run([preprocess(image, images) for image in items])
        if not pool:
            features = [row[outputs[0]][None] for row in rows]
        elif POOLED in outputs:
            features = [row[POOLED][None] for row in rows]
        else:
            features = [pooled(row[HIDDEN][None], self.family) for row in rows]
        features = [np.asarray(f, np.float32) for f in features]
        return features if return_tensors else [f.tolist() for f in features]


def processor_settings(config: dict, overrides: Any) -> dict:
    """preprocessor_config.json's settings with `image_processor_kwargs` over them."""
    if overrides is None:
        return config
    if not isinstance(overrides, Mapping) or not all(isinstance(k, str) for k in overrides):
        raise InputError(
            "image_processor_kwargs must be a dict of image processor settings (do_normalize, "
            f"size, ...); got {overrides!r}"
        )
    return {**config, **overrides}
