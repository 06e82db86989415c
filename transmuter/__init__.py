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
from transmuter.ir.compute_type import COMPUTE_TYPES, with_compute_type
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

    trainable=True makes every float initializer a param (see `Model.params`). compute_type
    ("float32", "bfloat16" or "float16") runs the graph's float16, bfloat16 and float32 tensors
    in that type; inputs and outputs keep the types the file declares.
    """
    if compute_type is not None and compute_type not in COMPUTE_TYPES:
        raise TransmuterError(
            f"compute_type must be None or one of {', '.join(COMPUTE_TYPES)}; got {compute_type!r}"
        )
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else ""
    with telemetry.span("transmuter.load", {"source": name}) as span:
        graph = load_model(source)
        if compute_type is not None:
            graph = with_compute_type(graph, compute_type)
        model = Model(graph, trainable=trainable, source=name)
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
