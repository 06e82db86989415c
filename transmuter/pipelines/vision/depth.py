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
recently used."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transmuter.errors import ModelLoadError
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.image_tasks import PixelModel, image_list, resize_maps
from transmuter.pipelines.vision.processors import load_image, preprocess

PROCESSORS = ("DPTImageProcessor",)


class DepthEstimation:
    """Estimate depth for images (numpy arrays, Pillow images or paths; one or a list): a
    {"predicted_depth": float32 [height, width] at the image's size, "depth": Pillow "L" image}
    per image."""

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
        if "predicted_depth" not in self.model.model.outputs:
            raise ModelLoadError(f"{repo.source}: the model has no output 'predicted_depth'")

    def __call__(self, inputs: Any) -> Any:
        images, single = image_list(inputs)
        images = [load_image(image) for image in images]
        pixels = [preprocess(image, dpt_config(self.images, image.size)) for image in images]
        # Images of one resized shape batch together, the order kept.
        shapes: dict[tuple[int, ...], list[int]] = {}
        for index, value in enumerate(pixels):
            shapes.setdefault(value.shape, []).append(index)
        depths: list[np.ndarray] = [np.empty(0)] * len(images)
        for indices in shapes.values():
            rows = self.model.run([pixels[i] for i in indices])
            for index, row in zip(indices, rows):
                depths[index] = row["predicted_depth"]
        results = [_result(d, image) for d, image in zip(depths, images)]
        return results[0] if single else results


def dpt_config(config: Mapping[str, Any], image_size: tuple[int, int]) -> dict[str, Any]:
    """`config` with `size` the height and width DPTImageProcessor resizes an image of
    `image_size` (width, height) to."""
    size = config.get("size") or {"height": 384, "width": 384}
    if isinstance(size, int):
        size = {"height": size, "width": size}
    if "height" not in size or "width" not in size:
        raise ModelLoadError(f"DPTImageProcessor's size is a height and width; got {size}")
    width, height = image_size
    scale_height, scale_width = size["height"] / height, size["width"] / width
    if config.get("keep_aspect_ratio", False):
        # Scale as little as possible: the scale nearer 1 sets both sides.
        if abs(1 - scale_width) < abs(1 - scale_height):
            scale_height = scale_width
        else:
            scale_width = scale_height
    multiple = int(config.get("ensure_multiple_of", 1))
    resized = {
        "height": _multiple_of(scale_height * height, multiple),
        "width": _multiple_of(scale_width * width, multiple),
    }
    return {**config, "size": resized}


def _multiple_of(value: float, multiple: int) -> int:
    """The multiple of `multiple` nearest `value`, halves to even as Python's round (DPT's
    constrain_to_multiple_of, which sets no bounds here)."""
    return int(round(value / multiple) * multiple)


def _result(depth: np.ndarray, image: Any) -> dict[str, Any]:
    from PIL import Image

    predicted = resize_maps(depth[None], (image.height, image.width), "bicubic")[0]
    # As the pipeline scales it: min..max to 0..1 in float32, times 255, truncated.
    low, high = predicted.min(), predicted.max()
    scaled = (predicted - low) / (high - low)
    return {
        "predicted_depth": predicted,
        "depth": Image.fromarray((scaled * 255).astype(np.uint8)),
    }
