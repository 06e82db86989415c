"""The depth-estimation task for DPT and Depth Anything: images in, {"predicted_depth",
"depth"} out per image, as transformers' pipeline returns them: the model's depth resized
bicubically to the image's size (DPTImageProcessor's post_process_depth_estimation), and that
depth scaled to 0..255 as an 8-bit Pillow image.

DPTImageProcessor's resize: to `size`, or with `keep_aspect_ratio` scaled as little as possible
(the side whose scale is nearer 1 sets both), each side rounded to a multiple of
`ensure_multiple_of`. Images of one resized shape run as one batch (bucketed to powers of two
up to `batch_size`); the height and width are not bucketed: these models have no mask to hide
padding, and padding shows (the patch grid sets the interpolated position embeddings, every
patch attends to every other, the convolutions see the border), so each resized shape is its
own program. With keep_aspect_ratio one side is `size`'s and the other follows the aspect ratio
in steps of `ensure_multiple_of`, which bounds the shapes: Depth Anything's 518 and 14 give at
most a few dozen for ordinary aspect ratios, and `programs` (default 16) keeps the most
recently used.
The depth image needs Pillow: `transmuter[image]`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transmuter.errors import ModelLoadError
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.image_tasks import ImageTask, PixelModel
from transmuter.pipelines.vision.processors import dpt_config, load_image, preprocess, resize_maps

PROCESSORS = ("DPTImageProcessor",)


class DepthEstimation(ImageTask):
    """Estimate depth for images (paths, Pillow images or numpy arrays; one, a list or a
    generator): a {"predicted_depth": float32 [height, width] at the image's size, "depth":
    Pillow "L" image} per image."""

    def __init__(self, repo: Repo, *, batch_size: int = 8, programs: int = 16):
        self.images = repo.preprocessor_config
        processor = self.images.get("image_processor_type")
        if processor not in PROCESSORS:
            raise ModelLoadError(
                f"{repo.source}: depth-estimation supports {', '.join(PROCESSORS)} "
                f"(preprocessor_config.json); this repo has {processor!r}"
            )
        if self.images.get("do_pad"):
            raise ModelLoadError(
                f"{repo.source}: preprocessor_config.json sets do_pad (padding to a multiple of "
                "size_divisor), which Transmuter does not do"
            )
        self.model = PixelModel(repo, "model", "depth-estimation", batch_size, programs)
        self.batch_size = self.model.batch_size
        if "predicted_depth" not in self.model.model.outputs:
            raise ModelLoadError(f"{repo.source}: the model has no output 'predicted_depth'")

    def run_items(self, items: list) -> list:
        images = [load_image(image) for image in items]
        pixels = [preprocess(image, dpt_config(self.images, image.size)) for image in images]
        rows = self.model.run_by_shape(pixels)  # images of one resized shape batch together
        return [_result(row["predicted_depth"], image) for row, image in zip(rows, images)]


def _result(depth: np.ndarray, image: Any) -> dict[str, Any]:
    from PIL import Image

    predicted = resize_maps(depth[None], (image.height, image.width), "bicubic")[0]
    # As the pipeline scales it: min..max to 0..1 in float32, times 255, truncated (a flat
    # depth, max == min, is 0 everywhere rather than transformers' NaN cast).
    low, high = predicted.min(), predicted.max()
    span = high - low
    scaled = (predicted - low) / span if span > 0 else np.zeros_like(predicted)
    return {
        "predicted_depth": predicted,
        "depth": Image.fromarray((scaled * 255).astype(np.uint8)),
    }
