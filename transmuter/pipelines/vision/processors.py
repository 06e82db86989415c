"""Image processing as transformers' image processors (the Pillow ones) apply
preprocessor_config.json, and each model family's rules, written once here:

- every image task's way in: `is_image` (what one image is: a path, a Pillow image, a numpy
  array) and `load_image` (an RGB Pillow image from any of them, or an InputError naming what
  is wrong);
- `preprocess`: convert to RGB, resize with Pillow (`size` as height and width, its shortest
  edge, or a shortest edge capped by a longest edge), center crop (`crop_size`), rescale,
  normalize, channels first;
- the families' own rules: the DETR family's sizes (DETR, YOLOS, RT-DETR, Mask2Former,
  Grounding DINO: `detr_family_pixels`), OWL-ViT's and OWLv2's processors (`owl_pixels`: OWLv2
  pads to a square and resizes with scikit-image's anti-aliasing, here in numpy), DPT's
  keep-aspect-ratio sizes (`dpt_config`), SAM's longest-edge resize and padding
  (`sam_resized_size`, `sam_pixels`), and which families' pooled output is a function of
  their last hidden state (`POOLING`, `pooled`);
- torch's `interpolate` (bilinear and bicubic, align_corners=False) as the matrices the
  post-processors resize maps with (`interpolation`, `resize_maps`).
Images are read and resized with Pillow: `transmuter[image]`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from transmuter.errors import InputError, ModelLoadError

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


# --- images in ---------------------------------------------------------------------------


def is_image(value: Any) -> bool:
    """Whether `value` is one image as the vision tasks take it: a path (a string or a
    path-like), a Pillow image or a numpy array."""
    if isinstance(value, (str, os.PathLike, np.ndarray)):
        return True
    return type(value).__module__.startswith("PIL.") and hasattr(value, "convert")


def load_image(image: Any) -> Any:
    """An RGB Pillow image from a numpy array (height, width, channels of 1, 3 or 4; uint8, or
    floats in [0, 1] as transformers takes them), a Pillow image (any mode, converted to RGB as
    the processors' do_convert_rgb does), or a path to an image file."""
    try:
        from PIL import Image
    except ImportError:
        raise ModuleNotFoundError(
            "the image tasks read images with Pillow, which is not installed: "
            "pip install 'transmuter[image]'"
        ) from None

    if isinstance(image, str) and not os.path.exists(image):
        image = _from_string(image)
    elif isinstance(image, (str, os.PathLike)):
        try:
            image = Image.open(image)
            image.load()
        except (OSError, ValueError) as error:
            raise InputError(f"cannot read an image from {os.fspath(image)!r}: {error}") from None
    elif isinstance(image, np.ndarray):
        image = _from_array(image)
    elif not isinstance(image, Image.Image):
        raise InputError(
            "an image is a path, a Pillow image or a numpy array (height, width, channels); "
            f"got {type(image).__name__}"
        )
    if image.width < 1 or image.height < 1:
        raise InputError(f"the image has no pixels ({image.width} x {image.height})")
    return image if image.mode == "RGB" else image.convert("RGB")


def _from_string(text: str) -> Any:
    """A string that names no file: a base64 image or a data URL, as transformers' load_image
    takes them (an http URL is not fetched: Transmuter reads no network here)."""
    import base64
    import binascii
    import io

    from PIL import Image

    shown = text if len(text) < 80 else text[:77] + "..."
    if text.startswith(("http://", "https://")):
        raise InputError(f"{shown!r}: download the image first; URLs are not fetched")
    if text.startswith("data:image/"):
        text = text.partition(",")[2]
    try:
        image = Image.open(io.BytesIO(base64.b64decode(text, validate=True)))
        image.load()
    except (binascii.Error, OSError, ValueError):
        raise InputError(
            f"cannot read an image from {shown!r}: no such file, and not a base64 image"
        ) from None
    return image


def _from_array(array: np.ndarray) -> Any:
    from PIL import Image

    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise InputError(
            "an image array is (height, width, channels) with 1, 3 or 4 channels; got shape "
            f"{list(array.shape)} (give a 2-D grayscale array as array[..., None])"
        )
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.number):
        raise InputError(f"an image array holds numbers; got dtype {array.dtype}")
    if array.dtype != np.uint8:
        array = np.clip(np.round(array.astype(np.float64) * 255), 0, 255).astype(np.uint8)
    return Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)


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
    return _rescale_normalize(pixels, config)


def _rescale_normalize(pixels: np.ndarray, config: Mapping[str, Any]) -> np.ndarray:
    """[height, width, channels] -> float32 [channels, height, width], rescaled and
    normalized as `config` says."""
    pixels = pixels.astype(np.float32)
    if config.get("do_rescale", True):
        scale = config.get("rescale_factor", 1 / 255)
        pixels = (pixels.astype(np.float64) * scale).astype(np.float32)
    if config.get("do_normalize", True):
        mean = np.asarray(config.get("image_mean", 0.5), np.float32)
        std = np.asarray(config.get("image_std", 0.5), np.float32)
        pixels = (pixels - mean) / std
    return np.ascontiguousarray(pixels.transpose(2, 0, 1), np.float32)


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


# --- the DETR family: DETR, YOLOS, RT-DETR, Mask2Former, Grounding DINO -------------------

# The processors' defaults, for keys a preprocessor_config.json omits.
DETR_DEFAULTS = {
    "image_mean": IMAGENET_MEAN,
    "image_std": IMAGENET_STD,
    "resample": 2,
    "size": {"shortest_edge": 800, "longest_edge": 1333},
}
DETR_FAMILY_DEFAULTS = {
    "detr": DETR_DEFAULTS,
    "yolos": DETR_DEFAULTS,
    "rt_detr": {"do_normalize": False, "size": {"height": 640, "width": 640}, "resample": 2},
    "mask2former": {**DETR_DEFAULTS, "size_divisor": 32},
    "grounding-dino": DETR_DEFAULTS,
}


def detr_family_pixels(image: Any, processor: str, config: Mapping[str, Any]) -> np.ndarray:
    """The family's processor (DETR_FAMILY_DEFAULTS' keys) on one image: float32 [3, height,
    width] at the size the family resizes it to.
    - DETR, Grounding DINO: the shortest edge to `shortest_edge` unless that takes the longest
      past `longest_edge` (`resized_size`);
    - YOLOS: the same, except that a portrait image always scales, each side then floored to a
      multiple of 16;
    - RT-DETR: {"height", "width"};
    - Mask2Former: DETR's, each side then rounded up to a multiple of `size_divisor`."""
    image = load_image(image)
    config = dict(config)
    if config.get("do_resize", True):
        wanted = config["size"]
        if processor != "rt_detr":
            wanted = detr_size(wanted, config.get("max_size", 1333))
        resize = yolos_resized if processor == "yolos" else resized_size
        width, height = resize(image.size, wanted)
        if processor == "mask2former":
            # Mask2FormerImageProcessor resizes to sides rounded up to a multiple (older
            # configs call it size_divisibility).
            divisor = int(config.get("size_divisibility", config["size_divisor"]) or 0)
            if divisor:
                width, height = (-(-n // divisor) * divisor for n in (width, height))
        config["size"] = {"height": height, "width": width}
    return preprocess(image, config)


def detr_size(size: Any, max_size: int) -> dict[str, int]:
    """DETR's and YOLOS's `size` as their processors read it: an int (older configs, as
    facebook/detr-resnet-50's `"size": 800, "max_size": 1333`) is the shortest edge, capped by
    `max_size`; a dict gives shortest and longest edges, or a height and width."""
    if isinstance(size, int):
        return {"shortest_edge": size, "longest_edge": int(max_size)}
    if {"shortest_edge", "longest_edge"} <= set(size) or {"height", "width"} <= set(size):
        return size
    raise ModelLoadError(
        f"preprocessor_config.json: a DETR or YOLOS size of {dict(size)} is not supported (give "
        "shortest_edge and longest_edge, or height and width)"
    )


def yolos_resized(size: tuple[int, int], wanted: Mapping[str, Any]) -> tuple[int, int]:
    """(width, height) after YOLOS's resize: DETR's shortest / longest edge rule, except that
    a portrait image always scales (the check for an unchanged size comes second), and each
    side floored to a multiple of 16."""
    if not ("shortest_edge" in wanted and "longest_edge" in wanted):
        return resized_size(size, wanted)
    width, height = size
    shortest, longest = int(wanted["shortest_edge"]), int(wanted["longest_edge"])
    short, long = float(min(width, height)), float(max(width, height))
    exact = None
    if long / short * shortest > longest:
        exact = longest * short / long
        shortest = int(round(exact))
    scale = exact if exact is not None else shortest
    if width < height:
        new_width, new_height = shortest, int(scale * height / width)
    elif min(width, height) == shortest:
        new_width, new_height = width, height
    else:
        new_width, new_height = int(scale * width / height), shortest
    if new_width < 16 or new_height < 16:
        raise InputError(
            f"an image of {width} x {height} pixels (width x height) resizes to {new_width} x "
            f"{new_height}, under YOLOS's 16 pixels a side: its aspect ratio is too extreme"
        )
    return new_width - new_width % 16, new_height - new_height % 16


def padded_size(
    config: Mapping[str, Any], multiple: int | None, height: int, width: int
) -> tuple[int, int]:
    """The input size an image resized to (height, width) runs at: the processor's `pad_size`
    where its config sets one (transformers pads every image to it), else rounded up to
    `multiple` (pad_to_multiple_of), else its own."""
    pad_size = config.get("pad_size")
    if pad_size and config.get("do_pad", True):
        if pad_size["height"] < height or pad_size["width"] < width:
            raise InputError(
                f"an image resized to {height} x {width} is larger than the processor's "
                f"pad_size {pad_size['height']} x {pad_size['width']}"
            )
        return pad_size["height"], pad_size["width"]
    if multiple:
        return -(-height // multiple) * multiple, -(-width // multiple) * multiple
    return height, width


# --- OWL-ViT and OWLv2 ---------------------------------------------------------------------

OWL_DEFAULTS = {
    "owlvit": {
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "resample": 3,
        "size": {"height": 768, "width": 768},
    },
    "owlv2": {
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "size": {"height": 960, "width": 960},
    },
}


def owl_pixels(image: Any, family: str, config: Mapping[str, Any]) -> np.ndarray:
    """OWL-ViT's or OWLv2's processor on one image: float32 [3, height, width]. OWL-ViT
    resizes to {"height", "width"} with Pillow. OWLv2 (Owlv2ImageProcessor) rescales, pads to
    a square at the bottom and right with zeros, resizes with scikit-image's anti-aliasing
    (a Gaussian of sigma (factor - 1) / 2, then a linear zoom, both mirrored at the edges, as
    transformers does with scipy.ndimage), clips to the padded image's range, normalizes. Its
    boxes are relative to the padded square (`owl_box_frame`)."""
    image = load_image(image)
    if family == "owlvit":
        return preprocess(image, config)
    pixels = np.asarray(image).astype(np.float32)
    if config.get("do_rescale", True):
        scale = config.get("rescale_factor", 1 / 255)
        pixels = (np.asarray(image).astype(np.float64) * scale).astype(np.float32)
    if config.get("do_pad", True):
        side = max(pixels.shape[:2])
        pixels = np.pad(pixels, ((0, side - pixels.shape[0]), (0, side - pixels.shape[1]), (0, 0)))
    if config.get("do_resize", True):
        size = config["size"]
        if isinstance(size, int):
            size = {"height": size, "width": size}
        wanted = (int(size["height"]), int(size["width"]))
        resized = pixels
        for axis, out in enumerate(wanted):
            factor = pixels.shape[axis] / out
            resized = _gaussian_filter(resized, axis, max(0.0, (factor - 1) / 2))
        for axis, out in enumerate(wanted):
            resized = _zoom_linear(resized, axis, out)
        pixels = np.clip(resized.astype(np.float32), pixels.min(), pixels.max())
    if config.get("do_normalize", True):
        mean = np.asarray(config["image_mean"], np.float32)
        std = np.asarray(config["image_std"], np.float32)
        pixels = (pixels - mean) / std
    return np.ascontiguousarray(pixels.transpose(2, 0, 1), np.float32)


def owl_box_frame(family: str, size: tuple[int, int]) -> tuple[int, int]:
    """The (width, height) OWL's relative boxes scale to for an image of `size`: the image's
    own for OWL-ViT, the padded square's (the longer side) for OWLv2."""
    if family == "owlv2":
        return max(size), max(size)
    return size


def _gaussian_filter(pixels: np.ndarray, axis: int, sigma: float) -> np.ndarray:
    """scipy.ndimage.gaussian_filter along one axis (mode "mirror", truncate 4), the result in
    the input's float32 as scipy stores each axis's pass."""
    if sigma <= 1e-15:
        return pixels
    radius = int(4.0 * sigma + 0.5)
    taps = np.exp(-0.5 / (sigma * sigma) * np.arange(-radius, radius + 1) ** 2)
    taps /= taps.sum()
    moved = np.moveaxis(pixels.astype(np.float64), axis, 0)
    n = moved.shape[0]
    padded = _mirror_pad(moved, radius)
    out = np.zeros_like(moved)
    for k, weight in enumerate(taps):
        out += weight * padded[k : k + n]
    return np.moveaxis(out, 0, axis).astype(np.float32)


def _mirror_pad(values: np.ndarray, radius: int) -> np.ndarray:
    """`values` extended by `radius` along the first axis as scipy's "mirror" mode extends it
    (reflected about the edge samples, repeatedly where `radius` is longer than the axis)."""
    if values.shape[0] == 1:
        return np.repeat(values, 2 * radius + 1, axis=0)
    return np.pad(values, [(radius, radius)] + [(0, 0)] * (values.ndim - 1), mode="reflect")


def _zoom_linear(pixels: np.ndarray, axis: int, out: int) -> np.ndarray:
    """scipy.ndimage.zoom(order=1, mode="mirror", grid_mode=True) along one axis: each output
    pixel's center mapped to the input's pixel grid, linearly interpolated, the neighbors
    past an edge mirrored back inside."""
    n = pixels.shape[axis]
    source = (np.arange(out) + 0.5) * (n / out) - 0.5
    low = np.floor(source).astype(np.int64)
    weight = source - low
    low_index, high_index = _mirror_index(low, n), _mirror_index(low + 1, n)
    moved = np.moveaxis(pixels.astype(np.float64), axis, 0)
    shape = (-1,) + (1,) * (moved.ndim - 1)
    zoomed = moved[low_index] * (1 - weight).reshape(shape) + moved[high_index] * weight.reshape(
        shape
    )
    return np.moveaxis(zoomed, 0, axis)


def _mirror_index(index: np.ndarray, n: int) -> np.ndarray:
    if n == 1:
        return np.zeros_like(index)
    period = 2 * (n - 1)
    index = np.abs(index) % period
    return np.where(index >= n, period - index, index)


# --- DPT (depth-estimation) ------------------------------------------------------------------


def dpt_config(config: Mapping[str, Any], image_size: tuple[int, int]) -> dict[str, Any]:
    """`config` with `size` the height and width DPTImageProcessor resizes an image of
    `image_size` (width, height) to: `size`, or with `keep_aspect_ratio` scaled as little as
    possible (the side whose scale is nearer 1 sets both), each side rounded to a multiple of
    `ensure_multiple_of`."""
    size = config.get("size") or {"height": 384, "width": 384}
    if isinstance(size, int):
        size = {"height": size, "width": size}
    if "height" not in size or "width" not in size:
        raise ModelLoadError(f"DPTImageProcessor's size is a height and width; got {size}")
    width, height = image_size
    scale_height, scale_width = size["height"] / height, size["width"] / width
    if config.get("keep_aspect_ratio", False):
        if abs(1 - scale_width) < abs(1 - scale_height):
            scale_height = scale_width
        else:
            scale_width = scale_height
    multiple = int(config.get("ensure_multiple_of", 1))
    resized = {
        "height": _multiple_of(scale_height * height, multiple),
        "width": _multiple_of(scale_width * width, multiple),
    }
    if min(resized.values()) < 1:
        raise InputError(
            f"an image of {width} x {height} pixels (width x height) resizes to "
            f"{resized['width']} x {resized['height']}: its aspect ratio is too extreme for "
            "this model"
        )
    return {**config, "size": resized}


def _multiple_of(value: float, multiple: int) -> int:
    """The multiple of `multiple` nearest `value`, halves to even as Python's round (DPT's
    constrain_to_multiple_of, which sets no bounds here)."""
    return int(round(value / multiple) * multiple)


# --- SAM (mask-generation) -----------------------------------------------------------------


def sam_resized_size(size: tuple[int, int], longest: int) -> tuple[int, int]:
    """(height, width) with the longer side `longest`, rounded as SamImageProcessor does."""
    scale = longest / max(size)
    return int(size[0] * scale + 0.5), int(size[1] * scale + 0.5)


def sam_pixels(image: Any, resized: tuple[int, int], processor: Mapping[str, Any]) -> np.ndarray:
    """SamImageProcessor on one image: float32 [3, pad height, pad width], resized to
    `resized` (height, width), rescaled, normalized, zero-padded at the bottom and right."""
    config = {**processor, "size": {"height": resized[0], "width": resized[1]}}
    if not processor["do_resize"]:
        config["size"] = None
    pixels = preprocess(image, config)
    height, width = processor["pad_size"]
    if pixels.shape[1] > height or pixels.shape[2] > width:
        raise InputError(
            f"an image of {pixels.shape[1:]} does not fit the padded size {(height, width)}"
        )
    padding = ((0, 0), (0, height - pixels.shape[1]), (0, width - pixels.shape[2]))
    return np.pad(pixels, padding)


# --- pooled features ---------------------------------------------------------------------

# model_type -> how the model's pooler_output follows from its last_hidden_state, where it
# does (the families whose exports may leave pooler_output out): "cls", the first token
# (Dinov2Model's pooler output is the layer-normed CLS token, and last_hidden_state is already
# layer-normed); "mean", the mean over the tokens (SwinModel's average pool of its layer-normed
# last_hidden_state). Others pool with weights of their own (ViT's dense + tanh, CLIP's
# post-layernorm, BEiT's and ConvNeXt's own layer norms), which the export alone holds.
POOLING = {
    "dinov2": "cls",
    "dinov2_with_registers": "cls",
    "swin": "mean",
    "swinv2": "mean",
}


def pooled(hidden: np.ndarray, model_type: str | None) -> np.ndarray | None:
    """The pooled output of a [batch, tokens, hidden] last_hidden_state for the family, or
    None where it cannot be derived from it."""
    rule = POOLING.get(str(model_type))
    if rule == "cls":
        return hidden[:, 0]
    if rule == "mean":
        return hidden.mean(1, dtype=np.float32)
    return None


# --- maps out ----------------------------------------------------------------------------


def resize_maps(maps: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    """[channels, height, width] float maps resized to `size` (height, width) as torch's
    `interpolate(mode=mode, align_corners=False)` does ("bilinear" or "bicubic"): one matrix per
    axis, so a resize is two matrix products."""
    rows = interpolation(maps.shape[-2], size[0], mode)
    cols = interpolation(maps.shape[-1], size[1], mode)
    resized = np.einsum("oh,chw,pw->cop", rows, maps.astype(np.float64), cols, optimize=True)
    return resized.astype(np.float32)


def interpolation(given: int, wanted: int, mode: str) -> np.ndarray:
    """The [wanted, given] matrix of torch's 1-D interpolation weights (align_corners=False,
    no antialiasing)."""
    scale = given / wanted
    source = (np.arange(wanted) + 0.5) * scale - 0.5
    matrix = np.zeros((wanted, given))
    rows = np.arange(wanted)
    if mode == "bilinear":
        # torch clamps the source position at 0 (not for cubic) and repeats the last pixel.
        source = np.maximum(source, 0)
        low = np.floor(source).astype(int)
        frac = source - low
        high = np.minimum(low + 1, given - 1)
        np.add.at(matrix, (rows, low), 1 - frac)
        np.add.at(matrix, (rows, high), frac)
        return matrix
    if mode != "bicubic":
        raise ValueError(f"interpolation mode {mode!r}")
    low = np.floor(source).astype(int)
    frac = source - low
    # Keys' cubic convolution with a = -0.75, torch's choice; taps outside repeat the edge.
    for offset, weight in zip(range(-1, 3), _cubic_weights(frac)):
        np.add.at(matrix, (rows, np.clip(low + offset, 0, given - 1)), weight)
    return matrix


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]
