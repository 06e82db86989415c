"""Transmuter: run ONNX models as JAX programs.

`load` reads a model; `run` evaluates it (eagerly, or inside jax.jit / grad / vmap); `compile`
makes a callable that keeps one compiled program per input shape.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from transmuter import errors, telemetry
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
    "telemetry",
]


def load(source: Any, *, trainable: bool = False, compute_type: str | None = None) -> Model:
    """Load an ONNX model from a path, bytes or `onnx.ModelProto`.

    trainable=True makes every float initializer a param (see `Model.params`).
    """
    if compute_type is not None:
        raise TransmuterError(f"compute_type={compute_type!r} is not supported yet; pass None")
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else ""
    with telemetry.span("transmuter.load", {"source": name}) as span:
        model = Model(load_model(source), trainable=trainable, source=name)
        span.stop_metadata.update(
            node_count=len(model.ir.graph.nodes), opset=model.ir.opsets.get("", 0)
        )
    return model


def compile(
    model: Model,
    example_inputs: Mapping[str, Any],
    *,
    static_inputs: Mapping[str, Any] | None = None,
    cache_size: int = 8,
    cache_dir: str | os.PathLike | None = None,
    eager_threshold: int = 20,
) -> CompiledModel:
    """Compile `model` for the shapes of `example_inputs` (running it once on them).

    Other shapes compile on first use; each segment keeps its `cache_size` most recently used
    programs. Where a value decides a shape or a branch, the graph breaks: the part before is
    compiled and run, the break node runs on the host, and compiling goes on after it; segments
    shorter than `eager_threshold` nodes around a break run op by op. `static_inputs` are inputs
    known at compile time (no break where they decide a shape or branch); a call may omit them
    or pass a new value, which compiles again. `cache_dir` persists compiled programs on disk
    (JAX's persistent compilation cache, a process-wide setting).
    """
    return CompiledModel(
        model,
        example_inputs,
        static_inputs=static_inputs,
        cache_size=cache_size,
        cache_dir=cache_dir,
        eager_threshold=eager_threshold,
    )
