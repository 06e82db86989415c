"""What the vision tasks share: a list of images from one or many, a model fed pixel_values in
batches (the batch dim bucketed to powers of two), and torch's `interpolate` (bilinear and
bicubic, align_corners=False) as the matrices the post-processors resize maps with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.repo import Repo


def image_list(inputs: Any) -> tuple[list[Any], bool]:
    """The images (arrays, Pillow images or paths), and whether one (not a list) was given."""
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise InputError("give an image or a non-empty list of them")
        return list(inputs), False
    return [inputs], True


class PixelModel:
    """A model taking pixel_values only, compiled with its batch dim bucketed to powers of two
    up to `batch_size` (other dims as each call gives them)."""

    def __init__(self, repo: Repo, role: str, task: str, batch_size: int, programs: int = 8):
        if batch_size < 1:
            raise InputError(f"batch_size must be at least 1; got {batch_size}")
        self.model = repo.model(role)
        if list(self.model.inputs) != ["pixel_values"]:
            raise ModelLoadError(
                f"{repo.source}: {task} feeds pixel_values only; the model takes "
                f"{self.model.inputs}"
            )
        self.batch_size, self.programs = batch_size, programs
        self._compiled = None

    def run(self, pixels: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Each image's outputs (without the batch dim), from images of one shape, run in
        batches of at most `batch_size`."""
        rows = []
        for start in range(0, len(pixels), self.batch_size):
            chunk = {"pixel_values": np.stack(pixels[start : start + self.batch_size])}
            outputs = self._call(chunk)
            values = {name: np.asarray(value) for name, value in outputs.items()}
            rows += [
                {n: v[i] for n, v in values.items()} for i in range(len(chunk["pixel_values"]))
            ]
        return rows

    def _call(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        if self._compiled is None:
            batch = (dim_names(self.model, "pixel_values") or [None])[0]
            self._compiled = transmuter.compile(
                self.model,
                inputs,
                buckets={batch: ("pow2", self.batch_size)} if batch else None,
                cache_size=self.programs * ((self.batch_size - 1).bit_length() + 1),
            )
        return self._compiled(inputs)


def dim_names(model: transmuter.Model, name: str) -> list[str | None]:
    """The name of each of `name`'s dims; None where the file fixes its size."""
    shape = getattr(model.input_specs[name], "shape", None) or ()
    return [None if isinstance(d, int) else str(d) for d in shape]


def resize_maps(maps: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    """[channels, height, width] float maps resized to `size` (height, width) as torch's
    `interpolate(mode=mode, align_corners=False)` does ("bilinear" or "bicubic"): one matrix per
    axis, so a resize is two matrix products."""
    rows = _interpolation(maps.shape[-2], size[0], mode)
    cols = _interpolation(maps.shape[-1], size[1], mode)
    resized = np.einsum("oh,chw,pw->cop", rows, maps.astype(np.float64), cols, optimize=True)
    return resized.astype(np.float32)


def _interpolation(given: int, wanted: int, mode: str) -> np.ndarray:
    """The [wanted, given] matrix of torch's 1-D interpolation weights."""
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
