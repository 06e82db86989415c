"""The image-feature-extraction task (ViT, DINOv2, CLIP's vision tower): images in, the model's
first output (or its pooler_output with `pool=True`) out per image, as transformers' pipeline
returns it: nested lists with a leading batch dim of 1, or arrays with `return_tensors=True`.

Optimum's model.onnx, or transformers.js's onnx/vision_model.onnx where a repo has the towers
(CLIP: image_embeds first). The processor is images.py's (one size per repo), so only the
batch dim varies: bucketed to powers of two up to `batch_size`."""

from __future__ import annotations

from typing import Any

import numpy as np

from transmuter.errors import InputError
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.image_tasks import PixelModel, image_list
from transmuter.pipelines.vision.processors import preprocess

POOLED = "pooler_output"


class ImageFeatureExtraction:
    """Features of images (numpy arrays, Pillow images or paths; one or a list): per image the
    model's first output as nested lists [1, ...] (`pool=True`: its pooler_output;
    `return_tensors=True`: float32 arrays instead of lists)."""

    def __init__(
        self, repo: Repo, *, pool: bool = False, return_tensors: bool = False, batch_size: int = 8
    ):
        role = (
            "model" if "model" in repo.onnx or "vision_model" not in repo.onnx else "vision_model"
        )
        self.model = PixelModel(repo, role, "image-feature-extraction", batch_size)
        self.images = repo.preprocessor_config
        self.pool, self.return_tensors = pool, return_tensors

    def __call__(
        self, inputs: Any, *, pool: bool | None = None, return_tensors: bool | None = None
    ) -> Any:
        pool = self.pool if pool is None else pool
        return_tensors = self.return_tensors if return_tensors is None else return_tensors
        outputs = self.model.model.outputs
        if pool and POOLED not in outputs:
            raise InputError(
                f"pool=True takes the model's {POOLED}, and it has none (its outputs are "
                f"{outputs}); use pool=False"
            )
        images, single = image_list(inputs)
        name = POOLED if pool else outputs[0]
        rows = self.model.run([preprocess(image, self.images) for image in images])
        features = [row[name][None].astype(np.float32) for row in rows]
        if not return_tensors:
            features = [f.tolist() for f in features]
        return features[0] if single else features
