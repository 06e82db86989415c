"""Transmuter: run ONNX models as JAX programs.

    model = transmuter.load("model.onnx")
    outputs = transmuter.run(model, {"input_ids": ids})         # eager, or inside jax.jit/grad/vmap
    fn = transmuter.compile(model, {"input_ids": ids})          # one XLA program per shape
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from transmuter import errors
from transmuter.errors import (
    HostValueNeeded,
    InputError,
    ModelLoadError,
    NodeError,
    ShapeError,
    TransmuterError,
    UnsupportedOpError,
)
from transmuter.frontend import load_model
from transmuter.runtime import CompiledModel, Model, run

__all__ = [
    "CompiledModel",
    "HostValueNeeded",
    "InputError",
    "Model",
    "ModelLoadError",
    "NodeError",
    "ShapeError",
    "TransmuterError",
    "UnsupportedOpError",
    "compile",
    "errors",
    "load",
    "run",
]


def load(source: Any, *, trainable: bool = False, compute_type: str | None = None) -> Model:
    """Load an ONNX model from a path, bytes or `onnx.ModelProto`.

    trainable=True makes every float initializer a param (see `Model.params`).
    """
    if compute_type is not None:
        raise TransmuterError(f"compute_type={compute_type!r} is not supported yet; pass None")
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else ""
    return Model(load_model(source), trainable=trainable, source=name)


def compile(
    model: Model,
    example_inputs: Mapping[str, Any],
    *,
    static_inputs: Mapping[str, Any] | None = None,
    cache_size: int = 8,
) -> CompiledModel:
    """Compile `model` for the shapes of `example_inputs`; other shapes compile on first use and
    the `cache_size` most recently used programs are kept."""
    if static_inputs:
        raise TransmuterError("static_inputs are not supported yet")
    return CompiledModel(model, example_inputs, cache_size=cache_size)
