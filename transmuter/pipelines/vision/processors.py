"""Image processing as transformers' image processors (the Pillow ones) apply
preprocessor_config.json: convert to RGB, resize with Pillow (`size` as
height and width, its shortest edge, or a shortest edge capped by a longest edge), center crop
(`crop_size`), rescale, normalize, channels first.

`load_image` is every image task's way in: numpy arrays, Pillow images and file paths."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from transmuter.errors import InputError, ModelLoadError


def preprocess(image: Any, config: Mapping[str, Any]) -> np.ndarray:
    """float32 [channels, height, width] pixel values of one image."""
    image = load_image(image)
    if config.get("do_resize", True) and config.get("size"):
        size = resized_size(image.size, config["size"])
        if min(size) < 1:
            raise InputError(
                f"an image of {image.size[0]} x {image.size[1]} pixels (width x height) "
                f"resizes to {size[0]} x {size[1]} under the size {config['size']}: its aspect "
                "ratio is too extreme for this model"
            )
        image = image.resize(size, resample=int(config.get("resample", 2)))
    pixels = np.asarray(image)
    if config.get("do_center_crop") and config.get("crop_size"):
        pixels = _center_crop(pixels, config["crop_size"])
    pixels = pixels.astype(np.float32)
    if config.get("do_rescale", True):
        scale = config.get("rescale_factor", 1 / 255)
        pixels = (pixels.astype(np.float64) * scale).astype(np.float32)
    if config.get("do_normalize", True):
        mean = np.asarray(config.get("image_mean", 0.5), np.float32)
        std = np.asarray(config.get("image_std", 0.5), np.float32)
        pixels = (pixels - mean) / std
    return np.ascontiguousarray(pixels.transpose(2, 0, 1), np.float32)


def load_image(image: Any) -> Any:
    """An RGB Pillow image from a numpy array (height, width, channels; uint8, or floats in
    [0, 1] as transformers takes them), a Pillow image, or a path to an image file."""
    try:
        from PIL import Image
    except ImportError:
        raise ModuleNotFoundError(
            "the image tasks read images with Pillow, which is not installed: "
            "pip install 'transmuter[image]'"
        ) from None

    if isinstance(image, (str, os.PathLike)):
        try:
            image = Image.open(image)
            image.load()
        except (OSError, ValueError) as error:
            raise InputError(f"cannot read an image from {os.fspath(image)!r}: {error}") from None
    elif not isinstance(image, Image.Image):
        array = np.asarray(image)
        if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
            raise InputError(
                f"an image array is (height, width, channels); got shape {list(array.shape)}"
            )
        if array.dtype != np.uint8:
            array = np.clip(np.round(array.astype(np.float64) * 255), 0, 255).astype(np.uint8)
        image = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
    return image if image.mode == "RGB" else image.convert("RGB")


def resized_size(size: tuple[int, int], wanted: Any) -> tuple[int, int]:
    """(width, height) after resizing to `wanted`: {"height", "width"}, {"shortest_edge"} (the
    longer side scaled alike), or an int (a square)."""
    width, height = size
    if isinstance(wanted, int):
        return wanted, wanted
    if "height" in wanted and "width" in wanted:
        return int(wanted["width"]), int(wanted["height"])
    if "shortest_edge" in wanted and "longest_edge" in wanted:
        return _shortest_longest(width, height, wanted["shortest_edge"], wanted["longest_edge"])
    if "shortest_edge" in wanted:
        edge = int(wanted["shortest_edge"])
        if width <= height:
            return edge, int(edge * height / width)
        return int(edge * width / height), edge
    raise ModelLoadError(f"preprocessor_config.json: a size of {dict(wanted)} is not supported")


def _shortest_longest(width: int, height: int, shortest: int, longest: int) -> tuple[int, int]:
    """(width, height) with the shorter side `shortest`, unless that takes the longer side past
    `longest`: then the shorter side shrinks to keep it there (DETR's processors' rule; the
    longer side scales by the unrounded shorter one, as they compute it)."""
    short, long = min(width, height), max(width, height)
    exact = float(shortest)
    if long / short * shortest > longest:
        exact = longest * short / long
        shortest = int(round(exact))
    if short == shortest:
        return width, height
    if width < height:
        return shortest, int(exact * height / width)
    return int(exact * width / height), shortest


def _center_crop(pixels: np.ndarray, crop: Any) -> np.ndarray:
    height, width = (crop, crop) if isinstance(crop, int) else (crop["height"], crop["width"])
    top = max(0, (pixels.shape[0] - height) // 2)
    left = max(0, (pixels.shape[1] - width) // 2)
    return pixels[top : top + height, left : left + width]
