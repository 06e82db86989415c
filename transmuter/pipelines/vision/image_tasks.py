"""What the vision tasks share: `ImageTask`, the calling conventions of a task whose item is an
image (base.py's `Task`: one image, a list, a generator), and `PixelModel`, a model fed
pixel_values in batches (the batch dim bucketed to powers of two)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import transmuter
from transmuter.errors import InputError, ModelLoadError
from transmuter.pipelines.base import Task, positive_int
from transmuter.pipelines.repo import Repo
from transmuter.pipelines.vision.processors import is_image


class ImageTask(Task):
    """A task whose item is one image: a path, a Pillow image or a numpy array (height, width,
    channels)."""

    def __call__(self, inputs: Any, **options: Any) -> Any:
        if "batch_size" in options:
            # transformers' pipelines take batch_size per call too. Here each image's answer
            # does not depend on its batch (a program per batch bucket, padded rows dropped),
            # and the buckets are compiled up to the pipeline's batch_size, so the call's is
            # checked and the pipeline's batches are kept.
            positive_int(options.pop("batch_size"), "batch_size")
        return super().__call__(inputs, **options)

    def is_item(self, value: Any) -> bool:
        return is_image(value)

    def describe_items(self) -> str:
        return (
            "give an image (a path, a Pillow image or a numpy array of height, width, "
            "channels), a non-empty list of them or a generator of them"
        )


def call_arguments(
    task: ImageTask,
    inputs: Any,
    args: tuple,
    options: dict[str, Any],
    second: str,
    aliases: dict[str, str],
) -> tuple[Any, dict[str, Any]]:
    """A call's inputs and options from transformers' other spellings of them: its second
    argument given positionally (`args`: at most the `second` option), and older keywords
    (`aliases`: old name -> option, "inputs" for the images themselves)."""
    options = dict(options)
    for old, new in aliases.items():
        if old not in options:
            continue
        if new == "inputs":
            if inputs is not None:
                raise InputError(f"the images given twice: positionally and as {old}=")
            inputs = options.pop(old)
        elif new in options:
            raise InputError(f"give {new} or {old}, not both")
        else:
            options[new] = options.pop(old)
    if len(args) > 1:
        raise InputError(f"give the images and {second}; got {len(args) + 1} arguments")
    if args:
        if second in options:
            raise InputError(f"{second} given twice: positionally and by name")
        options[second] = args[0]
    if inputs is None:
        raise InputError(task.describe_items())
    return inputs, options


class PixelModel:
    """A model taking pixel_values only, compiled with its batch dim bucketed to powers of two
    up to `batch_size` (other dims as each call gives them)."""

    def __init__(self, repo: Repo, role: str, task: str, batch_size: int, programs: int = 8):
        self.batch_size = positive_int(batch_size, "batch_size")
        self.model = repo.model(role)
        if list(self.model.inputs) != ["pixel_values"]:
            raise ModelLoadError(
                f"{repo.source}: {task} feeds pixel_values only; the model takes "
                f"{self.model.inputs}"
            )
        self.programs = programs
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

    def run_by_shape(self, pixels: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        """`run` for images of several shapes: those of one shape batch together, each image's
        outputs in the order given."""
        shapes: dict[tuple[int, ...], list[int]] = {}
        for index, value in enumerate(pixels):
            shapes.setdefault(value.shape, []).append(index)
        rows: list[Any] = [None] * len(pixels)
        for indices in shapes.values():
            for index, row in zip(indices, self.run([pixels[i] for i in indices])):
                rows[index] = row
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
